#!/usr/bin/env bash
# bench-rdma.sh: RDMA READ and WRITE between two processes over one
# soft-RoCE rail (rxe_a0 -> rxe_b0) in the VM of scripts/rdma-vm/, beside
# perftest's ib_write_bw / ib_read_bw on the same rail with the same block
# size, in the same VM boot.
#
#   scripts/bench-rdma.sh [--runs N] [--block BYTES] [--duration S]
#
# Defaults: 5 runs, 1 MiB blocks, 3 s per run of ours (perftest: as many
# iterations of the block as ~200 MiB). Runs alternate perftest and ours so
# both see the same machine state; the table shows medians in MiB/s and
# the ratio ours / perftest. Soft-RoCE under TCG moves tens of MB/s: only
# the ratio means anything. A benchmark, not a test: the exit status is
# non-zero only when something failed to run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=5 block=$((1024 * 1024)) duration=3
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --block) block=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "bench-rdma.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
cd "$root"
scripts/rdma-vm/setup.sh >/dev/null
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"${JOBS:-2}" --target transfer_bench >/dev/null
VM_TIMEOUT=${VM_TIMEOUT:-1200} scripts/rdma-vm/run-in-vm.sh \
  "scripts/rdma-vm/bench.sh $runs $block $duration"
