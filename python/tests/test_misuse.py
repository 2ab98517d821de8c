"""Careless callers: lengths past the end of memory and unmapped addresses
given to the bytes helpers raise before anything is allocated; an engine
not initialized, closed, or inherited by a forked child raises
`RuntimeError` on every call, and a child that exits or closes it exits
cleanly without stalling its parent; `close()` while another thread is
inside a transfer ends that transfer and stops serving peers before it
returns."""

import ctypes
import json
import mmap
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest

from transfer_engine import TransferEngine

CHILD = pathlib.Path(__file__).resolve().with_name("fork_child.py")


def unmapped_page() -> int:
    """The address of a page that was mapped and no longer is."""
    m = mmap.mmap(-1, mmap.PAGESIZE)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    # The ctypes view must go before the mapping can close.
    del m
    return addr


def test_bytes_helpers_refuse_lengths_past_the_end_of_memory(engine):
    buf = ctypes.create_string_buffer(64)
    base = ctypes.addressof(buf)
    for n in (2**40, 2**63, 2**64 - 1):
        with pytest.raises(ValueError):
            engine.read_bytes_from_buffer(base, n)
    with pytest.raises(OverflowError):
        engine.read_bytes_from_buffer(base, 2**64)
    assert engine.read_bytes_from_buffer(base, 64) == bytes(64)
    assert engine.write_bytes_to_buffer(base, b"x" * 64, 64) == 0
    assert buf.raw == b"x" * 64


def test_bytes_helpers_refuse_unmapped_memory(engine):
    page = unmapped_page()
    with pytest.raises(ValueError, match="not mapped"):
        engine.read_bytes_from_buffer(page, 16)
    with pytest.raises(ValueError, match="not mapped"):
        engine.write_bytes_to_buffer(page, b"y" * 16, 16)


def test_bytes_helpers_need_an_initialized_engine():
    buf = ctypes.create_string_buffer(16)
    base = ctypes.addressof(buf)
    e = TransferEngine()
    for _ in range(2):
        with pytest.raises(RuntimeError, match="not initialized"):
            e.read_bytes_from_buffer(base, 16)
        with pytest.raises(RuntimeError, match="not initialized"):
            e.write_bytes_to_buffer(base, b"z" * 16, 16)
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        assert e.read_bytes_from_buffer(base, 16) == bytes(16)
        e.close()


def test_a_forked_child_cannot_use_the_engine_and_never_stalls_its_parent(spawn_peer):
    peer = spawn_peer("ours", "P2PHANDSHAKE")
    r = subprocess.run(
        [sys.executable, str(CHILD), peer.name, str(peer.addr)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    cases = {c["case"]: c for c in map(json.loads, r.stdout.splitlines())}
    assert set(cases) == {"exit", "close", "transfer", "bytes"}, r.stdout
    for case, c in cases.items():
        assert c["exit"] == 0, (case, c, r.stderr)
        assert c["error"] == ("RuntimeError" if case in ("transfer", "bytes") else ""), c
        assert c["rc"] == 0 and c["after"] < 2.0, (case, c)


def test_close_ends_other_threads_transfers_and_stops_serving_peers(spawn_peer):
    stopped = spawn_peer("ours", "P2PHANDSHAKE")
    writer = spawn_peer("ours", "P2PHANDSHAKE")
    e = TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    size = 1 << 20
    buf = ctypes.create_string_buffer(size)
    base = ctypes.addressof(buf)
    src = ctypes.create_string_buffer(size)
    assert e.register_memory(base, size) == 0
    assert e.register_memory(ctypes.addressof(src), size) == 0
    me = f"127.0.0.1:{e.get_rpc_port()}"
    writer.call("fill", seed=1)
    assert writer.call("write", target=me, off=0, remote=base, len=size)["rc"] == 0
    stopped.signal(signal.SIGSTOP)
    result = {}

    def stuck():
        result["rc"] = e.transfer_sync_write(stopped.name, ctypes.addressof(src), stopped.addr, size)
        result["at"] = time.monotonic()

    t = threading.Thread(target=stuck)
    t.start()
    done = threading.Event()
    rounds = []

    def keep_writing():
        seed = 2
        while not done.is_set():
            writer.call("fill", seed=seed)
            rounds.append(writer.call("write", target=me, off=0, remote=base, len=size)["rc"])
            seed += 1

    w = threading.Thread(target=keep_writing)
    w.start()
    time.sleep(0.5)
    assert t.is_alive(), "the transfer to the stopped peer ended on its own"
    writes_before = len(rounds)
    t0 = time.monotonic()
    e.close()
    closed_at = time.monotonic()
    at_close = ctypes.string_at(base, size)
    time.sleep(1.0)
    done.set()
    w.join(30)
    t.join(30)
    stopped.signal(signal.SIGCONT)
    assert not t.is_alive() and result["rc"] < 0, result
    assert result["at"] - closed_at < 2, "the call inside ended long after close()"
    assert writes_before > 0 and rounds[:writes_before] == [0] * writes_before, rounds
    assert ctypes.string_at(base, size) == at_close, "a peer wrote into our memory after close()"
    assert all(rc < 0 for rc in rounds[writes_before + 1 :]), rounds
    assert closed_at - t0 < 10, closed_at - t0
