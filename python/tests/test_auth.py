"""Peer authentication from Python: the package passes MC_TE_AUTH_KEY_FILE
through, `initialize_ext` takes the key file, and a Mooncake peer (which
speaks no authentication) is refused by an engine with a key, with a log
line naming it, while no byte of either side's memory moves."""

import os

from checks import exchange
from conftest import engine_name

from transfer_engine import TransferEngine

N = 1 << 20


def key_file(tmp_path, name: str = "cluster.key") -> str:
    path = tmp_path / name
    path.write_text(os.urandom(32).hex() + "\n")
    path.chmod(0o600)
    return str(path)


def test_initialize_ext_takes_the_key_file(tmp_path, spawn_peer):
    key = key_file(tmp_path)
    peer = spawn_peer("ours", "P2PHANDSHAKE", env={"MC_TE_AUTH_KEY_FILE": key})
    local = TransferEngine()
    name = engine_name("P2PHANDSHAKE", "ours")
    assert local.initialize_ext(name, "P2PHANDSHAKE", "tcp", "", None, key) == 0
    try:
        exchange(local, peer)
    finally:
        local.close()


def test_engines_with_different_keys_move_nothing(tmp_path, spawn_peer):
    a = spawn_peer("ours", "P2PHANDSHAKE", env={"MC_TE_AUTH_KEY_FILE": key_file(tmp_path, "a")})
    b = spawn_peer("ours", "P2PHANDSHAKE", env={"MC_TE_AUTH_KEY_FILE": key_file(tmp_path, "b")})
    a.call("fill", seed=1)
    b.call("fill", seed=2)
    before = b.sha(0, N)
    assert a.call("write", target=b.name, off=0, remote=b.addr, len=N)["rc"] != 0
    assert b.sha(0, N) == before


def test_a_mooncake_peer_is_refused_with_a_log_line(tmp_path, spawn_peer, capfd):
    ours = spawn_peer("ours", "P2PHANDSHAKE", env={"MC_TE_AUTH_KEY_FILE": key_file(tmp_path)})
    moon = spawn_peer("mooncake", "P2PHANDSHAKE")
    ours.call("fill", seed=3)
    moon.call("fill", seed=4)
    ours_before, moon_before = ours.sha(0, N), moon.sha(0, N)
    assert moon.call("write", target=ours.name, off=0, remote=ours.addr, len=N)["rc"] != 0
    assert moon.call("read", target=ours.name, off=0, remote=ours.addr, len=N)["rc"] != 0
    assert ours.call("write", target=moon.name, off=0, remote=moon.addr, len=N)["rc"] != 0
    assert ours.sha(0, N) == ours_before
    assert moon.sha(0, N) == moon_before
    ours.quit()
    err = capfd.readouterr().err
    assert "refused: no authentication" in err, err[-4000:]
    assert "127.0.0.1:" in err.split("refused: no authentication")[0].splitlines()[-1]
