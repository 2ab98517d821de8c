"""The calls the clients of ``mooncake.engine`` make, as they make them.

Run by ``test_mooncake_alias.py`` in an environment where
``TRANSFER_ENGINE_AS_MOONCAKE`` makes ``mooncake.engine`` this engine.
Each scenario follows one client's sequence (the shapes of vLLM's and
SGLang's Mooncake connectors, LMCache's and checkpoint engines' transfer
paths): two engines of this process, P2P handshake over TCP, memory given
by raw integer addresses as those clients give it (numpy's here, where
they hand over ``tensor.data_ptr()``), every byte checked. Prints
``OK <scenario>`` per scenario; any failure raises.
"""

import sys
import time

import numpy as np
from mooncake.engine import TransferEngine, TransferOpcode

HOST = "127.0.0.1"
LEN = 1 << 20


def engine():
    """An engine as every client starts one (P2P handshake, TCP)."""
    e = TransferEngine()
    assert e.initialize(HOST, "P2PHANDSHAKE", "tcp", "") == 0
    return e, f"{HOST}:{e.get_rpc_port()}"


def filled(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def check(got, want, what):
    if not np.array_equal(got, want):
        bad = int(np.argmax(got != want))
        raise AssertionError(f"{what}: first differing byte at {bad}")


def sglang(a, b, b_session):
    # MooncakeTransferEngine: register, transfer_sync_write, batch variant.
    src, dst = filled(LEN, 1), np.zeros(LEN, np.uint8)
    assert a.register_memory(src.ctypes.data, LEN) == 0
    assert b.register_memory(dst.ctypes.data, LEN) == 0
    assert a.transfer_sync_write(b_session, src.ctypes.data, dst.ctypes.data, LEN) == 0
    check(dst, src, "transfer_sync_write")
    half = LEN // 2
    src2 = filled(LEN, 2)
    assert a.batch_register_memory([src2.ctypes.data], [LEN]) == 0
    ret = a.batch_transfer_sync_write(
        b_session,
        [src2.ctypes.data, src2.ctypes.data + half],
        [dst.ctypes.data, dst.ctypes.data + half],
        [half, half],
    )
    assert ret == 0, ret
    check(dst, src2, "batch_transfer_sync_write")
    assert a.unregister_memory(src.ctypes.data) == 0
    assert a.batch_unregister_memory([src2.ctypes.data]) == 0
    assert b.unregister_memory(dst.ctypes.data) == 0


def vllm(a, b, b_session):
    # MooncakeConnector: KV blocks registered in one call, addresses and
    # lengths as numpy integers, blocks written in a batch.
    blocks = 8
    size = LEN // blocks
    kv_src, kv_dst = filled(LEN, 3), np.zeros(LEN, np.uint8)
    src_ptrs = [np.uint64(kv_src.ctypes.data + i * size) for i in range(blocks)]
    dst_ptrs = [np.int64(kv_dst.ctypes.data + i * size) for i in range(blocks)]
    lens = [np.int64(size)] * blocks
    assert a.batch_register_memory(src_ptrs, lens) == 0
    assert b.batch_register_memory([kv_dst.ctypes.data], [LEN]) == 0
    order = list(reversed(range(blocks)))
    ret = a.batch_transfer_sync_write(
        b_session, [src_ptrs[i] for i in order], [dst_ptrs[i] for i in order], lens
    )
    assert ret == 0, ret
    check(kv_dst, kv_src, "vllm batch write")
    assert a.batch_unregister_memory(src_ptrs) == 0
    assert b.batch_unregister_memory([kv_dst.ctypes.data]) == 0


def lmcache(a, b, b_session):
    # Reads from the peer's registered buffer into a local one.
    remote, local = filled(LEN, 4), np.zeros(LEN, np.uint8)
    assert b.register_memory(remote.ctypes.data, LEN) == 0
    assert a.register_memory(local.ctypes.data, LEN) == 0
    assert a.transfer_sync_read(b_session, local.ctypes.data, remote.ctypes.data, LEN) == 0
    check(local, remote, "transfer_sync_read")
    local[:] = 0
    half = LEN // 2
    ret = a.batch_transfer_sync_read(
        b_session,
        [local.ctypes.data, local.ctypes.data + half],
        [remote.ctypes.data, remote.ctypes.data + half],
        [half, half],
    )
    assert ret == 0, ret
    check(local, remote, "batch_transfer_sync_read")
    local[:] = 0
    ret = a.transfer_sync(
        b_session, local.ctypes.data, remote.ctypes.data, LEN, TransferOpcode.Read
    )
    assert ret == 0, ret
    check(local, remote, "transfer_sync(Read)")
    assert a.unregister_memory(local.ctypes.data) == 0
    assert b.unregister_memory(remote.ctypes.data) == 0


def asynchronous(a, b, b_session):
    # Weight updates and checkpoint engines: submit, then poll.
    src, dst = filled(LEN, 5), np.zeros(LEN, np.uint8)
    assert a.register_memory(src.ctypes.data, LEN) == 0
    assert b.register_memory(dst.ctypes.data, LEN) == 0
    batch = a.batch_transfer_async_write(b_session, [src.ctypes.data], [dst.ctypes.data], [LEN])
    assert batch != 0
    assert a.get_batch_transfer_status([batch]) == 0
    check(dst, src, "batch_transfer_async_write")
    dst[:] = 0
    batch = a.transfer_submit_write(b_session, src.ctypes.data, dst.ctypes.data, LEN)
    assert batch != 0
    deadline = time.monotonic() + 60
    while (status := a.transfer_check_status(batch)) == 0:
        assert time.monotonic() < deadline, "transfer_submit_write still running after 60 s"
        time.sleep(0.001)
    assert status == 1, status
    check(dst, src, "transfer_submit_write")
    assert a.unregister_memory(src.ctypes.data) == 0
    assert b.unregister_memory(dst.ctypes.data) == 0


def main():
    a, _ = engine()
    b, b_session = engine()
    assert a.get_engine() is None and a.get_engine_ptr() is None
    for scenario in (sglang, vllm, lmcache, asynchronous):
        scenario(a, b, b_session)
        print("OK", scenario.__name__, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
