#!/usr/bin/env bash
# main-job.sh: the project's main job. Two processes on loopback move data
# through the C API with P2PHANDSHAKE (no metadata server), verify it, and
# print the throughput.
#
#   scripts/main-job.sh [--duration S]      (default 5 s per direction)
#
# 1. scripts/setup.sh, then a release build with CMake into build/ (or $BUILD_DIR).
# 2. transfer_bench --mode target in the background: registers a 256 MiB
#    buffer, prints "segment <name> base <address> size <bytes>".
# 3. transfer_bench --mode initiator: WRITE for S seconds with 1 MiB blocks
#    (4 threads x batch 16), then every written block is read back and
#    checked; then READ for S seconds of the same blocks, each byte checked
#    against what the WRITE run put there.
# 4. Prints both "Test completed: ..." lines and "main job: OK".
# The target is always stopped at exit. Exits non-zero on any failure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
duration=5
while [ $# -gt 0 ]; do
  case $1 in
    --duration) duration=$2; shift 2 ;;
    --duration=*) duration=${1#*=}; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "main-job.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

scripts/setup.sh
build=${BUILD_DIR:-"$root/build"}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"${JOBS:-2}"
bench=$build/transfer_bench

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
    for f in "$tmp"/*; do [ -s "$f" ] && { echo "----- $(basename "$f")"; tail -n 30 "$f"; }; done >&2
  fi
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "== target (P2PHANDSHAKE on 127.0.0.1)"
"$bench" --mode target --metadata_server P2PHANDSHAKE --local_server_name 127.0.0.1 \
  --protocol tcp --buffer_size $((256 << 20)) --verify >"$tmp/target.out" 2>"$tmp/target.err" &
target_pid=$!
line=""
for _ in $(seq 600); do # up to 60 s
  line=$(grep -m1 '^segment ' "$tmp/target.out" || true)
  [ -n "$line" ] && break
  kill -0 "$target_pid" 2>/dev/null || { echo "the target exited before it was ready" >&2; exit 1; }
  sleep 0.1
done
[ -n "$line" ] || { echo "the target printed no segment line in 60 s" >&2; exit 1; }
read -r _ seg _ base _ size <<<"$line"
echo "$line"

common=(--mode initiator --protocol tcp --metadata_server P2PHANDSHAKE
  --local_server_name 127.0.0.1 --segment_id "$seg" --target_base "$base"
  --target_size "$size" --buffer_size $((64 << 20)) --block_size $((1 << 20)) --batch_size 16 --threads 4
  --duration "$duration" --report_unit GB --verify --verify_seed 7)
results=()
for op in write read; do
  echo "== initiator: ${op^^} for ${duration} s, 1 MiB blocks, verified"
  timeout -k 5 $((duration * 2 + 120)) "$bench" "${common[@]}" --operation "$op" 2>"$tmp/$op.err" | tee "$tmp/$op.out"
  results+=("${op^^}: $(grep '^Test completed' "$tmp/$op.out")")
  grep -q '^verify: OK' "$tmp/$op.out"
done

echo "== results"
printf '%s\n' "${results[@]}"
kill -0 "$target_pid" 2>/dev/null || { echo "the target died" >&2; exit 1; }
echo "main job: OK"
