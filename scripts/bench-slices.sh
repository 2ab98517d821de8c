#!/usr/bin/env bash
# bench-slices.sh: the engine's own cost per slice (benches/slice_path.rs).
#
#   scripts/bench-slices.sh [--runs N] [--seconds S] [--nics N] [--batch N] [--slices N]
#
# Builds and runs the slice_path benchmark (release): the real slice
# scheduler (route lookup, rail choice, load accounting, the task's slice
# counters, the completion path) over a carrier that completes every slice
# inline as it is posted, 8 local x 8 peer NICs (64 rails) by default, on 1
# and on 2 threads, each thread its own batches to the same peer segment.
# Prints the median of N runs (5) in wall-clock slices/s and in CPU ns per
# slice (on a busy machine the wall clock includes waits for a core; CPU
# time does not), the NIC bandwidth one thread drives at 64 KiB and 4 KiB
# slices, the 2-thread / 1-thread ratio, and the projection to 8x400G per
# host. Goals: >= 2M slices/s on one thread, >= 1.8x that on two. A
# benchmark: its verdict is the table. `cargo test --features
# bench-internals` runs it as a smoke check (the feature builds its harness
# into the library, which ships without it).
set -euo pipefail
cd "$(dirname "$0")/.."
case ${1:-} in
  -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
esac
exec cargo bench --locked --features bench-internals --bench slice_path -- "$@"
