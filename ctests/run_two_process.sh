#!/usr/bin/env bash
# run_two_process.sh BUILD_DIR p2p|http
#
# Two processes on loopback: `net_peer target` and `net_peer initiator`
# (ctests/net_peer.c). p2p: P2PHANDSHAKE. http: our metadata server
# (build/cargo/release/transfer-engine-metadata-server), started here on a
# free 127.0.0.1 port. Passes when the initiator exits 0 (byte-verified
# transfers, threads, notifications, bad inputs), the target printed every
# line the initiator expects of it (notifications, its own checks of the
# written bytes), and the target stops cleanly on SIGTERM. The target and
# the metadata server are always killed at exit.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BUILD_DIR p2p|http" >&2; exit 2; }
build=$(cd "$1" && pwd)
mode=$2
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=net_lib.sh
. "$here/net_lib.sh"
net_init

peer=$build/net_peer
[ -x "$peer" ] || net_fail "$peer not built"
size=$((120 * 1024 * 1024))

case $mode in
  p2p)
    conn=P2PHANDSHAKE
    tname=127.0.0.1
    iname=127.0.0.1
    ;;
  http)
    net_start_metadata_server "$build/cargo/release/transfer-engine-metadata-server"
    conn=$META_URL
    tname=te-target-$$
    iname=te-initiator-$$
    # Store mode advertises the first non-loopback address unless told.
    export MC_TCP_BIND_ADDRESS=127.0.0.1
    echo "metadata server: $conn"
    ;;
  *) echo "unknown mode $mode (p2p or http)" >&2; exit 2 ;;
esac

net_start target "$peer" target "$conn" "$tname" "$size"
line=$(net_wait_line target '^segment ' 30)
read -r _ seg _ base _ tsize <<<"$line"
echo "target: $line"

rc=0
timeout -k 5 240 "$peer" initiator "$conn" "$iname" "$seg" "$base" "$tsize" \
  >"$NET_TMP/initiator.out" 2>"$NET_TMP/initiator.err" || rc=$?
cat "$NET_TMP/initiator.out"
[ "$rc" -eq 0 ] || net_fail "initiator exited with $rc (124 = timed out)"

# Every line the initiator expects from the target, within 30 s.
grep '^expect: ' "$NET_TMP/initiator.out" | sed 's/^expect: //' >"$NET_TMP/expected"
nexp=$(wc -l <"$NET_TMP/expected")
[ "$nexp" -ge 4 ] || net_fail "the initiator expects only $nexp target lines"
deadline=$((SECONDS + 30))
while :; do
  missing=$(grep -Fxv -f "$NET_TMP/target.out" "$NET_TMP/expected" || true)
  [ -z "$missing" ] && break
  [ "$SECONDS" -lt "$deadline" ] || net_fail "the target never printed: $missing"
  sleep 0.1
done
if grep -q 'check FAILED' "$NET_TMP/target.out"; then
  net_fail "the target found wrong bytes: $(grep 'check FAILED' "$NET_TMP/target.out")"
fi
echo "target printed all $nexp expected lines"

net_stop target 10
[ "$NET_RC" -eq 0 ] || net_fail "target exited with $NET_RC after SIGTERM (124 = did not stop)"
grep -q '^target: stopped by signal' "$NET_TMP/target.out" || net_fail "target did not stop cleanly"
echo "two-process $mode: OK"
