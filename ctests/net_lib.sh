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
