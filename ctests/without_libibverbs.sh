#!/bin/sh
# without_libibverbs.sh PROGRAM
#
# The library loads libibverbs at run time: on a host view where it cannot
# be loaded (a mount namespace with /dev/null bound over the file the
# loader would open), PROGRAM (auto_discover_copy) still creates its engine
# and moves bytes, and the log says once that RDMA is unavailable and what
# to install. Needs root (unshare -m); skipped (77) otherwise, failed with
# CI=true.
set -eu
program=$1
skip() {
  echo "SKIPPED: $1"
  [ "${CI:-}" = "true" ] && exit 1
  exit 77
}
[ "$(id -u)" -eq 0 ] || skip "needs root for a mount namespace"
command -v unshare >/dev/null || skip "no unshare"
lib=$(ldconfig -p | awk '$1 == "libibverbs.so.1" { print $NF; exit }')
[ -n "$lib" ] || skip "no libibverbs.so.1 to hide (the host has none: nothing to prove)"
lib=$(readlink -f "$lib")
out=$(mktemp)
trap 'rm -f "$out"' EXIT
rc=0
unshare -m sh -c "mount --bind /dev/null '$lib' && exec '$program'" >"$out" 2>&1 || rc=$?
cat "$out"
if [ "$rc" -ne 0 ]; then
  echo "FAIL: $program exited $rc without libibverbs" >&2
  exit 1
fi
n=$(grep -c 'RDMA is unavailable: libibverbs.so.1 could not be loaded' "$out" || true)
if [ "$n" -ne 1 ]; then
  echo "FAIL: want one 'RDMA is unavailable' log line, got $n" >&2
  exit 1
fi
echo "without_libibverbs: the engine moved bytes with libibverbs unloadable; one log line says so"
