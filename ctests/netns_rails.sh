#!/usr/bin/env bash
# netns_rails.sh BUILD_DIR [SCENARIO...]
#
# Two "hosts", network namespaces te-ra-$$ (target) and te-rb-$$
# (initiator), joined by TWO veth pairs on separate subnets, each end's
# egress limited by tc tbf to the same rate ($RAILS_RATE, 200mbit):
#   rail 1: ra1<pid> 10.91.N.1/24 <-> rb1<pid> 10.91.N.2/24
#   rail 2: ra2<pid> 10.92.N.1/24 <-> rb2<pid> 10.92.N.2/24
# The target is transfer_bench (P2PHANDSHAKE, name 10.91.N.1, --device_name
# ra1,ra2); the initiator is transfer_bench or rail_peer (name 10.91.N.2)
# with a priority matrix naming rb1/rb2. Rails are paused for 3 s
# (MC_RDMA_RAIL_PAUSE_SECONDS) and stalls/connects time out after 3 s.
#
# Scenarios (all by default; ctest runs each as its own test):
#   throughput  the same WRITE bench (--verify) over one rail, then over
#               both: two rails >= 1.8x one rail (best of up to 3 pairs of
#               runs), and each rail carried >= 35% of the two-rail bytes.
#   failover    a rail_peer loop of byte-verified WRITE+READ rounds; rail 1
#               is cut (the target's end, ip link set down) mid-run: every
#               round completes with correct bytes, rail 2 carries the
#               traffic while rail 1 is down, the initiator logs rail 1 as
#               paused; rail 1 comes back, after the pause it carries
#               traffic again. getNicLoadStats shows both devices with an
#               EWMA > 0 and nothing in flight when idle.
#   both_down   both rails cut: the tasks FAIL (not hang) within 60 s;
#               both rails back: the same process transfers again.
#   preference  matrix {"cpu:0": [["rb1"],["rb2"]]} with a "cpu:0" buffer:
#               rb1 carries >= 10x the bytes of rb2; then the mirror matrix
#               gives the mirror result.
#   rail_down_service
#               while rail 1 (the rail of the target's handshake address)
#               is cut, a loop of byte-verified rounds over the surviving
#               rail moves at least half of one rail's rate and no
#               submitTransfer call blocks for >= 1 s.
#   late_write  a WRITE reported FAILED never lands later: a second target
#               whose server waits 60 s for a stalled request
#               (MC_TCP_STATUS_TIMEOUT_SEC=60 there, 3 s here); a 64 MiB
#               WRITE over rail 1 alone, rail 1 cut mid-way, the WRITE
#               FAILS; READs over rail 2 count the bytes of it in the target
#               right after the failure and again 25 s after rail 1 is back
#               (the kernel would have resent what the WRITE left queued by
#               then): the counts are equal. Then rail 1 works again.
# Needs root, ip netns and tc; otherwise skipped (exit 77; a failure with
# CI=true). Both namespaces (and with them the veths) are deleted at exit.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR [throughput|failover|both_down|preference|rail_down_service|late_write]..." >&2; exit 2; }
build=$(cd "$1" && pwd)
shift
scenarios=("$@")
[ ${#scenarios[@]} -gt 0 ] || scenarios=(throughput failover both_down preference rail_down_service late_write)
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=net_lib.sh
. "$here/net_lib.sh"
[ "$(id -u)" -eq 0 ] || net_skip "needs root for network namespaces"
command -v ip >/dev/null || net_skip "the ip command (iproute2) is missing"
command -v tc >/dev/null || net_skip "the tc command (iproute2) is missing"
net_init

bench=$build/transfer_bench
railp=$build/rail_peer
[ -x "$bench" ] || net_fail "$bench not built"
[ -x "$railp" ] || net_fail "$railp not built"

rate=${RAILS_RATE:-200mbit}
nsa=te-ra-$$
nsb=te-rb-$$
a1=ra1$$ a2=ra2$$ b1=rb1$$ b2=rb2$$
n=$((RANDOM % 200 + 20))
ipa1=10.91.$n.1 ipb1=10.91.$n.2
ipa2=10.92.$n.1 ipb2=10.92.$n.2
export MC_RDMA_RAIL_PAUSE_SECONDS=3 MC_TCP_STATUS_TIMEOUT_SEC=3 MC_HANDSHAKE_CONNECT_TIMEOUT=3
pause=$MC_RDMA_RAIL_PAUSE_SECONDS

net_on_exit "ip netns del $nsa 2>/dev/null; ip netns del $nsb 2>/dev/null; ip link del $a1 2>/dev/null; ip link del $a2 2>/dev/null; true"
if ! ip netns add "$nsa" 2>"$NET_TMP/netns.err"; then
  net_skip "cannot create network namespaces here: $(cat "$NET_TMP/netns.err")"
fi
ip netns add "$nsb"
for ns in "$nsa" "$nsb"; do ip -n "$ns" link set lo up; done
rail_link() { # a-end b-end a-addr b-addr
  ip link add "$1" type veth peer name "$2"
  ip link set "$1" netns "$nsa"
  ip link set "$2" netns "$nsb"
  ip -n "$nsa" addr add "$3/24" dev "$1"
  ip -n "$nsb" addr add "$4/24" dev "$2"
  ip -n "$nsa" link set "$1" up
  ip -n "$nsb" link set "$2" up
  # The same rate on both ends' egress (data one way, acks the other).
  if ! ip netns exec "$nsa" tc qdisc add dev "$1" root tbf rate "$rate" burst 128kb latency 25ms \
      2>"$NET_TMP/tc.err"; then
    net_skip "tc tbf is not available here: $(cat "$NET_TMP/tc.err")"
  fi
  ip netns exec "$nsb" tc qdisc add dev "$2" root tbf rate "$rate" burst 128kb latency 25ms
}
rail_link "$a1" "$b1" "$ipa1" "$ipb1"
rail_link "$a2" "$b2" "$ipa2" "$ipb2"
echo "rails: $a1 $ipa1 <-> $b1 $ipb1 and $a2 $ipa2 <-> $b2 $ipb2, tbf $rate each way"

# Bytes through an initiator veth, both directions.
bytes_b() {
  local rx tx
  rx=$(ip netns exec "$nsb" cat "/sys/class/net/$1/statistics/rx_bytes")
  tx=$(ip netns exec "$nsb" cat "/sys/class/net/$1/statistics/tx_bytes")
  echo $((rx + tx))
}

tsize=$((64 << 20))
net_start target ip netns exec "$nsa" "$bench" --mode target --local_server_name "$ipa1" \
  --device_name "$a1,$a2" --buffer_size "$tsize"
line=$(net_wait_line target '^segment ' 30)
read -r _ seg _ base _ _ <<<"$line"
echo "target in $nsa: $line"
case $seg in "$ipa1":*) ;; *) net_fail "target name $seg is not $ipa1:<port>" ;; esac
grep -q "$a1" "$NET_TMP/target.err" || true

