#!/usr/bin/env bash
# run_two_process.sh BUILD_DIR p2p|http|etcd|redis|redis_auth
#
# Two processes on loopback: `net_peer target` and `net_peer initiator`
# (ctests/net_peer.c). p2p: P2PHANDSHAKE. http: our metadata server
# (build/bin/transfer-engine-metadata-server), started here on a free
# 127.0.0.1 port. etcd / redis: a private etcd / redis-server on free
# 127.0.0.1 ports with a temporary data directory (skipped, exit 77, when
# the binary is missing; a failure with TE_REQUIRE_SERVERS=1 or CI=true). redis_auth: redis with
# a password, the engines given MC_REDIS_PASSWORD and MC_REDIS_DB_INDEX=3;
# an engine without the password must fail to start. In the store modes the
# target's keys (mooncake/rpc_meta/NAME, mooncake/ram/NAME) are checked in
# the store itself (in database 3, and absent from 0, for redis_auth) while
# it runs, and checked gone after it stops. Passes when the initiator exits 0 (byte-verified
# transfers, threads, notifications, bad inputs), the target printed every
# line the initiator expects of it (notifications, its own checks of the
# written bytes), and the target stops cleanly on SIGTERM. The target and
# the metadata server are always killed at exit.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BUILD_DIR p2p|http|etcd|redis|redis_auth" >&2; exit 2; }
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
    net_start_metadata_server "$build/bin/transfer-engine-metadata-server"
    conn=$META_URL
    tname=te-target-$$
    iname=te-initiator-$$
    # Store mode advertises the first non-loopback address unless told.
    export MC_TCP_BIND_ADDRESS=127.0.0.1
    echo "metadata server: $conn"
    ;;
  etcd)
    net_start_etcd
    conn=etcd://$ETCD_ENDPOINT
    ;;
  redis)
    net_start_redis
    conn=redis://127.0.0.1:$REDIS_PORT
    ;;
  redis_auth)
    net_start_redis "te-secret-$$"
    conn=redis://127.0.0.1:$REDIS_PORT
    export MC_REDIS_DB_INDEX=3
    # Without the password the engine cannot publish: it must fail, fast.
    rc=0
    MC_TCP_BIND_ADDRESS=127.0.0.1 timeout -k 5 30 "$peer" target "$conn" te-nopass-$$ 4096 \
      >"$NET_TMP/nopass.out" 2>"$NET_TMP/nopass.err" || rc=$?
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] ||
      net_fail "an engine without MC_REDIS_PASSWORD exited with $rc (want a failure, not 0 or a timeout)"
    grep -q '^segment ' "$NET_TMP/nopass.out" && net_fail "an engine without the password came up"
    echo "without the password: createTransferEngine failed (exit $rc), as it must"
    export MC_REDIS_PASSWORD=te-secret-$$
    ;;
  *) echo "unknown mode $mode (p2p, http, etcd, redis or redis_auth)" >&2; exit 2 ;;
esac
case $mode in
  etcd | redis | redis_auth)
    tname=te-target-$$:1
    iname=te-initiator-$$:2
    export MC_TCP_BIND_ADDRESS=127.0.0.1
    echo "metadata: $conn"
    ;;
esac

# Whether the store holds KEY (store modes).
store_has() {
  case $mode in
    etcd) net_etcd_has "$1" ;;
    redis) [ "$(net_redis 0 EXISTS "$1")" = 1 ] ;;
    redis_auth)
      [ "$(net_redis 0 EXISTS "$1")" = 0 ] || net_fail "$1 is in redis database 0, not 3"
      [ "$(net_redis 3 EXISTS "$1")" = 1 ]
      ;;
    *) return 1 ;;
  esac
}

net_start target "$peer" target "$conn" "$tname" "$size"
line=$(net_wait_line target '^segment ' 30)
read -r _ seg _ base _ tsize <<<"$line"
echo "target: $line"
case $mode in
  etcd | redis | redis_auth)
    for key in "mooncake/rpc_meta/$tname" "mooncake/ram/$tname"; do
      store_has "$key" || net_fail "the store has no $key while the target runs"
    done
    echo "the store holds the target's rpc_meta and ram keys"
    ;;
esac

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
case $mode in
  etcd | redis | redis_auth)
    for key in "mooncake/rpc_meta/$tname" "mooncake/ram/$tname" "mooncake/rpc_meta/$iname" "mooncake/ram/$iname"; do
      store_has "$key" && net_fail "$key is still in the store after its engine was destroyed"
    done
    echo "both engines removed their keys from the store"
    ;;
esac
echo "two-process $mode: OK"
