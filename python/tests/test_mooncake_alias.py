"""The ``mooncake.engine`` alias (python/mooncake-alias): on only when
``TRANSFER_ENGINE_AS_MOONCAKE`` asks, yielding to a real Mooncake unless
forced, and running the clients' call sequences (``alias_clients.py``).

The tests run interpreters in child processes: this suite's environment
(which has Mooncake's wheel and the alias installed) and
``TE_ALIAS_PYTHON``, an environment with this engine and the alias but no
Mooncake (scripts/test-python.sh makes it).
"""

import os
import pathlib
import subprocess
import sys

import pytest

from conftest import need

HERE = pathlib.Path(__file__).resolve().parent
VAR = "TRANSFER_ENGINE_AS_MOONCAKE"


def alias_python() -> str:
    """The interpreter of the environment without Mooncake."""
    path = os.environ.get("TE_ALIAS_PYTHON", "")
    need(bool(path) and os.path.exists(path), "TE_ALIAS_PYTHON (scripts/test-python.sh) is not set")
    return path


def run(python: str, code: str, value=None, pythonpath=None, timeout=120, cwd="/"):
    """Runs `code` under `python` with the alias variable set to `value`,
    in directory `cwd` (first on `sys.path`)."""
    env = {k: v for k, v in os.environ.items() if k not in (VAR, "PYTHONPATH")}
    if value is not None:
        env[VAR] = value
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(
        [python, "-c", code], env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


WHICH = (
    "import mooncake.engine as m, transfer_engine as t\n"
    "print('ours' if m.TransferEngine is t.TransferEngine else 'theirs')"
)


def test_without_the_variable_mooncake_is_not_importable():
    for value in (None, "", "0"):
        r = run(alias_python(), "import mooncake", value)
        assert r.returncode != 0 and "No module named 'mooncake'" in r.stderr, (value, r.stderr)


def test_with_the_variable_mooncake_engine_is_this_engine():
    code = (
        "import mooncake, mooncake.engine as m, transfer_engine as t\n"
        "assert m.TransferEngine is t.TransferEngine\n"
        "assert m.TransferOpcode.Write == 1 and m.Read == 0 and m.Write == 1\n"
        "assert m.SUPPORT_CUDA is t.SUPPORT_CUDA and m.TransferNotify is t.TransferNotify\n"
        "from mooncake.engine import TransferEngine, TransferOpcode\n"
        "import importlib.util\n"
        "assert importlib.util.find_spec('mooncake.store') is None\n"
        "print('alias ok')\n"
    )
    r = run(alias_python(), code, "1")
    assert r.returncode == 0 and "alias ok" in r.stdout, r.stderr


def test_clients_call_sequences_run_unchanged_with_the_alias():
    r = subprocess.run(
        [alias_python(), str(HERE / "alias_clients.py")],
        env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, VAR: "1"},
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    for scenario in ("sglang", "vllm", "lmcache", "asynchronous"):
        assert f"OK {scenario}" in r.stdout, r.stdout + r.stderr


def fake_mooncake(tmp_path: pathlib.Path) -> pathlib.Path:
    pkg = tmp_path / "mooncake"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "engine.py").write_text("class TransferEngine:\n    pass\n")
    return tmp_path


def test_a_mooncake_on_the_path_wins_with_one_warning(tmp_path):
    r = run(alias_python(), WHICH, "1", fake_mooncake(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "theirs", r.stdout
    assert r.stderr.count("Mooncake is installed") == 1, r.stderr


def test_a_directory_named_mooncake_is_not_a_mooncake(tmp_path):
    # An empty directory in the working directory (a namespace package to
    # Python), and a package without `engine` (a folder of configuration).
    (tmp_path / "mooncake").mkdir()
    config = tmp_path / "config"
    (config / "mooncake").mkdir(parents=True)
    (config / "mooncake" / "__init__.py").write_text("")
    (config / "mooncake" / "settings.yaml").write_text("a: 1\n")
    for cwd, pythonpath in ((tmp_path, None), ("/", config)):
        r = run(alias_python(), WHICH, "1", pythonpath, cwd=cwd)
        assert r.returncode == 0, (cwd, r.stderr)
        assert r.stdout.strip() == "ours", (cwd, r.stdout)
        assert "Mooncake is installed" not in r.stderr, r.stderr


def test_force_wins_over_a_mooncake_on_the_path(tmp_path):
    r = run(alias_python(), WHICH, "force", fake_mooncake(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ours", r.stdout
    assert "Mooncake is installed" not in r.stderr


def test_the_installed_mooncake_wheel_wins_with_one_warning():
    # This suite's own environment has Mooncake's wheel and the alias.
    import conftest

    conftest.mooncake_engine()
    r = run(sys.executable, WHICH, "1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "theirs", r.stdout
    assert r.stderr.count("Mooncake is installed") == 1, r.stderr
    unset = run(sys.executable, WHICH)
    assert unset.returncode == 0 and unset.stdout == r.stdout, unset.stderr
    assert "Mooncake is installed" not in unset.stderr


def test_vllm_plugin_entry_point_installs_the_alias_only_on_request():
    code = (
        "from importlib.metadata import entry_points\n"
        "(ep,) = [e for e in entry_points(group='vllm.general_plugins')"
        " if e.name == 'transfer_engine_mooncake_alias']\n"
        "import os, sys\n"
        "installed = ep.load()()\n"
        "print(installed, any(type(f).__name__ == 'MooncakeAlias' for f in sys.meta_path))\n"
    )
    python = alias_python()
    assert run(python, code).stdout.split() == ["False", "False"]
    assert run(python, code, "1").stdout.split() == ["True", "True"]


def test_the_alias_installs_no_mooncake_files():
    code = (
        "from importlib.metadata import distribution\n"
        "files = [str(f) for f in distribution('transfer-engine-mooncake-alias').files]\n"
        "assert files and not [f for f in files if f.startswith('mooncake')], files\n"
        "assert 'transfer_engine_mooncake_alias.pth' in files, files\n"
        "print('ok')\n"
    )
    r = run(alias_python(), code)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


@pytest.mark.parametrize("kind", ["numpy.uint64", "numpy.int64", "0-d array"])
def test_integer_like_addresses_are_addresses(engine, kind):
    """numpy integers and 0-d integer arrays are addresses and lengths
    wherever a Python int is (vLLM hands data_ptr()s through numpy)."""
    import numpy as np

    as_kind = {
        "numpy.uint64": np.uint64,
        "numpy.int64": np.int64,
        "0-d array": lambda v: np.array(v, dtype=np.uint64),
    }[kind]
    src = np.frombuffer(os.urandom(4096), np.uint8).copy()
    dst = np.zeros(4096, np.uint8)
    back = np.zeros(4096, np.uint8)
    n = as_kind(4096)
    for a in (src, dst, back):
        assert engine.register_memory(as_kind(a.ctypes.data), n) == 0
    session = engine.local_name
    assert engine.transfer_sync_write(session, as_kind(src.ctypes.data), as_kind(dst.ctypes.data), n) == 0
    assert engine.transfer_sync_read(session, as_kind(back.ctypes.data), as_kind(dst.ctypes.data), n) == 0
    assert bytes(dst) == bytes(src) and bytes(back) == bytes(src)
    for a in (src, dst, back):
        assert engine.unregister_memory(as_kind(a.ctypes.data)) == 0
