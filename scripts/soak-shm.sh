#!/usr/bin/env bash
# soak-shm.sh: batch-1 WRITEs to one target on this host over shared
# memory for a long time (10 minutes by default), then the slowest request.
#
#   scripts/soak-shm.sh [--duration SECONDS] [--block BYTES]
#
# Builds release with CMake (build/, or $BUILD_DIR), starts one
# transfer_bench target with --protocol shm on 127.0.0.1 (P2PHANDSHAKE) and
# runs one initiator thread: one request per batch, back to back, each
# verified at the end (--verify). Prints the initiator's result, its
# latency line (p50, p99 and the slowest request: every request is timed,
# from submitTransfer to the getTransferStatus that saw it end) and a
# verdict against the goal: no request of 100 ms or more on an idle host.
# Not part of the test suite: it takes as long as it is told to.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
duration=600
block=4096
while [ $# -gt 0 ]; do
  case $1 in
    --duration) duration=$2; shift 2 ;;
    --block) block=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "soak-shm.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

build=${BUILD_DIR:-"$root/build"}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"${JOBS:-2}" --target transfer_bench >/dev/null
bench=$build/transfer_bench

tmp=$(mktemp -d "${TMPDIR:-/tmp}/te-soak-shm.XXXXXX")
target=
cleanup() {
  [ -n "$target" ] && { kill -TERM "$target" 2>/dev/null; wait "$target" 2>/dev/null; }
  rm -rf "$tmp"
}
trap cleanup EXIT

"$bench" --mode target --protocol shm --metadata_server P2PHANDSHAKE --local_server_name 127.0.0.1 \
  --buffer_size $((16 << 20)) --verify >"$tmp/target.out" 2>"$tmp/target.err" &
target=$!
for _ in $(seq 600); do
  grep -q '^segment ' "$tmp/target.out" && break
  kill -0 "$target" 2>/dev/null || { cat "$tmp/target.err" >&2; exit 1; }
  sleep 0.1
done
grep -m1 '^segment ' "$tmp/target.out" >"$tmp/targets"
echo "soak: $duration s of batch-1 WRITEs of $block B over shared memory"
"$bench" --mode initiator --protocol shm --metadata_server P2PHANDSHAKE --local_server_name 127.0.0.1 \
  --targets_file "$tmp/targets" --operation write --block_size "$block" --batch_size 1 --threads 1 \
  --duration "$duration" --buffer_size $((16 << 20)) --verify | tee "$tmp/initiator.out" | grep -v '^progress'
max=$(sed -n 's/^requests: .*, max \([0-9.]*\) us.*/\1/p' "$tmp/initiator.out")
python3 - "$max" <<'EOF'
import sys
worst = float(sys.argv[1])
print("slowest request: %.1f ms (goal: under 100 ms on an idle host): %s" %
      (worst / 1000, "met" if worst < 100_000 else "NOT met"))
EOF
