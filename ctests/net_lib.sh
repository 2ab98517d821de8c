# net_lib.sh: helpers shared by the networked ctest drivers (sourced, not run).
#
#   net_init                  makes $NET_TMP and installs the EXIT trap
#   net_start NAME CMD...     starts CMD in the background, stdout/stderr in
#                             $NET_TMP/NAME.out / NAME.err; its pid in NET_PID_<NAME>
#   net_wait_line NAME REGEX SECS
#                             prints the first stdout line of NAME matching
#                             REGEX; fails if NAME exits or SECS pass first
#   net_stop NAME [SECS]      SIGTERM, then SIGKILL after SECS (default 10);
#                             sets NET_RC to the exit status
#   net_fail MSG              prints MSG and the logs, exits 1
#   net_skip WHY              prints "SKIPPED: WHY" and exits 77 (ctest's
#                             SKIP_RETURN_CODE); with CI=true fails instead
#   net_on_exit CMD           runs CMD (a string) at exit, after the children die
# Every process started with net_start is killed at exit, whatever happens.

NET_NAMES=()
NET_EXIT_HOOKS=()

net_cleanup() {
  local rc=$?
  set +e
  local n pid
  for n in "${NET_NAMES[@]}"; do
    pid=$(net_pid "$n")
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null
  done
  for n in "${NET_NAMES[@]}"; do
    pid=$(net_pid "$n")
    [ -z "$pid" ] && continue
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  local h
  for h in "${NET_EXIT_HOOKS[@]}"; do eval "$h"; done
  [ -n "${NET_TMP:-}" ] && [ -z "${NET_KEEP_TMP:-}" ] && rm -rf "$NET_TMP"
  exit "$rc"
}

net_init() {
  NET_TMP=$(mktemp -d "${TMPDIR:-/tmp}/te-net.XXXXXX")
  trap net_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
}

net_on_exit() { NET_EXIT_HOOKS+=("$1"); }

net_pid() { eval "echo \${NET_PID_$1:-}"; }

net_start() {
  local name=$1
  shift
  "$@" >"$NET_TMP/$name.out" 2>"$NET_TMP/$name.err" &
  eval "NET_PID_$name=$!"
  NET_NAMES+=("$name")
}

