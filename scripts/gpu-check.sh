#!/usr/bin/env bash
# gpu-check.sh: the GPU memory checks on a real GPU. Where nvidia-smi finds
# a device, builds ctests/gpu_memory.c (the program ctest runs against the
# CUDA driver test double) and runs it against the machine's real
# libcuda.so.1 and GPU 0: device memory from cuMemAlloc, registered with
# two engines, moves over TCP (staged through host buffers) and in copies
# within the process through the driver's copies, every byte checked, and
# is never copied with the CPU (a CPU copy of device memory would crash the
# process). Elsewhere it
# says that it was skipped and exits 0: nothing is claimed for a GPU then.
#
#   scripts/gpu-check.sh [DIR]
#
# DIR holds a libtransfer_engine.so built elsewhere (default: a release
# build here).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: SKIPPED: nvidia-smi finds no NVIDIA GPU here; nothing was tested on a GPU"
  exit 0
fi
nvidia-smi -L
lib=${1:-}
if [ -z "$lib" ]; then
  cargo build --release --lib --locked
  lib=target/release
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
ln -s "$(realpath "$lib/libtransfer_engine.so")" "$out/libtransfer_engine.so"
ln -s "$(realpath "$lib/libtransfer_engine.so")" "$out/libtransfer_engine.so.0"
cc -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Iinclude -Ictests ctests/gpu_memory.c \
  -o "$out/gpu_memory" -L"$out" -ltransfer_engine -ldl
echo "gpu-check: ctests/gpu_memory.c against the real CUDA driver"
LD_LIBRARY_PATH="$out${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$out/gpu_memory"
echo "gpu-check: passed on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
