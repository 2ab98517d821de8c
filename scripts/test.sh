#!/usr/bin/env bash
# Runs every test suite, then prints one summary line over all of them.
#
# A suite is one `suite NAME COMMAND...` line below. Its command exits
# non-zero when it fails and writes "$TE_RESULTS_DIR/NAME.counts": one line
# of three integers, "passed failed skipped". TE_SUITE=NAME is exported to
# it. A suite that fails without writing its file counts as one failure.
# The summary sums every *.counts file in $TE_RESULTS_DIR (a temporary
# directory unless TE_RESULTS_DIR is set), so a suite run by another script
# into the same directory is counted as well. Exit status: 0 only when no
# suite failed and no test failed.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ -z "${TE_RESULTS_DIR:-}" ]; then
  TE_RESULTS_DIR=$(mktemp -d "${TMPDIR:-/tmp}/te-results.XXXXXX")
  trap 'rm -rf "$TE_RESULTS_DIR"' EXIT
fi
mkdir -p "$TE_RESULTS_DIR"
export TE_RESULTS_DIR
export RUST_BACKTRACE=1
# A full run builds every configuration once: incremental compilation's
# caches would only cost time and gigabytes of disk.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
# The store tests must fail, not skip, when etcd or redis is missing.
export TE_REQUIRE_SERVERS=1

failed_suites=()
suite() {
  local name=$1
  shift
  echo "===== suite $name: $*"
  rm -f "$TE_RESULTS_DIR/$name.counts"
  local rc=0 t0=$SECONDS
  TE_SUITE=$name "$@" || rc=$?
  echo "===== suite $name took $((SECONDS - t0)) s"
  if [ ! -s "$TE_RESULTS_DIR/$name.counts" ]; then
    echo "suite $name wrote no $TE_RESULTS_DIR/$name.counts (exit $rc): counted as one failure"
    echo "0 1 0" >"$TE_RESULTS_DIR/$name.counts"
    rc=1
  fi
  [ "$rc" -eq 0 ] || failed_suites+=("$name")
}

if ! setup_log=$(scripts/setup.sh 2>&1); then
  printf '%s\n' "$setup_log"
  echo "scripts/setup.sh failed"
  exit 1
fi

suite lint scripts/suites/lint.sh
suite cargo scripts/suites/cargo.sh
suite cargo-no-default-features scripts/suites/cargo.sh --no-default-features
suite asan scripts/suites/asan.sh
suite ctest scripts/suites/ctest.sh
suite python scripts/test-python.sh
# RDMA on real verbs: soft-RoCE in a qemu guest (scripts/rdma-vm/), serially.
suite rdma-vm scripts/rdma-vm/test.sh

scripts/suites/summary.sh "$TE_RESULTS_DIR"
summary_rc=$?
if ((${#failed_suites[@]})); then
  echo "failed suites: ${failed_suites[*]}"
  exit 1
fi
exit "$summary_rc"
