"""Every method of Mooncake's API on our engine: two engines in this
process (P2P handshake, loopback TCP), bytes verified, return codes as
Mooncake's binding gives them."""

import ctypes
import hashlib
import json
import os
import socket
import subprocess
import sys
import time

import pytest
from conftest import pattern, unique

import transfer_engine
from transfer_engine import (
    Read,
    TransferEngine,
    TransferNotify,
    TransferOpcode,
    Write,
)
from checks import wait_notifies

MiB = 1 << 20


class Memory:
    """Registered ctypes memory of one engine."""

    def __init__(self, engine: TransferEngine, size: int, seed: int = 0) -> None:
        self.buf = ctypes.create_string_buffer(pattern(size, seed) if seed else b"", size)
        self.addr = ctypes.addressof(self.buf)
        self.size = size
        assert engine.register_memory(self.addr, size) == 0

    def bytes(self, off: int = 0, n: int | None = None) -> bytes:
        n = self.size - off if n is None else n
        return ctypes.string_at(self.addr + off, n)


@pytest.fixture
def pair(make_engine):
    """(initiator, target, target's 4 MiB registered memory)."""
    a, b = make_engine(), make_engine()
    return a, b, Memory(b, 4 * MiB)


def test_module_exports_mooncakes_names():
    assert transfer_engine.TransferEngine.TransferOpcode is TransferOpcode
    assert (int(Read), int(Write)) == (0, 1)
    assert (TransferOpcode.Read, TransferOpcode.Write) == (Read, Write)
    assert str(TransferOpcode.Write) == "TransferOpcode.Write"
    assert transfer_engine.SUPPORT_CUDA is False
    for flag in ("SUPPORT_EFA", "SUPPORT_HIP", "SUPPORT_MNNVL", "SUPPORT_MUSA", "SUPPORT_INTRA_NVLINK"):
        assert getattr(transfer_engine, flag) is False
    n = TransferNotify()
    assert (n.name, n.msg) == ("", "")
    n = TransferNotify("a", msg="b")
    n.name = "c"
    assert (n.name, n.msg) == ("c", "b")
    assert TransferNotify("x", "y") == TransferNotify(name="x", msg="y")


def test_initialize_names_the_engine_host_and_rpc_port(engine):
    port = engine.get_rpc_port()
    assert engine.local_name == f"127.0.0.1:{port}"
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
    assert repr(engine) == f"<TransferEngine 127.0.0.1:{port}>"


def test_initialize_failures_return_minus_one(metadata_server):
    e = TransferEngine()
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead_port = dead.getsockname()[1]
    dead.close()
    assert e.initialize("n", f"http://127.0.0.1:{dead_port}/metadata", "tcp", "") == -1
    assert e.initialize_ext("127.0.0.1", "P2PHANDSHAKE", "xgmi", "", "") == -1
    assert e.initialize("127.0.0.1", "nonsense://x", "tcp", "") == -1
    with pytest.raises(RuntimeError, match="not initialized"):
        e.get_rpc_port()
    # initialize_ext joins the metadata type and a server without "://".
    server = metadata_server.removeprefix("http://")
    assert e.initialize_ext(unique("ext"), server, "tcp", "", "http") == 0
    e.close()


def test_initialize_refuses_a_bad_setting_naming_it():
    """A value the configuration does not allow fails initialize (-1) and
    the log names the variable, the value and the range. The configuration
    is read once per process: a child interpreter runs with the bad value."""
    code = (
        "from transfer_engine import TransferEngine\n"
        "e = TransferEngine()\n"
        "print('RESULT', e.initialize('127.0.0.1', 'P2PHANDSHAKE', 'tcp', ''))\n"
    )
    env = dict(os.environ, MC_SLICE_SIZE="abc")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "RESULT -1" in out.stdout, out.stdout + out.stderr
    assert "MC_SLICE_SIZE=abc is not a number in 1..=1099511627776" in out.stderr, out.stderr