net_show_logs() {
  local f
  for f in "$NET_TMP"/*.out "$NET_TMP"/*.err; do
    [ -s "$f" ] || continue
    echo "----- $(basename "$f") (last 40 lines)"
    tail -n 40 "$f"
  done
}

net_fail() {
  echo "FAIL: $*" >&2
  net_show_logs >&2
  exit 1
}

net_skip() {
  if [ "${CI:-}" = true ]; then
    echo "FAIL: cannot run: $* (CI=true: every prerequisite must be present)" >&2
    exit 1
  fi
  echo "SKIPPED: $*"
  exit 77
}

net_wait_line() {
  local name=$1 regex=$2 secs=$3 pid line
  pid=$(net_pid "$name")
  local deadline=$((SECONDS + secs))
  while :; do
    line=$(grep -m1 -E "$regex" "$NET_TMP/$name.out" 2>/dev/null || true)
    if [ -n "$line" ]; then
      printf '%s\n' "$line"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      net_fail "$name exited before printing a line matching '$regex'"
    fi
    [ "$SECONDS" -lt "$deadline" ] || net_fail "$name printed no line matching '$regex' in ${secs}s"
    sleep 0.05
  done
}

# Waits up to SECS for NAME to exit; sets NET_RC (124 on timeout, process killed).
net_wait_exit() {
  local name=$1 secs=$2 pid
  pid=$(net_pid "$name")
  local deadline=$((SECONDS + secs))
  while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    NET_RC=124
    return 0
  fi
  NET_RC=0
  wait "$pid" || NET_RC=$?
}

net_stop() {
  local name=$1 secs=${2:-10} pid
  pid=$(net_pid "$name")
  kill -TERM "$pid" 2>/dev/null || true
  net_wait_exit "$name" "$secs"
}

# Starts our metadata server on a free loopback port (the kernel picks it:
# --addr 127.0.0.1:0) and sets META_URL.
net_start_metadata_server() {
  local bin=$1
  [ -x "$bin" ] || net_fail "metadata server binary not found: $bin"
  net_start metadata "$bin" --addr 127.0.0.1:0 --path /metadata
  local line
  line=$(net_wait_line metadata '^listening on http://' 30)
  META_URL=${line#listening on }
}

# ------------------------------------------------------------ etcd / redis
#   net_require_bin VAR NAME WHAT
#                             sets NET_BIN to $VAR or NAME on PATH; when missing
#                             skips (net_skip), or fails with
#                             TE_REQUIRE_SERVERS=1 (scripts/test.sh sets it)
#   net_free_port             prints a 127.0.0.1 port nothing listens on
#   net_http METHOD HOSTPORT PATH [BODY]
#                             a tiny HTTP/1.1 client over bash's /dev/tcp (no
#                             curl needed); prints the whole response
#   net_start_etcd            private etcd on free ports, data in $NET_TMP/etcd;
#                             sets ETCD_ENDPOINT (127.0.0.1:port)
#   net_etcd_has KEY          exit 0 when etcd holds KEY
#   net_start_redis [PASS]    private redis-server without persistence, with
#                             --requirepass PASS if given; sets REDIS_PORT
#   net_redis DB CMD...       redis-cli against it (authenticated when a
#                             password was given), database DB
# The servers are started with net_start, so the EXIT trap stops them.

net_require_bin() {
  local var=$1 name=$2 what=$3 given
  given=$(eval "echo \${$var:-}")
  if [ -n "$given" ]; then
    NET_BIN=$given
  else
    NET_BIN=$(command -v "$name" || true)
  fi
  if [ -z "$NET_BIN" ] || [ ! -x "$NET_BIN" ]; then
    if [ "${TE_REQUIRE_SERVERS:-}" = 1 ]; then
      net_fail "$what not installed (no $name; set $var) and TE_REQUIRE_SERVERS=1"
    fi
    net_skip "$what not installed (no $name on PATH; set $var)"
  fi
}

net_free_port() {
  local p
  for _ in $(seq 200); do
    p=$((20000 + RANDOM % 40000))
    # A refused connection means nothing listens there.
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  net_fail "no free port found"
}

net_http() {
  local method=$1 hostport=$2 path=$3 body=${4:-}
  local host=${hostport%:*} port=${hostport##*:}
  (
    exec 3<>"/dev/tcp/$host/$port" || exit 1
    printf '%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' \
      "$method" "$path" "$hostport" "${#body}" "$body" >&3
    timeout 5 cat <&3
  ) 2>/dev/null
}

net_start_etcd() {
  net_require_bin TE_ETCD_BIN etcd etcd
  local bin=$NET_BIN try cport pport dir
  for try in 1 2 3; do
    cport=$(net_free_port)
    pport=$(net_free_port)
    [ "$cport" != "$pport" ] || continue
    dir=$NET_TMP/etcd$try
    mkdir -p "$dir"
    net_start "etcd$try" "$bin" --name default --data-dir "$dir/data" \
      --listen-client-urls "http://127.0.0.1:$cport" \
      --advertise-client-urls "http://127.0.0.1:$cport" \
      --listen-peer-urls "http://127.0.0.1:$pport" \
      --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
      --initial-cluster "default=http://127.0.0.1:$pport" --log-level warn
    local pid deadline=$((SECONDS + 20))
    pid=$(net_pid "etcd$try")
    while kill -0 "$pid" 2>/dev/null; do
      if net_http GET "127.0.0.1:$cport" /health | grep -q '"health":"true"'; then
        ETCD_ENDPOINT=127.0.0.1:$cport
        return 0
      fi
      [ "$SECONDS" -lt "$deadline" ] || net_fail "etcd not healthy within 20 s"
      sleep 0.1
    done
    grep -qi 'address already in use' "$NET_TMP/etcd$try.out" "$NET_TMP/etcd$try.err" ||
      net_fail "etcd exited during startup"
  done
  net_fail "etcd: no free ports after 3 attempts"
}

net_etcd_has() {
  local key
  key=$(printf '%s' "$1" | base64 -w0)
  net_http POST "$ETCD_ENDPOINT" /v3/kv/range "{\"key\":\"$key\",\"count_only\":true}" |
    grep -q '"count":"1"'
}

net_start_redis() {
  net_require_bin TE_REDIS_SERVER_BIN redis-server redis
  local bin=$NET_BIN try port pass=${1:-}
  NET_REDIS_PASS=$pass
  command -v redis-cli >/dev/null || net_fail "redis-cli (Debian redis-tools) is missing"
  for try in 1 2 3; do
    port=$(net_free_port)
    mkdir -p "$NET_TMP/redis$try"
    local args=(--port "$port" --bind 127.0.0.1 --save "" --appendonly no
      --dir "$NET_TMP/redis$try" --daemonize no --loglevel warning)
    [ -n "$pass" ] && args+=(--requirepass "$pass")
    net_start "redis$try" "$bin" "${args[@]}"
    REDIS_PORT=$port
    local pid deadline=$((SECONDS + 20))
    pid=$(net_pid "redis$try")
    while kill -0 "$pid" 2>/dev/null; do
      if [ "$(net_redis 0 PING 2>/dev/null)" = PONG ]; then
        return 0
      fi
      [ "$SECONDS" -lt "$deadline" ] || net_fail "redis not answering within 20 s"
      sleep 0.1
    done
    grep -qi 'address already in use' "$NET_TMP/redis$try.out" "$NET_TMP/redis$try.err" ||
      net_fail "redis-server exited during startup"
  done
  net_fail "redis: no free port after 3 attempts"
}

net_redis() {
  local db=$1
  shift
  if [ -n "${NET_REDIS_PASS:-}" ]; then
    REDISCLI_AUTH=$NET_REDIS_PASS timeout 10 redis-cli -h 127.0.0.1 -p "$REDIS_PORT" -n "$db" "$@"
  else
    timeout 10 redis-cli -h 127.0.0.1 -p "$REDIS_PORT" -n "$db" "$@"
  fi
}
