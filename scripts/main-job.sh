#!/usr/bin/env bash
# main-job.sh: the project's main job. Two processes on loopback move data
# through the C API with P2PHANDSHAKE (no metadata server), verify it, and
# print the throughput.
#
#   scripts/main-job.sh [--duration S]      (default 5 s per direction)
#
# 1. scripts/setup.sh, then a release build with CMake into build/ (or
#    $BUILD_DIR); their output is kept in a log, shown only if they fail.
# 2. transfer_bench --mode target in the background: registers a 256 MiB
#    buffer, prints "segment <name> base <address> size <bytes>".
# 3. transfer_bench --mode initiator: WRITE for S seconds with 1 MiB blocks
#    (4 threads x batch 16), then every written block is read back and
#    checked; then READ for S seconds of the same blocks, each byte checked
#    against what the WRITE run put there.
# 4. Prints a short summary: what moved, how fast, what was verified, and
#    "main job: OK".
# The target is always stopped at exit. Exits non-zero on any failure, after
# showing the logs of the step that failed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
duration=5
while [ $# -gt 0 ]; do
  case $1 in
    --duration) duration=$2; shift 2 ;;
    --duration=*) duration=${1#*=}; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "main-job.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/te-main-job.XXXXXX")
target_pid=""
cleanup() {
  local rc=$?
  set +e
  if [ -n "$target_pid" ] && kill -0 "$target_pid" 2>/dev/null; then
    kill -TERM "$target_pid"
    for _ in $(seq 50); do kill -0 "$target_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$target_pid" 2>/dev/null
    wait "$target_pid" 2>/dev/null
  fi
  if [ "$rc" -ne 0 ]; then
    echo "main job: FAILED (exit $rc)" >&2
    for f in "$tmp"/*; do [ -s "$f" ] && { echo "----- $(basename "$f")"; tail -n 40 "$f"; }; done >&2
  fi
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# step LOG DESCRIPTION COMMAND...: runs COMMAND with its output in $tmp/LOG.log.
step() {
  local log=$tmp/$1.log what=$2 start=$SECONDS
  shift 2
  printf '%s ... ' "$what"
  if "$@" >"$log" 2>&1; then
    echo "done ($((SECONDS - start)) s)"
    rm -f "$log"
  else
    echo "FAILED"
    return 1
  fi
}

build=${BUILD_DIR:-"$root/build"}
step setup "installing packages (scripts/setup.sh)" scripts/setup.sh
step configure "configuring (cmake, release)" cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release
step build "building (cargo and the C programs; minutes on a first run)" \
  cmake --build "$build" -j"${JOBS:-2}" --target transfer_bench
bench=$build/transfer_bench

printf 'starting the target (P2PHANDSHAKE on 127.0.0.1, 256 MiB buffer) ... '
"$bench" --mode target --metadata_server P2PHANDSHAKE --local_server_name 127.0.0.1 \
  --protocol tcp --buffer_size $((256 << 20)) --verify >"$tmp/target.out" 2>"$tmp/target.err" &
target_pid=$!
line=""
for _ in $(seq 600); do # up to 60 s
  line=$(grep -m1 '^segment ' "$tmp/target.out" 2>/dev/null || true)
  [ -n "$line" ] && break
  kill -0 "$target_pid" 2>/dev/null || { echo "FAILED: the target exited before it was ready"; exit 1; }
  sleep 0.1
done
[ -n "$line" ] || { echo "FAILED: the target printed no segment line in 60 s"; exit 1; }
read -r _ seg _ base _ size <<<"$line"
echo "segment $seg"

threads=4 batch=16 block=$((1 << 20))
common=(--mode initiator --protocol tcp --metadata_server P2PHANDSHAKE
  --local_server_name 127.0.0.1 --segment_id "$seg" --target_base "$base"
  --target_size "$size" --buffer_size $((64 << 20)) --block_size "$block" --batch_size "$batch"
  --threads "$threads" --duration "$duration" --report_unit GB --verify --verify_seed 7)
summary=()
for op in write read; do
  printf '%s for %s s (1 MiB blocks, %d threads x batch %d) ... ' "${op^^}" "$duration" "$threads" "$batch"
  timeout -k 5 $((duration * 2 + 120)) "$bench" "${common[@]}" --operation "$op" \
    >"$tmp/$op.out" 2>"$tmp/$op.err" || { echo "FAILED"; exit 1; }
  result=$(grep '^Test completed' "$tmp/$op.out") || { echo "FAILED: no result line"; exit 1; }
  grep -q '^verify: OK' "$tmp/$op.out" || { echo "FAILED: not verified"; exit 1; }
  # Test completed: duration D, batch count N, throughput R GB/s
  read -r secs batches rate < <(sed -n \
    's/^Test completed: duration \([0-9.]*\), batch count \([0-9]*\), throughput \([0-9.]*\) GB\/s$/\1 \2 \3/p' \
    <<<"$result")
  gib=$(awk -v n="$batches" -v b="$batch" -v s="$block" 'BEGIN { printf "%.2f", n * b * s / 2^30 }')
  echo "$rate GB/s"
  summary+=("$(printf '%-5s %8s GiB in %5s s: %6s GB/s' "${op^^}" "$gib" "$secs" "$rate")")
  rm -f "$tmp/$op.err"
done
kill -0 "$target_pid" 2>/dev/null || { echo "the target died" >&2; exit 1; }

checked=$((threads * batch))
echo
echo "moved (two processes over TCP on loopback, GB = 1e9 bytes):"
printf '  %s\n' "${summary[@]}"
echo "verified: after the WRITE run every written block ($checked x 1 MiB) was read back"
echo "  and matched; after the READ run every block of each thread's last batch matched"
echo "  what the WRITE run had put there"
echo "main job: OK"
