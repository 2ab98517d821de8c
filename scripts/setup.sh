#!/usr/bin/env bash
# Installs what building and testing transfer-engine needs on Debian 12:
# the C libraries behind the rdma and hwloc features (with hwloc's plugins,
# as most machines have them, so the tests see the libpciaccess component
# the engine must leave out), CMake, pkg-config and binutils (the install
# test), the servers and tools the tests start (etcd, redis, prometheus, iperf3,
# iproute2, strace), and the libraries Mooncake's Python wheel (the interop peer of
# the Python tests) loads besides libibverbs (libnuma, libcurl).
# Idempotent. It never stops, starts or
# reconfigures a service: the tests run private servers on free ports, so
# a system etcd or redis (which Debian's packages start) can keep running.
set -euo pipefail

packages=(
  build-essential binutils pkg-config cmake libclang-dev
  libibverbs-dev librdmacm-dev libhwloc-dev libhwloc-plugins libudev-dev
  etcd-server redis-server iperf3 iproute2 procps strace prometheus
  libnuma1 libcurl4
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
command -v cargo >/dev/null || { echo "cargo is required (https://rustup.rs)"; exit 1; }