# ----------------------------------------------------------- rail_peer
# peer_start NAME MATRIX: a rail_peer in the initiator namespace reading
# commands from a fifo (fd in PEER_FD_<NAME>).
peer_start() {
  local name=$1 matrix=$2 fifo=$NET_TMP/$1.in fd
  mkfifo "$fifo"
  net_start "$name" bash -c 'f=$1; shift; exec "$@" <"$f"' rail_peer "$fifo" \
    ip netns exec "$nsb" "$railp" P2PHANDSHAKE "$ipb1" "$matrix" "$seg" "$base" "$tsize"
  exec {fd}>"$fifo"
  eval "PEER_FD_$name=$fd"
  net_wait_line "$name" '^ready ' 30 >/dev/null
}
# peer_send NAME CMD...: sends a command; remembers where its answer starts.
peer_send() {
  local name=$1 fd
  shift
  fd=$(eval "echo \$PEER_FD_$name")
  eval "PEER_MARK_$name=$(wc -l <"$NET_TMP/$name.out")"
  echo "$*" >&"$fd"
}
# peer_wait NAME SECS: waits for the answer; sets ANSWER (stats: all lines).
peer_wait() {
  local name=$1 secs=$2 mark pid deadline
  mark=$(eval "echo \$PEER_MARK_$name")
  pid=$(net_pid "$name")
  deadline=$((SECONDS + secs))
  while :; do
    ANSWER=$(tail -n +$((mark + 1)) "$NET_TMP/$name.out" | grep -m1 -E '^(xfer|loop|stats end|error|write1|verify1|count1)' || true)
    if [ -n "$ANSWER" ]; then
      case $ANSWER in "stats end") ANSWER=$(tail -n +$((mark + 1)) "$NET_TMP/$name.out") ;; esac
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || net_fail "$name exited without answering"
    [ "$SECONDS" -lt "$deadline" ] || net_fail "$name did not answer in ${secs}s (hung?)"
    sleep 0.1
  done
}
peer_ask() { # NAME SECS CMD...
  local name=$1 secs=$2
  shift 2
  peer_send "$name" "$@"
  peer_wait "$name" "$secs"
}
peer_stop() {
  local fd
  fd=$(eval "echo \$PEER_FD_$1")
  echo quit >&"$fd"
  exec {fd}>&-
  net_wait_exit "$1" 30
  [ "$NET_RC" -eq 0 ] || net_fail "$1 exited with $NET_RC"
}
both=$(printf '{"cpu:0": [["%s","%s"],[]]}' "$b1" "$b2")
MiB=1048576

