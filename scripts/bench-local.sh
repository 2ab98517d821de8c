#!/bin/sh
# bench-local.sh [local_bench args...]
#
# Builds the library and the C programs with CMake in release mode (in
# build/, or $BUILD_DIR) and runs c-examples/local_bench:
# local transfers through the C API beside memcpy, medians of 5 runs.
# Example: scripts/bench-local.sh --duration 2 --runs 7
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-"$root/build"}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"${JOBS:-2}" --target local_bench
exec "$build/local_bench" "$@"