def test_p2p_renames_the_engine_to_its_rpc_port():
    """As Mooncake: in P2P mode the name's port is replaced by the port of
    the handshake listener, chosen in MC_MIN_RPC_PORT..MC_MAX_RPC_PORT."""
    with TransferEngine() as e:
        assert e.initialize("127.0.0.1:12345", "P2PHANDSHAKE", "tcp", "") == 0
        port = e.get_rpc_port()
        assert 15000 <= port <= 17000
        assert e.local_name == f"127.0.0.1:{port}"


def test_initialize_again_replaces_the_engine():
    e = TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", None) == 0
    first = e.get_rpc_port()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "mlx5_0") == 0
    assert e.get_rpc_port() != first
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", first), timeout=2).close()
    e.close()


def test_uninitialized_engine_raises_instead_of_crashing():
    e = TransferEngine()
    assert repr(e) == "<TransferEngine (not initialized)>"
    calls = [
        lambda: e.get_rpc_port(),
        lambda: e.local_name,
        lambda: e.allocate_managed_buffer(10),
        lambda: e.free_managed_buffer(1, 10),
        lambda: e.transfer_sync_write("x", 1, 1, 1),
        lambda: e.batch_transfer_async_write("x", [1], [1], [1]),
        lambda: e.get_batch_transfer_status([1]),
        lambda: e.transfer_check_status(1),
        lambda: e.register_memory(1, 1),
        lambda: e.unregister_memory(1),
        lambda: e.get_first_buffer_address("x"),
        lambda: e.get_notifies(),
        lambda: e.send_probe("x"),
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match="not initialized"):
            call()
    # Needs no engine, as in Mooncake.
    assert json.loads(e.get_local_topology())


def test_sync_write_and_read_move_verified_bytes(pair):
    a, b, mem = pair
    src = ctypes.create_string_buffer(pattern(3 * MiB, 5), 3 * MiB)
    for n, off in [(1, 0), (4096, 11), (65537, 4096), ((1 << 20) + 3, MiB)]:
        assert a.transfer_sync_write(b.local_name, ctypes.addressof(src) + off, mem.addr + off, n) == 0
        assert mem.bytes(off, n) == src.raw[off : off + n]
        dst = ctypes.create_string_buffer(n)
        assert a.transfer_sync_read(b.local_name, ctypes.addressof(dst), mem.addr + off, n) == 0
        assert dst.raw == src.raw[off : off + n]
    # transport_hint is accepted by keyword, as in Mooncake.
    assert a.transfer_sync_write(b.local_name, src, mem.addr, 16, transport_hint="tcp") == 0


def test_transfer_sync_with_opcode_and_notify(pair):
    a, b, mem = pair
    src = bytearray(pattern(8192, 9))
    rc = a.transfer_sync(b.local_name, src, mem.addr, 8192, TransferOpcode.Write, TransferNotify("k", "v"))
    assert rc == 0
    assert mem.bytes(0, 8192) == src
    wait_notifies(lambda: [(n.name, n.msg) for n in b.get_notifies()], ("k", "v"))
    assert b.get_notifies() == []
    back = bytearray(8192)
    assert a.transfer_sync(b.local_name, back, mem.addr, 8192, Read) == 0
    assert back == src
    # A plain int opcode works too; other values are refused.
    assert a.transfer_sync(b.local_name, back, mem.addr, 8192, 0) == 0
    with pytest.raises(ValueError, match="opcode"):
        a.transfer_sync(b.local_name, back, mem.addr, 8192, 7)


def test_sync_transfer_failures_return_minus_one(pair, engine):
    a, b, mem = pair
    buf = bytearray(4096)
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead_name = f"127.0.0.1:{dead.getsockname()[1]}"
    dead.close()
    assert a.transfer_sync_write(dead_name, buf, 4096, 16) == -1
    # Outside the peer's registered memory: refused before a byte moves.
    assert a.transfer_sync_write(b.local_name, buf, mem.addr + mem.size - 8, 16) == -1
    assert a.transfer_sync_read(b.local_name, buf, 4096, 16) == -1
    assert mem.bytes(mem.size - 8, 8) == bytes(8)
    assert a.transfer_sync_write(b.local_name, buf, mem.addr, 0) == 0