# ----------------------------------------------------------- scenarios
bench_write() { # DEVICES LOGNAME: prints the throughput in MB/s
  local out=$NET_TMP/$2.out
  ip netns exec "$nsb" "$bench" --mode initiator --local_server_name "$ipb1" --segment_id "$seg" \
    --target_base "$base" --target_size "$tsize" --device_name "$1" --operation write \
    --block_size $MiB --batch_size 16 --threads 4 --duration 6 --report_unit MB --verify \
    >"$out" 2>"$NET_TMP/$2.err" || net_fail "transfer_bench over $1 failed"
  grep -q '^verify: OK' "$out" || net_fail "transfer_bench over $1: no verify line"
  sed -n 's/^Test completed: .*throughput \([0-9.]*\) MB\/s$/\1/p' "$out"
}

scenario_throughput() {
  local best=0 try one two x1 x2 y1 y2 d1 d2 ratio
  for try in 1 2 3; do
    one=$(bench_write "$b1" "one$try")
    x1=$(bytes_b "$b1") x2=$(bytes_b "$b2")
    two=$(bench_write "$b1,$b2" "two$try")
    y1=$(bytes_b "$b1") y2=$(bytes_b "$b2")
    d1=$((y1 - x1)) d2=$((y2 - x2))
    ratio=$(awk -v a="$two" -v b="$one" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
    echo "throughput run $try: one rail $one MB/s, two rails $two MB/s, ratio $ratio;" \
      "two-rail bytes $b1 $d1, $b2 $d2"
    grep '^rail ' "$NET_TMP/two$try.out" | sed 's/^/  /'
    awk -v a="$d1" -v b="$d2" 'BEGIN { t = a + b; exit !(t > 0 && a >= 0.35 * t && b >= 0.35 * t) }' ||
      net_fail "the two-rail run did not use both rails ($b1 $d1 bytes, $b2 $d2 bytes)"
    best=$(awk -v a="$ratio" -v b="$best" 'BEGIN { print (a > b ? a : b) }')
    awk -v r="$best" 'BEGIN { exit !(r >= 1.8) }' && break
  done
  awk -v r="$best" 'BEGIN { exit !(r >= 1.8) }' ||
    net_fail "two rails reached only ${best}x the throughput of one (want >= 1.8)"
  echo "throughput: OK (two rails / one rail = ${best}x)"
}

scenario_failover() {
  peer_start fo "$both"
  peer_ask fo 60 xfer $MiB 16
  case $ANSWER in "xfer ok"*) ;; *) net_fail "warm-up: $ANSWER" ;; esac
  peer_send fo loop 16 $MiB 16
  sleep 4
  local d1 d2 u1 u2 e1 e2 f1 f2
  ip -n "$nsa" link set "$a1" down
  echo "rail 1 cut ($a1 down) under a running loop"
  sleep 2 # in-flight slices fail over (stall timeout 3 s)...
  d1=$(bytes_b "$b1") d2=$(bytes_b "$b2")
  sleep 6 # ...then only rail 2 moves bytes
  e1=$(bytes_b "$b1") e2=$(bytes_b "$b2")
  peer_wait fo 120
  case $ANSWER in "loop ok"*) ;; *) net_fail "with rail 1 down: $ANSWER" ;; esac
  echo "loop across the cut: $ANSWER"
  echo "while rail 1 was down: $b1 moved $((e1 - d1)) bytes, $b2 moved $((e2 - d2)) bytes"
  [ $((e2 - d2)) -gt $((8 * MiB)) ] || net_fail "rail 2 did not carry the traffic while rail 1 was down"
  [ $((e1 - d1)) -lt $(((e2 - d2) / 20)) ] || net_fail "rail 1 still moved bytes while down?"
  grep -E "rail $b1@[^ ]*/$a1 paused" "$NET_TMP/fo.err" | head -n 2 ||
    net_fail "the initiator never logged rail $b1->$a1 as paused"

  ip -n "$nsa" link set "$a1" up
  echo "rail 1 back up; waiting $((pause + 2)) s (> the ${pause} s pause)"
  sleep $((pause + 2))
  u1=$(bytes_b "$b1") u2=$(bytes_b "$b2")
  peer_ask fo 120 loop 6 $MiB 16
  case $ANSWER in "loop ok"*) ;; *) net_fail "after rail 1 returned: $ANSWER" ;; esac
  f1=$(bytes_b "$b1") f2=$(bytes_b "$b2")
  echo "after rail 1 returned: $ANSWER; $b1 moved $((f1 - u1)) bytes, $b2 moved $((f2 - u2)) bytes"
  awk -v a=$((f1 - u1)) -v b=$((f2 - u2)) 'BEGIN { exit !(a >= 0.25 * (a + b)) }' ||
    net_fail "rail 1 did not carry traffic again after it came back"

  peer_ask fo 30 stats
  echo "$ANSWER" | sed 's/^/  /'
  for d in "$b1" "$b2"; do
    echo "$ANSWER" | awk -v d="$d" '$1 == "nic" && $2 == d && $4 == 0 && $6 > 0 { ok = 1 } END { exit !ok }' ||
      net_fail "getNicLoadStats: want $d with 0 bytes in flight and an EWMA > 0"
  done
  peer_stop fo
  echo "failover: OK"
}

