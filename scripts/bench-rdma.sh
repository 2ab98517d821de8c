#!/usr/bin/env bash
# bench-rdma.sh: RDMA WRITE and READ between two processes over one
# soft-RoCE rail (rxe_a0 -> rxe_b0) in the VM of scripts/rdma-vm/: perftest
# (ib_write_bw / ib_read_bw), our transfer_bench in both completion modes,
# and Mooncake's transfer_engine_bench (its PyPI wheel, see
# scripts/rdma-vm/setup.sh), batch 64, one thread, in the same VM boot;
# then the latency of one 4 KiB READ (batch 1) of ours and Mooncake's.
#
#   scripts/bench-rdma.sh [--runs N] [--block BYTES]... [--duration S]
#                         [--ops "write read"] [--spells "0 200 100000"]
#
# Defaults: 3 runs, blocks 4096, 65536 and 1048576 (--block replaces them;
# repeat it for several), 4 s per run of ours and Mooncake's, connection
# set-up included for both (perftest:
# ~200 MiB, at most 8000 iterations), ours with each busy-poll spell
# (MC_TE_RDMA_BUSY_POLL_US) of --spells: 0 (interrupt-driven), 200 us and
# 100000 us (Mooncake's). Runs alternate them so all see the same machine
# state; the table shows medians in MiB/s and the ratios ours / perftest
# and ours / Mooncake. Soft-RoCE under TCG moves tens of MB/s: only the
# ratios mean anything. A benchmark, not a test: the exit status is
# non-zero only when something failed to run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=3 blocks=() duration=4 ops="write read" spells="0 200 100000"
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --block) blocks+=("$2"); shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --ops) ops=$2; shift 2 ;;
    --spells) spells=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "bench-rdma.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ ${#blocks[@]} -gt 0 ] || blocks=(4096 65536 1048576)
cd "$root"
scripts/rdma-vm/setup.sh >/dev/null
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"${JOBS:-2}" --target transfer_bench >/dev/null
VM_TIMEOUT=${VM_TIMEOUT:-3600} scripts/rdma-vm/run-in-vm.sh \
  "scripts/rdma-vm/bench.sh $runs $duration '$ops' '$spells' ${blocks[*]}"