def test_batch_sync_transfers(pair):
    a, b, mem = pair
    srcs = [bytearray(pattern(n, n)) for n in (100, 5000, 70000)]
    remotes = [mem.addr, mem.addr + 8192, mem.addr + 65536]
    lens = [len(s) for s in srcs]
    assert a.batch_transfer_sync_write(b.local_name, srcs, remotes, lens) == 0
    for s, r in zip(srcs, remotes):
        assert mem.bytes(r - mem.addr, len(s)) == s
    backs = [bytearray(n) for n in lens]
    assert a.batch_transfer_sync_read(b.local_name, backs, remotes, lens) == 0
    assert backs == srcs
    backs = [bytearray(n) for n in lens]
    assert a.batch_transfer_sync(b.local_name, backs, remotes, lens, Read, TransferNotify("b", "m")) == 0
    assert backs == srcs
    wait_notifies(lambda: [(n.name, n.msg) for n in b.get_notifies()], ("b", "m"))
    assert a.batch_transfer_sync_write(b.local_name, srcs, remotes[:2], lens) == -1
    assert a.batch_transfer_sync_read(b.local_name, [], [], []) == 0
    # One request outside the peer's memory fails the batch.
    assert a.batch_transfer_sync_write(b.local_name, srcs, [mem.addr, 8, mem.addr], lens) == -1


def test_async_batches_and_status(pair):
    a, b, mem = pair
    srcs = [bytearray(pattern(4096, i + 1)) for i in range(4)]
    remotes = [mem.addr + i * 4096 for i in range(4)]
    lens = [4096] * 4
    w = a.batch_transfer_async_write(b.local_name, srcs[:2], remotes[:2], lens[:2])
    w2 = a.batch_transfer_async(b.local_name, srcs[2:], remotes[2:], lens[2:], Write)
    assert w and w2
    assert a.get_batch_transfer_status([w, w2]) == 0
    assert mem.bytes(0, 4 * 4096) == b"".join(srcs)
    backs = [bytearray(4096) for _ in range(4)]
    r = a.batch_transfer_async_read(b.local_name, backs, remotes, lens)
    assert r and a.get_batch_transfer_status([r]) == 0
    assert backs == srcs
    # Finished batches are freed: their ids are no longer known.
    assert a.get_batch_transfer_status([r]) == -1
    assert a.get_batch_transfer_status([]) == 0
    # Failures to submit give 0.
    assert a.batch_transfer_async_write(b.local_name, srcs, remotes, [1]) == 0
    assert a.batch_transfer_async_write("127.0.0.1:1", srcs[:1], remotes[:1], lens[:1]) == 0
    bad = a.batch_transfer_async_write(b.local_name, srcs[:1], [16], [4096])
    assert bad and a.get_batch_transfer_status([bad]) == -1


def test_cancel_batch_ends_an_async_batch_and_releases_its_buffers(make_engine):
    a, b = make_engine(), make_engine()
    size = 64 * MiB
    mem = Memory(b, size)
    src = bytearray(pattern(size, 3))
    for _ in range(5):
        bid = a.batch_transfer_async_write(b.local_name, [src], [mem.addr], [size])
        assert bid
        assert a.cancel_batch(bid, 5000) == 0
        # Freed with its objects: the id is no longer known.
        assert a.cancel_batch(bid, 0) == -1
        assert a.transfer_check_status(bid) == -1
        # The buffer is the caller's again: what it holds now never lands.
        src[:] = b"\xee" * size
        snapshot = mem.bytes()
        time.sleep(0.05)
        assert mem.bytes() == snapshot
        assert b"\xee" not in snapshot
        src[:] = pattern(size, 3)
    assert a.cancel_batch(12345, 0) == -1
    # A batch that may have ended already cancels as done, and is freed.
    small = bytearray(pattern(4096, 4))
    bid = a.batch_transfer_async_write(b.local_name, [small], [mem.addr], [4096])
    assert a.cancel_batch(bid) == 0
    assert a.transfer_check_status(bid) == -1