scenario_both_down() {
  peer_start bd "$both"
  peer_ask bd 60 xfer $MiB 8
  case $ANSWER in "xfer ok"*) ;; *) net_fail "warm-up: $ANSWER" ;; esac
  ip -n "$nsa" link set "$a1" down
  ip -n "$nsa" link set "$a2" down
  echo "both rails cut"
  local t0=$SECONDS
  peer_ask bd 130 xfer $MiB 8
  local took=$((SECONDS - t0))
  echo "with both rails down: $ANSWER (shell saw $took s)"
  case $ANSWER in "xfer FAILED"*) ;; *) net_fail "with both rails down the tasks did not FAIL: $ANSWER" ;; esac
  [ "$took" -lt 60 ] || net_fail "the tasks took $took s to fail (want < 60 s)"
  ip -n "$nsa" link set "$a1" up
  ip -n "$nsa" link set "$a2" up
  echo "both rails back up; waiting $((pause + 2)) s"
  sleep $((pause + 2))
  peer_ask bd 120 xfer $MiB 8
  echo "after the rails returned: $ANSWER"
  case $ANSWER in "xfer ok"*) ;; *) net_fail "the first transfer after the rails returned: $ANSWER" ;; esac
  peer_ask bd 120 loop 3 $MiB 16
  case $ANSWER in "loop ok"*) ;; *) net_fail "after the rails returned: $ANSWER" ;; esac
  peer_stop bd
  echo "both_down: OK"
}

scenario_preference() {
  local pref other name m x1 x2 y1 y2 dp do
  for pref in 1 2; do
    if [ $pref -eq 1 ]; then pd=$b1 od=$b2; else pd=$b2 od=$b1; fi
    m=$(printf '{"cpu:0": [["%s"],["%s"]]}' "$pd" "$od")
    name=pref$pref
    peer_start "$name" "$m"
    x1=$(bytes_b "$pd") x2=$(bytes_b "$od")
    peer_ask "$name" 120 loop 4 $MiB 16
    case $ANSWER in "loop ok"*) ;; *) net_fail "$m: $ANSWER" ;; esac
    y1=$(bytes_b "$pd") y2=$(bytes_b "$od")
    dp=$((y1 - x1)) do=$((y2 - x2))
    echo "matrix $m: preferred $pd moved $dp bytes, $od moved $do bytes ($ANSWER)"
    [ "$dp" -ge $((10 * do)) ] || net_fail "the preferred rail $pd did not carry the slices ($dp vs $do bytes)"
    peer_stop "$name"
  done
  echo "preference: OK"
}

