#!/usr/bin/env bash
# Runs every test: Rust unit and integration tests (default features and
# --no-default-features), then the C tests under ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

export RUST_BACKTRACE=1
# The store tests must fail, not skip, when etcd or redis is missing.
export TE_REQUIRE_SERVERS=1
cargo fmt --check
cargo clippy --all-targets --locked -- -D warnings
cargo test --locked
cargo test --locked --no-default-features

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
(cd build && ctest --output-on-failure --timeout 600)
