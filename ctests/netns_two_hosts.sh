#!/usr/bin/env bash
# netns_two_hosts.sh BUILD_DIR
#
# Two "hosts": network namespaces te-a-$$ and te-b-$$ joined by a veth pair
# 10.77.X.1/24 <-> 10.77.X.2/24 (X random; only these private addresses, in
# our own namespaces). `net_peer target` runs in te-a with P2PHANDSHAKE and
# local name 10.77.X.1, `net_peer initiator` in te-b as 10.77.X.2: the full
# byte-verified two-process suite, over a real (virtual) link. Then the link
# is taken down under a running transfer loop and the initiator must fail,
# not hang. Needs root; otherwise skipped (exit 77; a failure with CI=true). Both
# namespaces are deleted at exit.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=net_lib.sh
. "$here/net_lib.sh"
[ "$(id -u)" -eq 0 ] || net_skip "needs root for network namespaces"
command -v ip >/dev/null || net_skip "the ip command (iproute2) is missing"
net_init

peer=$build/net_peer
[ -x "$peer" ] || net_fail "$peer not built"
nsa=te-a-$$
nsb=te-b-$$
vetha=tea$$
vethb=teb$$
x=$((RANDOM % 200))
ipa=10.77.$x.1
ipb=10.77.$x.2

net_on_exit "ip netns del $nsa 2>/dev/null; ip netns del $nsb 2>/dev/null; ip link del $vetha 2>/dev/null; true"
if ! ip netns add "$nsa" 2>"$NET_TMP/netns.err"; then
  net_skip "cannot create network namespaces here: $(cat "$NET_TMP/netns.err")"
fi
ip netns add "$nsb"
ip link add "$vetha" type veth peer name "$vethb"
ip link set "$vetha" netns "$nsa"
ip link set "$vethb" netns "$nsb"
ip -n "$nsa" addr add "$ipa/24" dev "$vetha"
ip -n "$nsb" addr add "$ipb/24" dev "$vethb"
for ns in "$nsa" "$nsb"; do ip -n "$ns" link set lo up; done
ip -n "$nsa" link set "$vetha" up
ip -n "$nsb" link set "$vethb" up
echo "namespaces $nsa ($ipa) and $nsb ($ipb) joined by a veth pair"

size=$((120 * 1024 * 1024))
net_start target ip netns exec "$nsa" "$peer" target P2PHANDSHAKE "$ipa" "$size"
line=$(net_wait_line target '^segment ' 30)
read -r _ seg _ base _ tsize <<<"$line"
echo "target in $nsa: $line"
case $seg in "$ipa":*) ;; *) net_fail "target name $seg is not $ipa:<port>" ;; esac

rc=0
timeout -k 5 240 ip netns exec "$nsb" "$peer" initiator P2PHANDSHAKE "$ipb" "$seg" "$base" "$tsize" \
  >"$NET_TMP/initiator.out" 2>"$NET_TMP/initiator.err" || rc=$?
cat "$NET_TMP/initiator.out"
[ "$rc" -eq 0 ] || net_fail "initiator in $nsb exited with $rc"

grep '^expect: ' "$NET_TMP/initiator.out" | sed 's/^expect: //' >"$NET_TMP/expected"
deadline=$((SECONDS + 30))
while :; do
  missing=$(grep -Fxv -f "$NET_TMP/target.out" "$NET_TMP/expected" || true)
  [ -z "$missing" ] && break
  [ "$SECONDS" -lt "$deadline" ] || net_fail "the target never printed: $missing"
  sleep 0.1
done
if grep -q 'check FAILED' "$NET_TMP/target.out"; then
  net_fail "the target found wrong bytes"
fi
echo "two hosts: verified transfers, notifications and bad inputs OK"

# The link goes down under a transfer loop: tasks must fail in bounded time.
export MC_TCP_STATUS_TIMEOUT_SEC=5
net_start loop ip netns exec "$nsb" "$peer" reconnect P2PHANDSHAKE "$ipb" "$NET_TMP/seg1" "$NET_TMP/none"
printf '%s\n' "$line" >"$NET_TMP/seg1"
net_wait_line loop '^phase1: running' 30 >/dev/null
sleep 1
ip -n "$nsa" link set "$vetha" down
down_at=$SECONDS
echo "link $vetha taken down"
net_wait_line loop '^phase1 done' 30 >/dev/null
echo "initiator saw the failure within $((SECONDS - down_at)) s of the link going down:"
grep '^phase1' "$NET_TMP/loop.out"
net_stop loop 5

net_stop target 10
[ "$NET_RC" -eq 0 ] || net_fail "target exited with $NET_RC after SIGTERM"
echo "netns_two_hosts: OK"
