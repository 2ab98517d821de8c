#!/usr/bin/env bash
# kill_target.sh BUILD_DIR
#
# kill -9 of the target in the middle of transfers. `net_peer reconnect`
# (one initiator process) transfers to target 1 in a loop; after ~2 s the
# target is killed with SIGKILL. The initiator must see FAILED tasks, with
# every task of the batch terminal, and a new request to the dead peer must
# fail too, all within 20 s of the kill (MC_TCP_STATUS_TIMEOUT_SEC=5), not
# hang. Then target 2 starts (a new process, a new name) and the SAME
# initiator process must move verified bytes with it.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=net_lib.sh
. "$here/net_lib.sh"
net_init

peer=$build/net_peer
[ -x "$peer" ] || net_fail "$peer not built"
export MC_TCP_STATUS_TIMEOUT_SEC=5
size=$((32 * 1024 * 1024))

net_start target1 "$peer" target P2PHANDSHAKE 127.0.0.1 "$size"
line1=$(net_wait_line target1 '^segment ' 30)
echo "target 1: $line1"

net_start initiator "$peer" reconnect P2PHANDSHAKE 127.0.0.1 "$NET_TMP/seg1" "$NET_TMP/seg2"
printf '%s\n' "$line1" >"$NET_TMP/seg1.tmp" && mv "$NET_TMP/seg1.tmp" "$NET_TMP/seg1"
net_wait_line initiator '^phase1: running' 30 >/dev/null
sleep 2
pid1=$(net_pid target1)
kill -0 "$pid1" 2>/dev/null || net_fail "target 1 died before it was killed"
kill -KILL "$pid1"
killed_at=$SECONDS
{ wait "$pid1" || true; } 2>/dev/null
echo "target 1 killed with SIGKILL"

net_wait_line initiator '^phase1 done' 20 >/dev/null
echo "initiator saw the failure within $((SECONDS - killed_at)) s of the kill:"
grep '^phase1' "$NET_TMP/initiator.out"

net_start target2 "$peer" target P2PHANDSHAKE 127.0.0.1 "$size"
line2=$(net_wait_line target2 '^segment ' 30)
echo "target 2: $line2"
printf '%s\n' "$line2" >"$NET_TMP/seg2.tmp" && mv "$NET_TMP/seg2.tmp" "$NET_TMP/seg2"

net_wait_exit initiator 120
[ "$NET_RC" -eq 0 ] || net_fail "initiator exited with $NET_RC (124 = hung)"
grep '^phase2' "$NET_TMP/initiator.out" || net_fail "no phase2 line"
echo "kill_target: OK"
