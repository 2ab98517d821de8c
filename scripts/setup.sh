#!/usr/bin/env bash
# Installs what building and testing transfer-engine needs on Debian 12:
# the C libraries behind the rdma and hwloc features, CMake, and the servers
# and tools the tests start (etcd, redis, iperf3, iproute2). Idempotent.
set -euo pipefail

packages=(
  build-essential pkg-config cmake libclang-dev
  libibverbs-dev librdmacm-dev libhwloc-dev libudev-dev
  etcd-server redis-server iperf3 iproute2 procps
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The Debian packages start their own daemons; the tests start private
# instances on free ports, so the system ones are not needed.
for svc in etcd redis-server; do
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$svc" 2>/dev/null; then
    systemctl stop "$svc" || true
  fi
done
command -v cargo >/dev/null || { echo "cargo is required (https://rustup.rs)"; exit 1; }
