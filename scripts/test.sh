#!/usr/bin/env bash
# Runs every test suite, then prints one summary line over all of them.
#
# A suite is one `suite NAME COMMAND...` line below, or a pair
# `suite_start NAME COMMAND...` ... `suite_wait NAME` for one that runs
# beside the others (its output is printed when it is waited for). Its command exits
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

# disk_note WHEN: free space where the run writes (a full run needs about
# 8 GB: target/ and build/), so a suite that fails for want of disk says so.
disk_note() {
  df -Pk . "${TMPDIR:-/tmp}" | awk -v when="$1" 'NR > 1 && !seen[$1]++ {
    printf "disk %s: %.1f GB free on %s\n", when, $4 / 1048576, $6 }'
}
disk_note "at the start"

failed_suites=()
# suite_done NAME RC SECONDS: the suite's verdict.
suite_done() {
  local name=$1 rc=$2
  echo "===== suite $name took $3 s"
  [ "$rc" -eq 0 ] || disk_note "after $name failed"
  if [ ! -s "$TE_RESULTS_DIR/$name.counts" ]; then
    echo "suite $name wrote no $TE_RESULTS_DIR/$name.counts (exit $rc): counted as one failure"
    echo "0 1 0" >"$TE_RESULTS_DIR/$name.counts"
    rc=1
  fi
  [ "$rc" -eq 0 ] || failed_suites+=("$name")
}
suite() {
  local name=$1
  shift
  echo "===== suite $name: $*"
  rm -f "$TE_RESULTS_DIR/$name.counts"
  local rc=0 t0=$SECONDS
  TE_SUITE=$name "$@" || rc=$?
  suite_done "$name" "$rc" "$((SECONDS - t0))"
}
# A suite in the background: its output goes to $TE_RESULTS_DIR/NAME.out,
# its exit status to NAME.rc.
declare -A background_pid background_start
suite_start() {
  local name=$1
  shift
  echo "===== suite $name started in the background: $*"
  rm -f "$TE_RESULTS_DIR/$name".{counts,out,rc}
  background_start[$name]=$SECONDS
  (
    rc=0
    TE_SUITE=$name "$@" </dev/null >"$TE_RESULTS_DIR/$name.out" 2>&1 || rc=$?
    echo "$rc" >"$TE_RESULTS_DIR/$name.rc"
  ) &
  background_pid[$name]=$!
}
suite_wait() {
  local name=$1
  wait "${background_pid[$name]}"
  echo "===== suite $name (ran in the background):"
  cat "$TE_RESULTS_DIR/$name.out"
  suite_done "$name" "$(cat "$TE_RESULTS_DIR/$name.rc" 2>/dev/null || echo 1)" \
    "$((SECONDS - background_start[$name]))"
}

if ! setup_log=$(scripts/setup.sh 2>&1); then
  printf '%s\n' "$setup_log"
  echo "scripts/setup.sh failed"
  exit 1
fi

# The order keeps both cores busy. RDMA on real verbs runs in a qemu guest
# (soft-RoCE, scripts/rdma-vm/) that keeps about one core busy for minutes:
# it runs beside lint, asan and both cargo suites. It needs the C programs
# ctest builds and, for its Python interop case, python's virtualenv.
suite ctest scripts/suites/ctest.sh
suite python scripts/test-python.sh
suite_start rdma-vm scripts/rdma-vm/test.sh
suite lint scripts/suites/lint.sh
suite asan scripts/suites/asan.sh
suite cargo scripts/suites/cargo.sh
suite cargo-no-default-features scripts/suites/cargo.sh --no-default-features
suite_wait rdma-vm

scripts/suites/summary.sh "$TE_RESULTS_DIR"
summary_rc=$?
disk_note "at the end"
du -sh target build 2>/dev/null | sed 's/^/disk used: /'
if ((${#failed_suites[@]})); then
  echo "failed suites: ${failed_suites[*]}"
  exit 1
fi
exit "$summary_rc"
