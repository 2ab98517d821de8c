#!/usr/bin/env bash
# The RDMA test suite, on real verbs: soft-RoCE in a qemu guest that boots
# this machine's Debian kernel (see docs/rdma.md, "Testing RDMA without
# RDMA hardware").
#
#   scripts/rdma-vm/test.sh [CASE...]     (cases: see suite.sh; default all)
#
# Installs what it needs (setup.sh), builds the C programs (build/) and the
# Rust RDMA test binaries on the host, boots the guest and runs suite.sh in
# it, serially. Writes $TE_RESULTS_DIR/$TE_SUITE.counts ("passed failed
# skipped"; TE_RESULTS_DIR defaults to target/test-results, TE_SUITE to
# rdma-vm) and leaves the logs in target/$TE_SUITE/. Exit status 0 when
# every case passed.
# Env: VM_TIMEOUT (1800 s), VM_CPUS, VM_MEM (see run-in-vm.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)
results=${TE_RESULTS_DIR:-$repo/target/test-results}
mkdir -p "$results"
name=${TE_SUITE:-rdma-vm}
counts=$results/$name.counts
t0=$SECONDS
fail_setup() { echo "rdma-vm: $*" >&2; echo "0 1 0" >"$counts"; exit 1; }

scripts/rdma-vm/setup.sh || fail_setup "setup failed"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null || fail_setup "cmake configure failed"
cmake --build build -j"$(nproc)" --target net_peer transfer_bench || fail_setup "building the C programs failed"
# The test binary's path, for the guest: a newer rdma-* of another
# configuration may appear beside it while the guest runs.
# (The build also makes the crate's binaries, which the tests run: only the
# test target's artifact is the binary wanted.)
rdma_exe=$(cargo test --locked --no-run --test rdma --message-format=json-render-diagnostics |
  grep '"kind":\["test"\]' | grep '"name":"rdma"' |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
[ -x "$rdma_exe" ] || fail_setup "building the Rust RDMA tests failed"

# The guest writes only under the shared working directory.
out=target/$name
rm -rf "$out" && mkdir -p "$out"
echo "${rdma_exe#"$repo"/}" >"$out/rdma-test-binary"
VM_TIMEOUT=${VM_TIMEOUT:-1800} scripts/rdma-vm/run-in-vm.sh "scripts/rdma-vm/suite.sh $out $*"
rc=$?
if [ -s "$out/rdma-vm.counts" ]; then
  cp "$out/rdma-vm.counts" "$counts"
else
  echo "rdma-vm: the suite reported nothing (VM exit $rc: 124 = VM_TIMEOUT, 125 = the VM died)" >&2
  echo "0 1 0" >"$counts"
  [ "$rc" -ne 0 ] || rc=1
fi
echo "rdma-vm: $(cat "$counts") (passed failed skipped) in $((SECONDS - t0)) s; logs in $out/"
exit "$rc"
