"""Data checks shared by the two-process and interop tests: an engine of
ours in this process and a peer process move bytes in both directions, each
side initiating READs, WRITEs, batches and notifications, and every byte is
compared."""

import hashlib
import time

from conftest import pattern

from transfer_engine import TransferEngine, TransferNotify, TransferOpcode

# (length, offset) pairs: tiny, unaligned, across slice boundaries, > 1 MiB.
CASES = [(1, 0), (4095, 3), (65537, 8192 + 5), ((1 << 20) + 13, 1 << 20)]


def sha(data) -> str:
    return hashlib.sha256(bytes(data)).hexdigest()


def wait_notifies(fetch, want, within: float = 15.0) -> list:
    """Polls `fetch()` (a list of (name, msg)) until `want` is among what it
    returned; returns everything seen."""
    seen = []
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        seen += fetch()
        if want in seen:
            return seen
        time.sleep(0.02)
    raise AssertionError(f"notification {want} not received within {within} s; got {seen}")


def exchange(local: TransferEngine, peer, registered_reads: bool = False) -> None:
    """Moves verified bytes between `local` and `peer` both ways.

    READs land in fresh unregistered buffers, as TCP allows, or with
    `registered_reads` (RDMA needs registered local memory) in a registered
    scratch buffer."""
    n_bytes = peer.size
    mine = bytearray(pattern(n_bytes, 11))
    base = local.register(mine)
    scratch = bytearray(n_bytes)
    scratch_base = local.register(scratch) if registered_reads else None
    me = local.local_name
    try:
        # Our engine WRITEs into the peer.
        peer.call("fill", seed=22)
        for n, off in CASES:
            rc = local.transfer_sync_write(peer.name, base + off, peer.addr + off, n)
            assert rc == 0, f"WRITE {n} bytes at +{off} to {peer.impl}: {rc}"
            assert peer.sha(off, n) == sha(mine[off : off + n]), f"WRITE {n} at +{off}"

        # Our engine READs from the peer.
        peer.call("fill", seed=33)
        theirs = pattern(n_bytes, 33)
        for n, off in CASES:
            if scratch_base is None:
                back = bytearray(n)
                rc = local.transfer_sync_read(peer.name, back, peer.addr + off, n)
            else:
                scratch[off : off + n] = bytes(n)
                rc = local.transfer_sync_read(peer.name, scratch_base + off, peer.addr + off, n)
                back = scratch[off : off + n]
            assert rc == 0, f"READ {n} bytes at +{off} from {peer.impl}: {rc}"
            assert back == theirs[off : off + n], f"READ {n} at +{off}"

        # The peer WRITEs into our buffer.
        peer.call("fill", seed=44)
        theirs = pattern(n_bytes, 44)
        for n, off in CASES:
            rc = peer.call("write", target=me, off=off, remote=base + off, len=n)["rc"]
            assert rc == 0, f"{peer.impl} WRITE {n} bytes at +{off} to ours: {rc}"
            assert mine[off : off + n] == theirs[off : off + n], f"peer WRITE {n} at +{off}"

        # The peer READs from our buffer.
        mine[:] = pattern(n_bytes, 55)
        for n, off in CASES:
            rc = peer.call("read", target=me, off=off, remote=base + off, len=n)["rc"]
            assert rc == 0, f"{peer.impl} READ {n} bytes at +{off} from ours: {rc}"
            assert peer.sha(off, n) == sha(mine[off : off + n]), f"peer READ {n} at +{off}"

        # Batches both ways: ours WRITEs four ranges, the peer READs them back.
        mine[:] = pattern(n_bytes, 66)
        offs = [off for _, off in CASES]
        lens = [n for n, _ in CASES]
        rc = local.batch_transfer_sync_write(
            peer.name, [base + o for o in offs], [peer.addr + o for o in offs], lens
        )
        assert rc == 0, f"batch WRITE to {peer.impl}: {rc}"
        for n, off in CASES:
            assert peer.sha(off, n) == sha(mine[off : off + n])
        mine[:] = bytes(n_bytes)
        rc = peer.call(
            "batch_write", target=me, offs=offs, remotes=[base + o for o in offs], lens=lens
        )["rc"]
        assert rc == 0, f"{peer.impl} batch WRITE to ours: {rc}"
        for n, off in CASES:
            assert peer.sha(off, n) == sha(mine[off : off + n])

        # Notifications both ways, after a WRITE.
        note = ["from-peer", f"{peer.impl}-says-hello"]
        rc = peer.call(
            "notify_write", target=me, off=0, remote=base, len=64, name=note[0], msg=note[1]
        )["rc"]
        assert rc == 0
        wait_notifies(lambda: [[x.name, x.msg] for x in local.get_notifies()], note)
        note = ["from-ours", "hello-peer"]
        rc = local.transfer_sync(
            peer.name, base, peer.addr, 64, TransferOpcode.Write, TransferNotify(*note)
        )
        assert rc == 0
        wait_notifies(lambda: peer.call("notifies")["notifies"], note)

        # Both sides see each other's first buffer.
        assert local.get_first_buffer_address(peer.name) == peer.addr
        # Our descriptor lists buffers by address.
        ours_first = base if scratch_base is None else min(base, scratch_base)
        assert peer.call("first", target=me)["addr"] == ours_first
        assert local.send_probe(peer.name) == 0
        assert peer.call("probe", target=me)["rc"] == 0
    finally:
        local.unregister(mine)
        if scratch_base is not None:
            local.unregister(scratch)
