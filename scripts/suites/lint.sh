#!/usr/bin/env bash
# lint.sh: cargo fmt --check and cargo clippy (every target, warnings are
# errors); each check counts as one test in $TE_RESULTS_DIR/$TE_SUITE.counts.
set -uo pipefail
cd "$(dirname "$0")/../.."
passed=0 failed=0
check() {
  if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $*"; fi
}
check cargo fmt --check
check cargo clippy --all-targets --locked -- -D warnings
echo "$passed $failed 0" >"${TE_RESULTS_DIR:?}/${TE_SUITE:-lint}.counts"
[ "$failed" -eq 0 ]
