"""Beyond Mooncake: Python buffers where Mooncake wants integer addresses,
and `TransferError` with the engine's explanation where Mooncake returns a
bare code."""

import ctypes
import pickle

import pytest
from conftest import need, pattern

from transfer_engine import TransferEngine, TransferError

MiB = 1 << 20


@pytest.fixture
def pair(make_engine):
    """(initiator, target, target's registered bytearray, its address)."""
    a, b = make_engine(), make_engine()
    remote = bytearray(4 * MiB)
    return a, b, remote, b.register(remote)


def numpy():
    try:
        import numpy as np
    except ImportError:
        need(False, "numpy is not installed")
    return np


class FakeTensor:
    """What the engine uses of a torch.Tensor: data_ptr(), nbytes,
    is_contiguous(), is_cuda; backed by ctypes memory."""

    def __init__(self, data: bytes, contiguous: bool = True, cuda: bool = False) -> None:
        self.mem = ctypes.create_string_buffer(data, len(data))
        self.nbytes = len(data)
        self.contiguous, self.is_cuda = contiguous, cuda

    def data_ptr(self) -> int:
        return ctypes.addressof(self.mem)

    def is_contiguous(self) -> bool:
        return self.contiguous

    def bytes(self) -> bytes:
        return self.mem.raw[: self.nbytes]


def test_registered_bytearray_receives_peer_writes_and_is_pinned(pair):
    a, b, remote, base = pair
    data = pattern(MiB, 1)
    a.write(b.local_name, data, base + 100)
    assert remote[100 : 100 + MiB] == data
    # Registered memory cannot be resized away under the engine.
    with pytest.raises(BufferError):
        remote.extend(b"x")
    b.unregister(remote)
    remote.extend(b"x")
    with pytest.raises(TransferError) as err:
        b.unregister(base)
    assert err.value.code == -3
    assert "registered" in str(err.value)
    with pytest.raises(TransferError) as err:
        a.write(b.local_name, data, base)
    assert err.value.code == -1


def test_write_and_read_every_buffer_kind(pair):
    a, b, remote, base = pair
    target = b.local_name
    payload = pattern(64 * 1024, 2)
    for src in (payload, bytearray(payload), memoryview(payload), ctypes.create_string_buffer(payload, len(payload))):
        remote[:] = bytes(len(remote))
        a.write(target, src, base + 8)
        assert remote[8 : 8 + len(payload)] == payload, type(src).__name__
    back = bytearray(len(payload))
    a.read(target, back, base + 8)
    assert back == payload
    view = memoryview(bytearray(len(payload) * 2))
    a.read(target, view[len(payload) :], base + 8)
    assert view[len(payload) :] == payload
    # A length smaller than the buffer moves only that much.
    back = bytearray(10)
    a.read(target, back, base + 8, 4)
    assert back == payload[:4] + bytes(6)
    # The compatible methods take buffers too.
    assert a.transfer_sync_read(target, back, base + 8, 10) == 0
    assert back == payload[:10]


def test_numpy_arrays(pair):
    np = numpy()
    a, b, remote, base = pair
    target = b.local_name
    x = np.arange(256 * 1024, dtype=np.float32).reshape(512, 512)
    a.write(target, x, base)
    y = np.empty_like(x)
    a.read(target, y, base)
    assert np.array_equal(x, y)
    assert bytes(remote[: x.nbytes]) == x.tobytes()
    with pytest.raises(ValueError, match="contiguous"):
        a.write(target, x[:, ::2], base)
    frozen = np.zeros(16, dtype=np.uint8)
    frozen.flags.writeable = False
    with pytest.raises(TypeError, match="read-only"):
        a.read(target, frozen, base)
    # A registered numpy array is reachable by peers.
    z = np.zeros(1024, dtype=np.int64)
    zaddr = a.register(z, "cpu:0")
    assert b.transfer_sync_write(a.local_name, np.arange(1024, dtype=np.int64), zaddr, 8192) == 0
    assert np.array_equal(z, np.arange(1024))
    a.unregister(z)


def test_tensor_like_objects_through_data_ptr(pair):
    a, b, remote, base = pair
    target = b.local_name
    t = FakeTensor(pattern(4096, 3))
    a.write(target, t, base)
    assert remote[:4096] == t.bytes()
    back = FakeTensor(bytes(4096))
    a.read(target, back, base)
    assert back.bytes() == t.bytes()
    with pytest.raises(ValueError, match="contiguous"):
        a.write(target, FakeTensor(b"ab", contiguous=False), base)
    with pytest.raises(NotImplementedError, match="CUDA"):
        a.write(target, FakeTensor(b"ab", cuda=True), base)


def test_batches_of_buffers(pair):
    a, b, remote, base = pair
    target = b.local_name
    parts = [pattern(n, n) for n in (1, 4097, 70000)]
    peers = [base, base + 8192, base + 100000]
    a.batch_write(target, parts, peers)
    backs = [bytearray(len(p)) for p in parts]
    a.batch_read(target, backs, peers)
    assert [bytes(x) for x in backs] == parts
    a.batch_read(target, backs, peers, [1, 1, 1])
    with pytest.raises(ValueError, match="different sizes"):
        a.batch_write(target, parts, peers[:2])
    with pytest.raises(TransferError) as err:
        a.batch_write(target, parts, [base, 8, base])
    assert err.value.code == -1
    assert "failed" in str(err.value)


def test_errors_carry_the_engines_explanation(pair, engine):
    a, b, remote, base = pair
    with pytest.raises(TransferError) as err:
        a.write("127.0.0.1:1", b"x", base)
    assert err.value.code == -1
    assert "127.0.0.1:1" in str(err.value)
    with pytest.raises(TransferError) as err:
        engine.register(bytearray(16), location="gpu0")
    assert err.value.code == -1 and "location" in str(err.value)
    buf = bytearray(64)
    engine.register(buf)
    with pytest.raises(TransferError) as err:
        engine.register(memoryview(buf)[8:])
    assert err.value.code == -7 and "overlap" in str(err.value)
    with pytest.raises(ValueError, match="length"):
        a.write(b.local_name, b"abc", base, 4)
    with pytest.raises(ValueError, match="length is required"):
        a.write(b.local_name, 12345, base)
    with pytest.raises(TypeError, match="buffer protocol"):
        a.write(b.local_name, "text", base)
    with pytest.raises(TypeError, match="read-only"):
        a.read(b.local_name, b"immutable", base)
    e = pickle.loads(pickle.dumps(err.value))
    assert (type(e), e.code, str(e)) == (TransferError, -7, str(err.value))


def test_rich_methods_need_an_initialized_engine():
    e = TransferEngine()
    with pytest.raises(RuntimeError, match="not initialized"):
        e.write("x", b"a", 1)
    with pytest.raises(RuntimeError, match="not initialized"):
        e.register(bytearray(8))
