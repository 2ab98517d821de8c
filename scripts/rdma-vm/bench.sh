#!/usr/bin/env bash
# In the VM (scripts/bench-rdma.sh starts it): perftest and our
# transfer_bench, READ and WRITE, one rail (rxe_a0 -> rxe_b0), the same
# block size; prints medians (MiB/s) and the ratio.
#   bench.sh RUNS BLOCK DURATION
set -uo pipefail
runs=$1 block=$2 duration=$3
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
bench=$repo/build/transfer_bench
export RUST_LOG=warn
# The same local ACK timeout for perftest (-u) and us (see suite.sh).
export MC_IB_TIMEOUT=${MC_IB_TIMEOUT:-20}
mkdir -p "$repo/target/rdma-vm"
tmp=$(mktemp -d "$repo/target/rdma-vm/bench.XXXXXX")   # logs stay on the host
iters=$(((200 * 1024 * 1024 + block - 1) / block))
[ "$iters" -ge 5 ] || iters=5
batch=$(((16 * 1024 * 1024 + block - 1) / block))
[ "$batch" -le 128 ] || batch=128
buffer=$((batch * block * 2))

# Stops PID: SIGTERM, then SIGKILL after 20 s (reported).
stop() {
  kill -TERM "$1" 2>/dev/null
  for _ in $(seq 200); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$1" 2>/dev/null; then
    echo "  ($2 did not stop within 20 s of SIGTERM; killed)" >&2
    kill -KILL "$1"
  fi
  wait "$1" 2>/dev/null
}

median() { sort -g | awk '{v[NR]=$1} END {if (NR==0) print "nan"; else if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }

# perftest: BW average [MB/sec, MB = 2^20 bytes] of the client's result line.
perftest() { # OP
  local port=$((18515 + RANDOM % 1000)) srv
  timeout 150 "ib_${1}_bw" -d rxe_b0 -x 1 -u "$MC_IB_TIMEOUT" -s "$block" -n "$iters" -p "$port" >"$tmp/pt.srv" 2>&1 &
  srv=$!
  sleep 1
  timeout 120 "ib_${1}_bw" -d rxe_a0 -x 1 -u "$MC_IB_TIMEOUT" -s "$block" -n "$iters" -p "$port" 198.18.0.2 >"$tmp/pt.cli" 2>&1
  wait "$srv" || true
  awk -v b="$block" '$1 == b && NF >= 5 {print $4}' "$tmp/pt.cli" | tail -n 1
}

# Ours: a transfer_bench target on rxe_b0 and an initiator on rxe_a0 (P2P
# handshake on 127.0.0.1), 1 thread, batches of up to 16 MiB in flight.
ours() { # OP
  "$bench" --mode target --protocol rdma --device_name rxe_b0 --buffer_size "$buffer" \
    >"$tmp/t.out" 2>"$tmp/t.err" &
  local tp=$! line seg base
  for _ in $(seq 600); do line=$(grep -m1 '^segment ' "$tmp/t.out" || true); [ -n "$line" ] && break; sleep 0.1; done
  read -r _ seg _ base _ <<<"$line"
  timeout 120 "$bench" --mode initiator --protocol rdma --device_name rxe_a0 --segment_id "$seg" \
    --target_base "$base" --target_size "$buffer" --buffer_size "$buffer" --operation "$1" \
    --block_size "$block" --batch_size "$batch" --threads 1 --duration "$duration" \
    --report_unit MiB >"$tmp/i.out" 2>"$tmp/i.err"
  stop "$tp" "transfer_bench target"
  sed -n 's/^Test completed: .*throughput \([0-9.]*\) MiB\/s/\1/p' "$tmp/i.out"
}

echo "bench-rdma: block $block B, $runs runs, perftest -n $iters, ours batch $batch x 1 thread for ${duration} s"
for op in write read; do
  : >"$tmp/$op.pt"; : >"$tmp/$op.ours"
  for r in $(seq "$runs"); do
    p=$(perftest "$op"); o=$(ours "$op")
    echo "  run $r $op: perftest ${p:-failed} MiB/s, ours ${o:-failed} MiB/s"
    [ -n "$p" ] && echo "$p" >>"$tmp/$op.pt"
    [ -n "$o" ] && echo "$o" >>"$tmp/$op.ours"
  done
done
printf '%-6s %12s %12s %8s\n' op "perftest" "ours" ratio
fails=0
for op in write read; do
  p=$(median <"$tmp/$op.pt"); o=$(median <"$tmp/$op.ours")
  [ "$p" = nan ] || [ "$o" = nan ] && fails=1
  printf '%-6s %9s MiB/s %7s MiB/s %8s\n' "$op" "$p" "$o" "$(awk -v o="$o" -v p="$p" 'BEGIN {if (p > 0) printf "%.2f", o / p; else print "n/a"}')"
done
[ "$fails" -ne 0 ] || rm -rf "$tmp"
exit "$fails"
