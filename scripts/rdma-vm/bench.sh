#!/usr/bin/env bash
# In the VM (scripts/bench-rdma.sh starts it): perftest (ib_write_bw /
# ib_read_bw), our transfer_bench with each busy-poll spell of SPELLS
# (MC_TE_RDMA_BUSY_POLL_US; 0 = interrupt-driven) and Mooncake's own
# transfer_engine_bench (from its PyPI wheel), one rail (rxe_a0 ->
# rxe_b0), batch 64, one thread, the same block sizes; then the latency of
# one 4 KiB READ (batch 1). Prints medians (MiB/s, us) and the ratios.
#   bench.sh RUNS DURATION OPS SPELLS BLOCK...   (OPS, SPELLS: quoted lists)
set -uo pipefail
runs=$1 duration=$2 ops=$3 spells=$4
shift 4
blocks=("$@")
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
bench=$repo/build/transfer_bench
venv=${TE_MOONCAKE_VENV:-/var/tmp/te-mooncake-venv}
mc_bench=$(ls "$venv"/lib/python3*/site-packages/mooncake/transfer_engine_bench 2>/dev/null | head -n 1)
export RUST_LOG=warn
# The same local ACK timeout for perftest (-u), us and Mooncake (see suite.sh).
export MC_IB_TIMEOUT=${MC_IB_TIMEOUT:-20}
batch=64
mkdir -p "$repo/target/rdma-vm"
tmp=$(mktemp -d "$repo/target/rdma-vm/bench.XXXXXX")   # logs stay on the host

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
ratio() { awk -v o="$1" -v p="$2" 'BEGIN {if (o != "nan" && p != "nan" && p > 0) printf "%.2f", o / p; else print "n/a"}'; }

# perftest OP BLOCK: BW average [MB/sec, MB = 2^20 bytes] of the client's
# result line; ~200 MiB, at most 8000 iterations.
perftest() {
  local port=$((18515 + RANDOM % 1000)) srv block=$2 iters
  iters=$(((200 * 1024 * 1024 + block - 1) / block))
  [ "$iters" -le 8000 ] || iters=8000
  [ "$iters" -ge 5 ] || iters=5
  timeout 150 "ib_${1}_bw" -d rxe_b0 -x 1 -u "$MC_IB_TIMEOUT" -s "$block" -n "$iters" -p "$port" >"$tmp/pt.srv" 2>&1 &
  srv=$!
  sleep 1
  timeout 120 "ib_${1}_bw" -d rxe_a0 -x 1 -u "$MC_IB_TIMEOUT" -s "$block" -n "$iters" -p "$port" 198.18.0.2 >"$tmp/pt.cli" 2>&1
  wait "$srv" || true
  awk -v b="$block" '$1 == b && NF >= 5 {print $4}' "$tmp/pt.cli" | tail -n 1
}

# ours OP BLOCK BATCH BUSY_US: a transfer_bench target on rxe_b0 and an
# initiator on rxe_a0 (P2P handshake on 127.0.0.1), 1 thread; MiB/s.
ours() {
  local buffer=$(($2 * $3 * 2)) tp line seg base
  MC_TE_RDMA_BUSY_POLL_US=$4 "$bench" --mode target --protocol rdma --device_name rxe_b0 \
    --buffer_size "$buffer" >"$tmp/t.out" 2>"$tmp/t.err" &
  tp=$!
  for _ in $(seq 600); do line=$(grep -m1 '^segment ' "$tmp/t.out" || true); [ -n "$line" ] && break; sleep 0.1; done
  read -r _ seg _ base _ <<<"$line"
  MC_TE_RDMA_BUSY_POLL_US=$4 timeout 120 "$bench" --mode initiator --protocol rdma --device_name rxe_a0 \
    --segment_id "$seg" --target_base "$base" --target_size "$buffer" --buffer_size "$buffer" \
    --operation "$1" --block_size "$2" --batch_size "$3" --threads 1 --duration "$duration" \
    --report_unit MiB >"$tmp/i.out" 2>"$tmp/i.err"
  stop "$tp" "transfer_bench target"
  sed -n 's/^Test completed: .*throughput \([0-9.]*\) MiB\/s/\1/p' "$tmp/i.out"
}

