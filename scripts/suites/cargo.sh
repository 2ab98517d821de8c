#!/usr/bin/env bash
# cargo.sh [ARGS...]: cargo test --locked --no-fail-fast ARGS (unit,
# integration and doc tests), counted from libtest's "test result:" lines into
# $TE_RESULTS_DIR/$TE_SUITE.counts. Ignored tests count as skipped, and so
# do tests that found they cannot run here: they append a line to
# $TE_SKIP_LOG (tests/common's `skip`) and are moved from passed to
# skipped; their reasons are listed at the end. A run that fails with no
# failed test counted (a build error, a crashed test binary) counts as one
# failure.
set -uo pipefail
cd "$(dirname "$0")/../.."
name=${TE_SUITE:-cargo}
out=${TE_RESULTS_DIR:?}/$name.log
export TE_SKIP_LOG=$TE_RESULTS_DIR/$name.skips
: >"$TE_SKIP_LOG"
cargo test --locked --no-fail-fast "$@" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
read -r passed failed ignored < <(awk '/^test result:/ {
    for (i = 2; i <= NF; i++) {
      if ($i == "passed;") p += $(i - 1)
      if ($i == "failed;") f += $(i - 1)
      if ($i == "ignored;") s += $(i - 1)
    }
  } END { print p + 0, f + 0, s + 0 }' "$out")
skipped_at_runtime=$(wc -l <"$TE_SKIP_LOG")
if [ "$((ignored + skipped_at_runtime))" -gt 0 ]; then
  echo "Tests that did not run (counted as skipped):"
  sed -n 's/^test \(.*\) \.\.\. ignored\(, \(.*\)\)\{0,1\}$/  ignored: \1 \3/p' "$out"
  sed 's/^/  SKIPPED: /' "$TE_SKIP_LOG"
fi
passed=$((passed - skipped_at_runtime))
skipped=$((ignored + skipped_at_runtime))
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
  echo "cargo test $* exited $rc with no failed test counted: counted as one failure"
  failed=1
fi
echo "$passed $failed $skipped" >"$TE_RESULTS_DIR/$name.counts"
exit "$rc"