scenario_rail_down_service() {
  peer_start sn "$both"
  peer_ask sn 60 xfer $MiB 8
  case $ANSWER in "xfer ok"*) ;; *) net_fail "warm-up: $ANSWER" ;; esac
  ip -n "$nsa" link set "$a1" down
  echo "rail 1 (the rail of the target's handshake address) cut"
  peer_ask sn 120 loop 10 $MiB 8
  echo "loop with rail 1 down: $ANSWER"
  case $ANSWER in "loop ok"*) ;; *) net_fail "with rail 1 down: $ANSWER" ;; esac
  ip -n "$nsa" link set "$a1" up
  local m bytes secs mbps one problems=""
  m=$(echo "$ANSWER" | sed -n 's/.*submit_max \([0-9.]*\).*/\1/p')
  bytes=$(echo "$ANSWER" | sed -n 's/.* bytes \([0-9]*\) .*/\1/p')
  secs=$(echo "$ANSWER" | sed -n 's/.* secs \([0-9.]*\) .*/\1/p')
  mbps=$(awk -v b="$bytes" -v s="$secs" 'BEGIN { printf "%.1f", b / s / 1e6 }')
  one=$(awk -v r="$rate" 'BEGIN { sub(/mbit$/, "", r); printf "%.1f", r / 8 }')
  echo "with rail 1 down: $mbps MB/s over rail 2 (one rail: about $one MB/s); longest submit $m s"
  awk -v m="$m" 'BEGIN { exit !(m < 1.0) }' ||
    problems+="a submitTransfer call blocked for $m s (want < 1 s); "
  awk -v a="$mbps" -v b="$one" 'BEGIN { exit !(a >= 0.5 * b) }' ||
    problems+="the surviving rail moved only $mbps MB/s (want >= half of $one MB/s); "
  [ -z "$problems" ] || net_fail "with rail 1 down: $problems"
  peer_stop sn
  echo "rail_down_service: OK"
}

scenario_late_write() {
  local line2 seg1=$seg base1=$base n1 n2
  net_start late_target env MC_TCP_STATUS_TIMEOUT_SEC=60 ip netns exec "$nsa" "$bench" --mode target \
    --local_server_name "$ipa1" --device_name "$a1,$a2" --buffer_size "$tsize"
  line2=$(net_wait_line late_target '^segment ' 30)
  read -r _ seg _ base _ _ <<<"$line2"
  echo "target with a 60 s server stall timeout: $line2"
  # lw writes over rail 1 only; lr reads over rail 2 only.
  peer_start lw "$(printf '{"cpu:0": [["%s"],[]]}' "$b1")"
  peer_start lr "$(printf '{"cpu:0": [["%s"],[]]}' "$b2")"
  seg=$seg1 base=$base1
  peer_ask lw 60 write1 $tsize 1
  case $ANSWER in "write1 COMPLETED"*) ;; *) net_fail "warm-up: $ANSWER" ;; esac
  peer_send lw write1 $tsize 2
  sleep 0.7
  ip -n "$nsa" link set "$a1" down
  echo "rail 1 cut under a 64 MiB WRITE"
  peer_wait lw 60
  echo "the WRITE: $ANSWER"
  case $ANSWER in "write1 FAILED"*) ;; *) net_fail "the cut WRITE did not fail: $ANSWER" ;; esac
  peer_ask lr 60 count1 $tsize 2
  n1=${ANSWER#count1 }
  echo "read over rail 2 after the failure: $n1 bytes of the FAILED WRITE are there"
  sleep 2
  ip -n "$nsa" link set "$a1" up
  echo "rail 1 back up; waiting 25 s (the kernel would resend what the WRITE left queued)"
  sleep 25
  peer_ask lr 60 count1 $tsize 2
  n2=${ANSWER#count1 }
  echo "25 s later: $n2 bytes"
  case $n1$n2 in *[!0-9]*) net_fail "counting over rail 2 failed: $n1 / $n2" ;; esac
  [ "$n1" -eq "$n2" ] || net_fail "$((n2 - n1)) bytes of the FAILED WRITE landed after it was reported"
  peer_ask lw 120 write1 $tsize 3
  case $ANSWER in "write1 COMPLETED"*) ;; *) net_fail "rail 1 after the fault: $ANSWER" ;; esac
  peer_ask lw 120 verify1 $tsize 3
  case $ANSWER in "verify1 ok") ;; *) net_fail "rail 1 after the fault: $ANSWER" ;; esac
  peer_stop lw
  peer_stop lr
  net_stop late_target 10
  echo "late_write: OK"
}

for s in "${scenarios[@]}"; do
  echo "=== $s"
  "scenario_$s"
done
net_stop target 10
[ "$NET_RC" -eq 0 ] || net_fail "target exited with $NET_RC after SIGTERM"
echo "netns_rails ${scenarios[*]}: OK"
