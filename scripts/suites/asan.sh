#!/usr/bin/env bash
# asan.sh: the tests of calls racing at the API (install against destroy,
# cancels against completions, frees and destroy,
# register against unregister, destroy against background work) built
# with AddressSanitizer (and its leak checker), counted as scripts/suites/
# cargo.sh counts. The sanitizer needs rustc's unstable -Z flag, which
# RUSTC_BOOTSTRAP allows on the stable toolchain; the build has its own
# target directory.
set -uo pipefail
cd "$(dirname "$0")/../.."
export RUSTC_BOOTSTRAP=1
export RUSTFLAGS="-Zsanitizer=address"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR_ASAN:-target/asan}
exec scripts/suites/cargo.sh --target "$(rustc -vV | sed -n 's/^host: //p')" \
  --test api -E 'test(/^(api_races|caller_never_waits|cancel)::/)'
