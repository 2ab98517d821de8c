#!/usr/bin/env bash
# Installs what the RDMA VM suite needs on Debian 12 (idempotent; root or
# sudo): the packages that boot the host's kernel under qemu with soft-RoCE
# and run perftest, and a virtualenv with Mooncake's transfer engine from
# PyPI (the interoperability peer), in $TE_MOONCAKE_VENV
# (/var/tmp/te-mooncake-venv). The guest sees the host's filesystem, so
# everything installed here is there too.
set -euo pipefail
packages=(
  qemu-system-x86 linux-image-amd64 busybox-static xz-utils iproute2 kmod
  rdma-core ibverbs-providers ibverbs-utils libibverbs-dev librdmacm-dev perftest
  python3 python3-venv
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  for attempt in 1 2 3; do
    if $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
      break
    fi
    [ "$attempt" -lt 3 ] || exit 1
    echo "apt-get failed (dpkg lock busy?); retrying in 10 s" >&2
    sleep 10
  done
fi

venv=${TE_MOONCAKE_VENV:-/var/tmp/te-mooncake-venv}
wheel=${TE_MOONCAKE_WHEEL:-mooncake-transfer-engine-non-cuda==0.3.13.post1}
if ! "$venv/bin/python" -c 'import mooncake.engine' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "$wheel"
fi
echo "rdma-vm setup: packages present, Mooncake in $venv"
