#!/usr/bin/env bash
# Builds the Python package as a manylinux wheel that installs without a
# Rust toolchain: maturin with zig as the linker, for glibc 2.28
# (manylinux_2_28: RHEL 8, Debian 10, Ubuntu 18.10 and later). The wheel
# has no native dependency but glibc: libibverbs is loaded at run time
# (RDMA where the host has it), and topology is read from sysfs (hwloc is
# left out, as it would have to be bundled). auditwheel checks the result.
#
#   scripts/build-wheel.sh [OUT_DIR]     (default build/dist)
#
# Prints the wheel's path on its last line.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${1:-$root/build/dist}
python=${PYTHON:-python3}
# The tools, pinned; their own virtualenv (reused between runs).
tools=${TE_WHEEL_TOOLS:-$root/build/wheel-tools}
maturin_req="maturin==1.16.0"
zig_req="ziglang==0.15.2"
auditwheel_req="auditwheel==6.8.2"
if [ ! -x "$tools/bin/maturin" ] || ! "$tools/bin/python" -m ziglang version >/dev/null 2>&1 ||
  [ ! -x "$tools/bin/auditwheel" ]; then
  rm -rf "$tools"
  "$python" -m venv "$tools"
  "$tools/bin/python" -m pip install --quiet "$maturin_req" "$zig_req" "$auditwheel_req"
fi
policy=manylinux_2_28
# rdma-sys generates its bindings from the host's verbs headers with
# libclang; under zig's target settings clang no longer finds its own
# builtin headers nor the host's multiarch ones: name them (the newest
# LLVM's, which is the libclang bindgen loads).
resource=$(ls -d /usr/lib/llvm-*/lib/clang/*/include 2>/dev/null | sort -V | tail -1)
if [ -z "$resource" ]; then
  echo "build-wheel.sh: no libclang headers under /usr/lib/llvm-* (scripts/setup.sh installs libclang-dev)" >&2
  exit 1
fi
export BINDGEN_EXTRA_CLANG_ARGS="-I$resource -I/usr/include/$(gcc -print-multiarch)${BINDGEN_EXTRA_CLANG_ARGS:+ $BINDGEN_EXTRA_CLANG_ARGS}"
rm -rf "$out"
mkdir -p "$out"
echo "== wheel: maturin build --zig --compatibility $policy (features: rdma)" >&2
PATH="$tools/bin:$PATH" "$tools/bin/maturin" build --release --locked --zig --compatibility "$policy" \
  --no-default-features --features rdma \
  --manifest-path python/Cargo.toml --interpreter "$python" --out "$out" >&2
wheel=$(ls "$out"/transfer_engine-*.whl)
echo "== wheel: auditwheel show $(basename "$wheel")" >&2
report=$("$tools/bin/auditwheel" show "$wheel")
echo "$report" >&2
if ! grep -q "is consistent with the following platform tag: \"${policy}_x86_64\"" <<<"$report" &&
  ! grep -q "\"${policy}_x86_64\"" <<<"$report"; then
  echo "build-wheel.sh: the wheel is not $policy (auditwheel above)" >&2
  exit 1
fi
echo "$wheel"
