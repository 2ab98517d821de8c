#!/bin/sh
# bench-cancel.sh [cancel_bench args...]
#
# Builds the library and the C programs with CMake in release mode (in
# build/, or $BUILD_DIR), starts a transfer_bench target on 127.0.0.1
# (P2P handshake, 256 MiB buffer), and runs c-examples/cancel_bench
# against it over TCP, then over shared memory: 64 MiB READs and WRITEs
# cancelled at random points, the cancel's p50, p99 and max.
# Example: scripts/bench-cancel.sh --rounds 100
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-"$root/build"}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"${JOBS:-2}" --target transfer_bench cancel_bench >/dev/null
out=$(mktemp)
"$build/transfer_bench" --mode target --protocol tcp,shm --buffer_size $((256 << 20)) >"$out" 2>&1 &
target=$!
trap 'kill $target 2>/dev/null; rm -f "$out"' EXIT
i=0
until grep -q '^segment ' "$out"; do
  i=$((i + 1))
  [ $i -lt 100 ] || { cat "$out"; exit 1; }
  sleep 0.1
done
segment=$(sed -n 's/^segment \([^ ]*\) .*/\1/p' "$out")
for p in tcp shm; do
  "$build/cancel_bench" --segment_id "$segment" --protocol "$p" "$@"
done