def test_submit_write_and_check_status(pair):
    a, b, mem = pair
    src = bytearray(pattern(MiB, 3))
    bid = a.transfer_submit_write(b.local_name, src, mem.addr + 5, MiB)
    assert bid
    codes = set()
    while True:
        code = a.transfer_check_status(bid)
        codes.add(code)
        if code != 0:
            break
    assert code == 1, codes
    assert mem.bytes(5, MiB) == src
    assert a.transfer_check_status(bid) == -1
    failing = a.transfer_submit_write(b.local_name, src, 64, MiB)
    while (code := a.transfer_check_status(failing)) == 0:
        pass
    assert code == -1
    assert a.transfer_submit_write("127.0.0.1:1", src, mem.addr, 16) == 0


def test_write_and_read_bytes_to_buffer(engine):
    buf = ctypes.create_string_buffer(64)
    addr = ctypes.addressof(buf)
    assert engine.write_bytes_to_buffer(addr, b"hello world", 5) == 0
    assert engine.read_bytes_from_buffer(addr, 6) == b"hello\0"
    assert engine.write_bytes_to_buffer(addr + 1, "Ünï", 5) == 0
    assert engine.read_bytes_from_buffer(addr, 6) == "hÜnï".encode()
    assert engine.write_bytes_to_buffer(addr, memoryview(b"xyz"), 3) == 0
    assert engine.read_bytes_from_buffer(addr, 3) == b"xyz"
    with pytest.raises(ValueError, match="exceeds"):
        engine.write_bytes_to_buffer(addr, b"ab", 3)
    with pytest.raises(ValueError, match="NULL"):
        engine.write_bytes_to_buffer(0, b"ab", 2)
    with pytest.raises(ValueError, match="NULL"):
        engine.read_bytes_from_buffer(0, 2)


def test_register_and_unregister_codes(engine):
    buf = ctypes.create_string_buffer(MiB)
    a = ctypes.addressof(buf)
    assert engine.register_memory(a, MiB) == 0
    assert engine.register_memory(a, MiB) == -7
    assert engine.register_memory(a + 100, 10) == -7
    assert engine.register_memory(a + 2 * MiB, 0) == -1
    assert engine.register_memory(0, 16) == -1
    assert engine.register_memory(a + 8 * MiB, 16, "cpu:0") == 0
    assert engine.register_memory(a + 9 * MiB, 16, location="somewhere") == -1
    assert engine.unregister_memory(a + 5) == -3
    assert engine.unregister_memory(a) == 0
    assert engine.unregister_memory(a) == -3
    assert engine.unregister_memory(a + 8 * MiB) == 0
    assert engine.batch_register_memory([a, a + 4096], [4096, 4096]) == 0
    assert engine.batch_register_memory([a + 8192, a + 8292], [4096, 4096]) == -7
    assert engine.batch_register_memory([a + 65536], [0]) == -1
    assert engine.batch_register_memory([a + 65536], [1, 2]) == -1
    assert engine.batch_register_memory([], []) == 0
    assert engine.batch_register_memory([a + 65536], [4096], "cpu:0") == 0
    assert engine.batch_unregister_memory([a, a + 4096, a + 65536]) == 0
    assert engine.batch_unregister_memory([a + 12345]) == -3
    assert engine.batch_unregister_memory([]) == 0


