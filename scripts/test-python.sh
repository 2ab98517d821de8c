#!/usr/bin/env bash
# Tests the Python package: checks the binding crate (fmt, clippy), builds
# the manylinux wheel (scripts/build-wheel.sh: no Rust needed to install
# it, no native dependency but glibc) and the wheel of the
# `mooncake.engine` alias (./python/mooncake-alias), installs them with no
# Rust toolchain on PATH into a clean virtualenv with pytest, numpy and
# Mooncake's own wheel (the interop peer) and into a second one without
# Mooncake (the alias tests' TE_ALIAS_PYTHON), runs python/tests, and
# checks that `pip install .` from the repository root builds and installs
# the package from source too.
#
#   scripts/test-python.sh [pytest arguments]
#
# Writes "passed failed skipped" to $TE_RESULTS_DIR/python.counts
# (TE_RESULTS_DIR defaults to build/test-results). The virtualenv is
# build/pyvenv (TE_PY_VENV), recreated each run; the interpreter is
# $PYTHON (python3). With CI=true a missing prerequisite (a server binary,
# Mooncake's wheel) fails its tests instead of skipping them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

results=${TE_RESULTS_DIR:-$root/build/test-results}
mkdir -p "$results"
counts=$results/python.counts
rm -f "$counts"
# A run that stops before pytest reports counts of one failure.
trap '[ -s "$counts" ] || echo "0 1 0" > "$counts"' EXIT

python=${PYTHON:-python3}
venv=${TE_PY_VENV:-$root/build/pyvenv}
# Versions the suite is known to work with; Mooncake's wheel is the peer
# of the interop tests.
pytest_req="pytest==9.2.0"
numpy_req="numpy==2.4.6"
prometheus_req="prometheus_client==0.26.0"
mooncake_req="mooncake-transfer-engine-non-cuda==0.3.13.post1"

export RUST_BACKTRACE=1
echo "== python: binding crate checks (at ${SECONDS} s)"
# The binding crate's builds share the main crate's target directory (and
# with it the dependencies the other suites built) instead of its own.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
cargo fmt --check --manifest-path python/Cargo.toml
# --locked: python/Cargo.lock must follow the main crate (regenerate it with
# `cargo update --manifest-path python/Cargo.toml -p transfer-engine`).
cargo clippy --locked --manifest-path python/Cargo.toml --all-targets -- -D warnings
# Release builds with the host's compiler go to the C build's target
# directory (CMake's TE_CARGO_TARGET_DIR), where scripts/suites/ctest.sh
# has built the crate and its dependencies already in a full run. The
# wheel is built with zig, whose compiler settings would rebuild them.
release_target=$(realpath -m "${BUILD_DIR:-build}")/cargo
# The HTTP metadata server the tests start.
CARGO_TARGET_DIR=$release_target cargo build --release --locked --bin transfer-engine-metadata-server
export TE_METADATA_SERVER_BIN=$release_target/release/transfer-engine-metadata-server

echo "== python: the manylinux wheel (scripts/build-wheel.sh) (at ${SECONDS} s)"
wheels=$root/build/wheels
rm -rf "$wheels"
PYTHON=$python scripts/build-wheel.sh "$wheels"
echo "== python: the alias wheel (./python/mooncake-alias) (at ${SECONDS} s)"
"$python" -m pip wheel --quiet --no-deps --wheel-dir "$wheels" ./python/mooncake-alias
# Installed as a user without Rust would: no cargo or rustc on PATH.
no_rust_path=$(tr ':' '\n' <<<"$PATH" | grep -v -e '/\.cargo/bin' -e '/\.rustup' | paste -sd:)
if PATH=$no_rust_path command -v cargo >/dev/null || PATH=$no_rust_path command -v rustc >/dev/null; then
  echo "test-python.sh: a Rust toolchain is still on PATH without ~/.cargo/bin" >&2
  exit 1
fi
echo "== python: clean virtualenv $venv ($("$python" --version)), wheels installed without Rust (at ${SECONDS} s)"
rm -rf "$venv"
"$python" -m venv "$venv"
PATH=$no_rust_path "$venv/bin/python" -m pip install --only-binary :all: "$wheels"/*.whl
"$venv/bin/python" -m pip install --quiet "$pytest_req" "$numpy_req" "$prometheus_req"
# A second environment without Mooncake, for the tests of the
# `mooncake.engine` alias where no real Mooncake is installed.
alias_venv=$venv-alias
rm -rf "$alias_venv"
"$python" -m venv "$alias_venv"
PATH=$no_rust_path "$alias_venv/bin/python" -m pip install --quiet --only-binary :all: \
  "$wheels"/*.whl "$numpy_req"
export TE_ALIAS_PYTHON=$alias_venv/bin/python
if ! "$venv/bin/python" -m pip install --quiet "$mooncake_req"; then
  if [ "${CI:-}" = "true" ]; then
    echo "test-python.sh: cannot install $mooncake_req (needed for the interop tests)" >&2
    exit 1
  fi
  echo "test-python.sh: $mooncake_req not installed; its tests will be skipped" >&2
fi
(cd /tmp && "$venv/bin/python" -c "from transfer_engine import TransferEngine; print('import ok:', TransferEngine)")

echo "== python: pytest (at ${SECONDS} s)"
junit=$results/python-junit.xml
set +e
"$venv/bin/pytest" python/tests -ra --junitxml="$junit" "$@"
status=$?
set -e
"$venv/bin/python" - "$junit" "$counts" <<'EOF'
import sys
import xml.etree.ElementTree as ET

root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
total = sum(int(s.get("tests", 0)) for s in suites)
failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
skipped = sum(int(s.get("skipped", 0)) for s in suites)
with open(sys.argv[2], "w") as f:
    f.write(f"{total - failed - skipped} {failed} {skipped}\n")
EOF
echo "python: $(cat "$counts") (passed failed skipped)"
# The repository root installs the same package (pyproject.toml there).
echo "== python: pip install . (repository root) (at ${SECONDS} s)"
CARGO_TARGET_DIR=$release_target "$venv/bin/python" -m pip install --quiet --no-deps --force-reinstall .
(cd /tmp && "$venv/bin/python" -c "from transfer_engine import TransferEngine; print('import ok:', TransferEngine)")
exit "$status"
