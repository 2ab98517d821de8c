#!/usr/bin/env bash
# bench-rails.sh: multi-rail TCP throughput, one rail versus two.
#
#   scripts/bench-rails.sh [--runs N] [--duration S] [--rate RATE] [--operation write|read]
#
# Needs root. Builds transfer_bench (release, build/ or $BUILD_DIR), makes two
# network namespaces joined by two veth pairs on separate subnets (10.91.N.0/24
# and 10.92.N.0/24), each end's egress limited by tc tbf to RATE (200mbit),
# starts a transfer_bench target in one (--device_name of its two veths) and,
# per run, two initiators in the other: over rail 1 only (--device_name rb1)
# and over both (--device_name rb1,rb2), 4 threads x batch 16 x 1 MiB
# blocks. Runs are interleaved. For each case it reports the median of the
# runs: the bench's total (Mooncake's result line), per rail the bench's
# getNicLoadStats EWMA mean and the rail's byte counter (/sys tx_bytes for
# WRITE, rx_bytes for READ, over the run), and the two-rail / one-rail
# ratio. iperf3 over rail 1 (if installed) gives the limit of one rail on
# the same path. MB = 1e6 bytes. A benchmark: its verdict is the table.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=3
duration=6
rate=200mbit
op=write
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --operation) op=$2; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "bench-rails.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "bench-rails.sh: needs root (network namespaces)" >&2; exit 1; }

build=${BUILD_DIR:-"$root/build"}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"${JOBS:-2}" --target transfer_bench >/dev/null
bench=$build/transfer_bench

# shellcheck source=../ctests/net_lib.sh
. "$root/ctests/net_lib.sh"
net_init
nsa=te-bra-$$ nsb=te-brb-$$
a1=bra1$$ a2=bra2$$ b1=brb1$$ b2=brb2$$
n=$((RANDOM % 200 + 20))
net_on_exit "ip netns del $nsa 2>/dev/null; ip netns del $nsb 2>/dev/null; true"
ip netns add "$nsa"
ip netns add "$nsb"
for ns in "$nsa" "$nsb"; do ip -n "$ns" link set lo up; done
i=0
for pair in "$a1 $b1 10.91" "$a2 $b2 10.92"; do
  read -r a b net <<<"$pair"
  ip link add "$a" type veth peer name "$b"
  ip link set "$a" netns "$nsa"
  ip link set "$b" netns "$nsb"
  ip -n "$nsa" addr add "$net.$n.1/24" dev "$a"
  ip -n "$nsb" addr add "$net.$n.2/24" dev "$b"
  ip -n "$nsa" link set "$a" up
  ip -n "$nsb" link set "$b" up
  ip netns exec "$nsa" tc qdisc add dev "$a" root tbf rate "$rate" burst 128kb latency 25ms
  ip netns exec "$nsb" tc qdisc add dev "$b" root tbf rate "$rate" burst 128kb latency 25ms
  i=$((i + 1))
done
ipa1=10.91.$n.1 ipb1=10.91.$n.2
echo "two rails: $a1/$b1 10.91.$n.0/24 and $a2/$b2 10.92.$n.0/24, tbf $rate on each end"

tsize=$((64 << 20))
net_start target ip netns exec "$nsa" "$bench" --mode target --local_server_name "$ipa1" \
  --device_name "$a1,$a2" --buffer_size "$tsize"
line=$(net_wait_line target '^segment ' 30)
read -r _ seg _ base _ _ <<<"$line"

counter() { # DEV
  local f=tx_bytes
  [ "$op" = read ] && f=rx_bytes
  ip netns exec "$nsb" cat "/sys/class/net/$1/statistics/$f"
}
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

limit=""
if command -v iperf3 >/dev/null; then
  net_start iperf ip netns exec "$nsa" iperf3 -s -B "$ipa1" -1
  sleep 0.5
  limit=$(ip netns exec "$nsb" iperf3 -c "$ipa1" -B "$ipb1" -P 4 -t 4 -J 2>/dev/null |
    python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 8e6))' ||
    echo "")
fi

declare -A res
for run in $(seq "$runs"); do
  for case in one two; do
    devs=$b1
    [ "$case" = two ] && devs="$b1,$b2"
    x1=$(counter "$b1") x2=$(counter "$b2")
    out=$NET_TMP/$case$run.out
    ip netns exec "$nsb" "$bench" --mode initiator --local_server_name "$ipb1" --segment_id "$seg" \
      --target_base "$base" --target_size "$tsize" --device_name "$devs" --operation "$op" \
      --block_size 1048576 --batch_size 16 --threads 4 --duration "$duration" --report_unit MB \
      >"$out" 2>"$NET_TMP/$case$run.err" || net_fail "transfer_bench $case rail(s), run $run"
    y1=$(counter "$b1") y2=$(counter "$b2")
    secs=$(sed -n 's/^Test completed: duration \([0-9.]*\),.*/\1/p' "$out")
    total=$(sed -n 's/^Test completed: .*throughput \([0-9.]*\) MB\/s$/\1/p' "$out")
    e1=$(sed -n "s/^rail $b1: throughput \\([0-9.]*\\) .*/\\1/p" "$out")
    e2=$(sed -n "s/^rail $b2: throughput \\([0-9.]*\\) .*/\\1/p" "$out")
    c1=$(awk -v b=$((y1 - x1)) -v s="$secs" 'BEGIN { printf "%.1f", b / s / 1e6 }')
    c2=$(awk -v b=$((y2 - x2)) -v s="$secs" 'BEGIN { printf "%.1f", b / s / 1e6 }')
    res[$case,total]+="$total "
    res[$case,e1]+="${e1:-0} "
    res[$case,e2]+="${e2:-0} "
    res[$case,c1]+="$c1 "
    res[$case,c2]+="$c2 "
    echo "run $run, $case rail(s): total $total MB/s; $b1 ewma ${e1:-0} counter $c1; $b2 ewma ${e2:-0} counter $c2 MB/s"
  done
done

med() { tr ' ' '\n' <<<"${res[$1]}" | grep -v '^$' | median; }
echo
echo "Median of $runs runs, $op, ${duration}s each, tbf $rate per rail (MB/s, 1e6 bytes):"
printf '%-10s %10s %14s %14s %14s %14s\n' case total "rail1 ewma" "rail1 bytes" "rail2 ewma" "rail2 bytes"
for case in one two; do
  printf '%-10s %10s %14s %14s %14s %14s\n' "$case" "$(med "$case,total")" "$(med "$case,e1")" \
    "$(med "$case,c1")" "$(med "$case,e2")" "$(med "$case,c2")"
done
ratio=$(awk -v a="$(med two,total)" -v b="$(med one,total)" 'BEGIN { printf "%.2f", a / b }')
[ -n "$limit" ] && echo "iperf3 over rail 1 (-P 4, same path): $limit MB/s"
echo "two rails / one rail: ${ratio}x"
net_stop target 10
