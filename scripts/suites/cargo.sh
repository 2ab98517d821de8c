#!/usr/bin/env bash
# cargo.sh [ARGS...]: the crate's unit and integration tests under
# cargo-nextest (each test its own process, several at once:
# .config/nextest.toml), then, unless ARGS pick targets (--test, --lib,
# ...), its doc tests and the benchmark's smoke check with cargo test;
# ARGS go to every command. Counted from nextest's summary line and
# libtest's "test result:" lines into $TE_RESULTS_DIR/$TE_SUITE.counts.
# Ignored tests count as skipped, and so do tests that found they cannot
# run here: they append a line to $TE_SKIP_LOG (tests/common's `skip`) and
# are moved from passed to skipped; their reasons are listed at the end. A
# run that fails with no failed test counted (a build error, a crashed
# test binary) counts as one failure.
set -uo pipefail
cd "$(dirname "$0")/../.."
name=${TE_SUITE:-cargo}
out=${TE_RESULTS_DIR:?}/$name.log
export TE_SKIP_LOG=$TE_RESULTS_DIR/$name.skips
: >"$TE_SKIP_LOG"
: >"$out"
# nextest comes with this machine's Rust toolchain; a machine without it
# builds it once.
if ! cargo nextest --version >/dev/null 2>&1; then
  cargo install --locked cargo-nextest >>"$out" 2>&1 || {
    echo "cannot install cargo-nextest (see $out): counted as one failure"
    echo "0 1 0" >"$TE_RESULTS_DIR/$name.counts"
    exit 1
  }
fi
picked=0
for a in "$@"; do
  case $a in
    --test | --test=* | --tests | --lib | --bin | --bin=* | --bins | --bench | --bench=* | --benches | --doc) picked=1 ;;
  esac
done
rc=0
if [ "$picked" -eq 1 ]; then
  cargo nextest run --locked "$@" 2>&1 | tee -a "$out"
  rc=${PIPESTATUS[0]}
else
  # Benchmarks (harness = false) speak no test protocol: their smoke
  # check runs below.
  cargo nextest run --locked --lib --bins --test '*' "$@" 2>&1 | tee -a "$out"
  rc=${PIPESTATUS[0]}
  cargo test --locked --doc "$@" 2>&1 | tee -a "$out"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  # The benchmark needs its harness, which only feature bench-internals
  # builds into the library.
  cargo test --locked --bench '*' --features bench-internals "$@" 2>&1 | tee -a "$out"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
# nextest: "Summary [ 265.960s] 499 tests run: 497 passed (1 slow), 2
# failed, 1 timed out, 24 skipped"; libtest: "test result: ok. 3 passed;
# 0 failed; 1 ignored; ...".
read -r passed failed ignored < <(awk '
  /^ *Summary \[/ {
    line = $0; sub(/.*tests? run: /, "", line); n = split(line, parts, ",")
    for (i = 1; i <= n; i++) {
      split(parts[i], w, " ")
      if (parts[i] ~ / passed/) p += w[1]
      else if (parts[i] ~ / skipped/) s += w[1]
      else f += w[1]
    }
  }
  /^test result:/ {
    for (i = 2; i <= NF; i++) {
      if ($i == "passed;") p += $(i - 1)
      if ($i == "failed;") f += $(i - 1)
      if ($i == "ignored;") s += $(i - 1)
    }
  } END { print p + 0, f + 0, s + 0 }' "$out")
skipped_at_runtime=$(wc -l <"$TE_SKIP_LOG")
if [ "$((ignored + skipped_at_runtime))" -gt 0 ]; then
  echo "Tests that did not run (counted as skipped):"
  sed -n 's/^ *SKIP \[[^]]*\] *\(([^)]*)\)\{0,1\} *\(.*\)$/  ignored: \2/p' "$out"
  sed -n 's/^test \(.*\) \.\.\. ignored\(, \(.*\)\)\{0,1\}$/  ignored: \1 \3/p' "$out"
  sed 's/^/  SKIPPED: /' "$TE_SKIP_LOG"
fi
passed=$((passed - skipped_at_runtime))
skipped=$((ignored + skipped_at_runtime))
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
  echo "cargo.sh $* exited $rc with no failed test counted: counted as one failure"
  failed=1
fi
echo "$passed $failed $skipped" >"$TE_RESULTS_DIR/$name.counts"
exit "$rc"