# mooncake OP BLOCK BATCH: Mooncake's transfer_engine_bench, the same
# shape (its target on rxe_b0, its initiator on rxe_a0, P2P handshake).
mooncake() {
  [ -n "$mc_bench" ] || return 0
  local buffer=$(($2 * $3 * 2)) port=$((20000 + RANDOM % 5000)) tp seg=""
  "$mc_bench" --mode target --protocol rdma --device_name rxe_b0 --metadata_server P2PHANDSHAKE \
    --local_server_name "127.0.0.1:$port" --buffer_size "$buffer" --logtostderr \
    >"$tmp/mt.out" 2>&1 &
  tp=$!
  # Under P2PHANDSHAKE its segment is named by the port it listens on
  # (not the one asked for); it registers its buffer after it says which
  # memory it uses.
  for _ in $(seq 120); do
    kill -0 "$tp" 2>/dev/null || break
    seg=$(sed -n 's/.*listening on \([0-9.]*:[0-9]*\).*/\1/p' "$tmp/mt.out" | head -n 1)
    [ -n "$seg" ] && grep -q "DRAM is used" "$tmp/mt.out" && break
    sleep 0.5
  done
  if [ -z "$seg" ] || ! kill -0 "$tp" 2>/dev/null; then
    echo "  (Mooncake's target did not come up: $(tail -n 1 "$tmp/mt.out"))" >&2
    stop "$tp" "Mooncake target"
    return 0
  fi
  sleep 2
  timeout 120 "$mc_bench" --mode initiator --protocol rdma --device_name rxe_a0 \
    --metadata_server P2PHANDSHAKE --local_server_name "127.0.0.1:$((port + 1))" \
    --segment_id "$seg" --buffer_size "$buffer" --logtostderr \
    --operation "$1" --block_size "$2" --batch_size "$3" --threads 1 --duration "$duration" \
    --report_unit MiB >"$tmp/mi.out" 2>&1
  stop "$tp" "Mooncake target"
  sed -n 's/.*Test completed: .*throughput \([0-9.]*\) MiB\/s.*/\1/p' "$tmp/mi.out" | tail -n 1
}

# Appends the value $2 (if any) to the list $1.
keep() { [ -z "$2" ] || echo "$2" >>"$tmp/$1"; }
med() { if [ -s "$tmp/$1" ]; then median <"$tmp/$1"; else echo nan; fi; }

echo "bench-rdma: blocks ${blocks[*]} B, ops $ops, $runs runs, batch $batch x 1 thread for ${duration} s;" \
  "ours with busy-poll spells $spells us; Mooncake: ${mc_bench:-absent}"
for block in "${blocks[@]}"; do
  for op in $ops; do
    for r in $(seq "$runs"); do
      p=$(perftest "$op" "$block"); keep "$op.$block.pt" "$p"
      line="  $op $block run $r: perftest ${p:-failed}"
      for sp in $spells; do
        o=$(ours "$op" "$block" "$batch" "$sp"); keep "$op.$block.$sp" "$o"
        line+=", ours/$sp ${o:-failed}"
      done
      m=$(mooncake "$op" "$block" "$batch"); keep "$op.$block.mc" "$m"
      echo "$line, Mooncake ${m:-failed} (MiB/s)"
    done
  done
done
# One 4 KiB READ at a time (batch 1): microseconds per READ, from the
# throughput (4096 B / rate), median of the runs.
us() { [ -z "$1" ] || awk -v v="$1" 'BEGIN {if (v > 0) printf "%.1f\n", 4096 / (v * 1048576) * 1e6}'; }
for r in $(seq "$runs"); do
  line="  latency run $r:"
  for sp in $spells; do
    v=$(us "$(ours read 4096 1 "$sp")"); keep "lat.$sp" "$v"; line+=" ours/$sp ${v:-failed} us,"
  done
  v=$(us "$(mooncake read 4096 1)"); keep lat.mc "$v"
  echo "$line Mooncake ${v:-failed} us"
done

fails=0
echo
echo "medians of $runs runs (MiB/s); ours/N = ours with MC_TE_RDMA_BUSY_POLL_US=N (0 = interrupt-driven)"
printf '%-6s %8s %-13s %10s %10s %10s %14s %14s\n' op block ours perftest ours Mooncake ours/perftest ours/Mooncake
for block in "${blocks[@]}"; do
  for op in $ops; do
    p=$(med "$op.$block.pt"); m=$(med "$op.$block.mc")
    for sp in $spells; do
      o=$(med "$op.$block.$sp")
      [ "$p" = nan ] || [ "$o" = nan ] && fails=1
      printf '%-6s %8s %-13s %10s %10s %10s %14s %14s\n' "$op" "$block" "ours/$sp" "$p" "$o" "$m" \
        "$(ratio "$o" "$p")" "$(ratio "$o" "$m")"
    done
  done
done
line="4 KiB READ latency, batch 1 (us per READ, median):"
for sp in $spells; do line+=" ours/$sp $(med "lat.$sp"),"; done
echo "$line Mooncake $(med lat.mc)"
[ "$fails" -ne 0 ] || rm -rf "$tmp"
exit "$fails"
