#!/usr/bin/env bash
# lint.sh: cargo fmt --check, cargo clippy on every target with the default
# features, with none and with all (the lints are in Cargo.toml's [lints];
# warnings are errors), and cargo doc (rustdoc warnings are errors); each
# check counts as one test in $TE_RESULTS_DIR/$TE_SUITE.counts.
set -uo pipefail
cd "$(dirname "$0")/../.."
passed=0 failed=0
check() {
  if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $*"; fi
}
check cargo fmt --check
check cargo clippy --all-targets --locked -- -D warnings
check cargo clippy --all-targets --locked --no-default-features -- -D warnings
check cargo clippy --all-targets --locked --all-features -- -D warnings
check env RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --locked
echo "$passed $failed 0" >"${TE_RESULTS_DIR:?}/${TE_SUITE:-lint}.counts"
[ "$failed" -eq 0 ]