def test_managed_buffers_are_registered_and_reused(pair):
    """Mooncake's allocator: blocks of 8 KiB to 256 MiB carved from one
    registered 2 GiB chunk, larger buffers registered alone."""
    a, b, _ = pair
    sizes = [0, 1, 8192, 8193, 9000, MiB, 3 * MiB, 256 * MiB]
    addrs = [b.allocate_managed_buffer(n) for n in sizes]
    assert all(addrs)
    # Each block spans its class: the next power of two, at least 8 KiB.
    spans = sorted((addr, max(8192, 1 << (max(n, 1) - 1).bit_length())) for addr, n in zip(addrs, sizes))
    for (x, n), (y, _) in zip(spans, spans[1:]):
        assert x + n <= y, "managed blocks overlap"
    assert spans[-1][0] + spans[-1][1] - spans[0][0] <= 2 << 30, "more than one chunk"
    for addr, n in zip(addrs, sizes):
        k = min(max(n, 1), 65536)
        data = bytearray(pattern(k, n & 0xFF))
        assert a.transfer_sync_write(b.local_name, data, addr + max(n, 1) - k, k) == 0
        assert b.read_bytes_from_buffer(addr + max(n, 1) - k, k) == data
    assert b.free_managed_buffer(addrs[2], sizes[2]) == 0
    assert b.free_managed_buffer(addrs[2], sizes[2]) == -1
    assert b.free_managed_buffer(12345, 10) == -1
    assert b.allocate_managed_buffer(sizes[2]) == addrs[2]
    # Above 256 MiB: a registration of its own, gone when freed.
    big = b.allocate_managed_buffer(300 * MiB)
    assert big and not (spans[0][0] <= big < spans[0][0] + (2 << 30))
    assert a.transfer_sync_write(b.local_name, b"end", big + 300 * MiB - 3, 3) == 0
    assert b.free_managed_buffer(big, 300 * MiB) == 0
    assert a.transfer_sync_write(b.local_name, b"end", big + 300 * MiB - 3, 3) == -1


def test_first_buffer_address(pair):
    a, b, mem = pair
    assert a.get_first_buffer_address(b.local_name) == mem.addr
    assert b.get_first_buffer_address(b.local_name) == mem.addr
    assert a.get_first_buffer_address(a.local_name) == 0
    assert a.get_first_buffer_address("127.0.0.1:1") == 0


def test_notifies_probe_topology_and_efa(pair):
    a, b, mem = pair
    assert a.get_notifies() == []
    assert a.send_probe(b.local_name) == 0
    assert a.send_probe("127.0.0.1:1") == -102
    assert a.send_probe("no-such-host.invalid") == -101
    assert a.warmup_efa_segment(b.local_name) == 0
    topo = json.loads(a.get_local_topology())
    assert isinstance(topo, dict) and topo
    for location, (preferred, other) in topo.items():
        assert location.startswith("cpu:") or location.startswith("cuda:")
        assert isinstance(preferred, list) and isinstance(other, list)
    assert isinstance(json.loads(a.get_local_topology("mlx5_0")), dict)


def test_not_available_here_raises_not_implemented(engine):
    for name in (
        "transfer_write_on_cuda",
        "transfer_read_on_cuda",
        "batch_transfer_write_on_cuda",
        "batch_transfer_read_on_cuda",
    ):
        with pytest.raises(NotImplementedError, match="CUDA"):
            getattr(engine, name)("x", 1, 2, 3, stream_ptr=0)


def test_no_cpp_engine_object_is_none(engine):
    assert engine.get_engine() is None
    assert engine.get_engine_ptr() is None


def test_close_and_context_manager():
    with TransferEngine() as e:
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        port = e.get_rpc_port()
    with pytest.raises(RuntimeError):
        e.get_rpc_port()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    e.close()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    e.close()


def test_segment_transport_names_the_transport_carrying_each_segment(pair, spawn_peer):
    a, b, mem = pair
    # Shared memory reaches other processes only: an engine of this
    # process is reached by TCP, before and after a transfer.
    assert a.get_segment_transport(a.local_name) == "local"
    assert a.get_segment_transport(b.local_name) == "tcp"
    src = Memory(a, MiB, seed=5)
    assert a.transfer_sync_write(b.local_name, src.addr, mem.addr, MiB) == 0
    assert mem.bytes(0, MiB) == pattern(MiB, 5)
    assert a.get_segment_transport(b.local_name) == "tcp"
    # A peer process of this host is reached by shared memory.
    peer = spawn_peer("ours", "P2PHANDSHAKE")
    assert a.get_segment_transport(peer.name) == "shm"
    assert a.transfer_sync_write(peer.name, src.addr, peer.addr, MiB) == 0
    assert peer.sha(0, MiB) == hashlib.sha256(pattern(MiB, 5)).hexdigest()
    assert a.get_segment_transport(peer.name) == "shm"
    with pytest.raises(transfer_engine.TransferError) as err:
        a.get_segment_transport("127.0.0.1:1")
    assert "get_segment_transport" in str(err.value)
