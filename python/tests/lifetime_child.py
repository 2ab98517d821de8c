"""The child process of test_lifetimes.py: hands Python objects to transfers
that outlive the call that took them, drops the caller's references,
allocates fresh objects of the same size (which reuse the freed memory if
the engine let go of it), and reports what happened. It runs under
``PYTHONMALLOC=debug``, so freed memory is poisoned, and in a process of
its own, so a crash is reported as an exit status instead of ending the
test run.

    python lifetime_child.py PEER_NAME PEER_ADDR PEER_PID SIZE CASE...

The peer (tests/peer.py, ours) has SIZE registered bytes at PEER_ADDR filled
with a pattern; the child stops it with SIGSTOP so that a transfer stays in
flight, and lets it go on with SIGCONT. Each CASE prints one JSON line:

    {"case", "rc": what the call (or the status call) returned,
     "held": the object was alive after the caller dropped it,
     "released": the object was freed once the transfer ended,
     "dirty": fresh buffers that received bytes,
     "landed": a WRITE delivered the object's bytes (WRITE cases)}
"""

import gc
import json
import os
import random
import signal
import sys
import time
import weakref

from transfer_engine import TransferEngine, TransferError, TransferOpcode

# Fresh buffers allocated while the transfer is in flight.
FRESH = 8
# How long the child waits for an abandoned transfer to end after SIGCONT.
SETTLE = 60.0


class Buffer(bytearray):
    """A bytearray a weak reference can watch."""


def stopped(pid: int) -> bool:
    """Whether every thread of process `pid` is stopped."""
    states = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/stat") as f:
            states.append(f.read().rpartition(")")[2].split()[0])
    return all(s in ("T", "t") for s in states)


class Stopped:
    """The peer is stopped (SIGSTOP) inside the block, every thread of it
    before the block starts, and always continued (SIGCONT) after it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __enter__(self):
        os.kill(self.pid, signal.SIGSTOP)
        deadline = time.monotonic() + SETTLE
        while not stopped(self.pid):
            assert time.monotonic() < deadline, "the peer did not stop"
            time.sleep(0.001)
        return self

    def __exit__(self, *exc) -> None:
        os.kill(self.pid, signal.SIGCONT)


def dirty(fresh) -> int:
    """How many of the fresh (zeroed) buffers hold something else."""
    zero = bytes(len(fresh[0]))
    return sum(1 for f in fresh if f != zero)


class Case:
    """One case: a new engine that has opened the peer's segment."""

    def __init__(self, peer: str, addr: int, pid: int, size: int) -> None:
        self.peer, self.addr, self.pid, self.size = peer, addr, pid, size
        self.engine = TransferEngine()
        assert self.engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        self.scratch = bytearray(size)
        # Opens the segment and the connections while the peer runs (a
        # READ cut short by MC_SLICE_TIMEOUT on a busy machine is retried).
        rc = -1
        for _ in range(5):
            rc = self.engine.transfer_sync_read(peer, self.scratch, addr, size)
            if rc == 0:
                break
        assert rc == 0, rc

    def settle(self, ref) -> None:
        """Waits until the transfer given up on has ended: each full-size READ
        after it ends after it on the same connections, and the reaper (at
        each submit) frees what the engine has ended."""
        deadline = time.monotonic() + SETTLE
        while True:
            self.engine.transfer_sync_read(self.peer, self.scratch, self.addr, self.size)
            if ref() is None or time.monotonic() > deadline:
                return
            time.sleep(0.05)

    def read_async(self, how: str) -> dict:
        """An asynchronous READ into an object the caller drops at once."""
        e, n = self.engine, self.size
        buf = Buffer(n)
        ref = weakref.ref(buf)
        with Stopped(self.pid):
            if how == "batch_transfer_async_read":
                bid = e.batch_transfer_async_read(self.peer, [buf], [self.addr], [n])
            else:
                bid = e.batch_transfer_async(self.peer, [buf], [self.addr], [n], TransferOpcode.Read)
            assert bid != 0
            del buf
            held = ref() is not None
            fresh = [bytearray(n) for _ in range(FRESH)]
        rc = e.get_batch_transfer_status([bid])
        released = ref() is None
        return {"rc": rc, "held": held, "released": released, "dirty": dirty(fresh)}

    def write_async(self) -> dict:
        """`transfer_submit_write` from an object the caller drops at once;
        the peer must receive the object's bytes."""
        e, n = self.engine, self.size
        data = random.Random(7).randbytes(n)
        buf = Buffer(data)
        ref = weakref.ref(buf)
        with Stopped(self.pid):
            bid = e.transfer_submit_write(self.peer, buf, self.addr, n)
            assert bid != 0
            del buf
            held = ref() is not None
            fresh = [bytearray(n) for _ in range(FRESH)]
        deadline = time.monotonic() + SETTLE
        rc = e.transfer_check_status(bid)
        while rc in (0, -2) and time.monotonic() < deadline:
            time.sleep(0.01)
            rc = e.transfer_check_status(bid)
        released = ref() is None
        assert e.transfer_sync_read(self.peer, self.scratch, self.addr, n) == 0
        return {
            "rc": rc,
            "held": held,
            "released": released,
            "dirty": dirty(fresh),
            "landed": self.scratch == data,
        }

    def read_sync(self, how: str) -> dict:
        """A synchronous READ that times out (the peer is stopped); the
        caller then drops the object."""
        e, n, peer, addr = self.engine, self.size, self.peer, self.addr
        buf = Buffer(n)
        ref = weakref.ref(buf)
        with Stopped(self.pid):
            try:
                if how == "transfer_sync_read":
                    rc = e.transfer_sync_read(peer, buf, addr, n)
                elif how == "transfer_sync":
                    rc = e.transfer_sync(peer, buf, addr, n, TransferOpcode.Read)
                elif how == "batch_transfer_sync_read":
                    rc = e.batch_transfer_sync_read(peer, [buf], [addr], [n])
                elif how == "batch_transfer_sync":
                    rc = e.batch_transfer_sync(peer, [buf], [addr], [n], TransferOpcode.Read)
                elif how == "read":
                    rc = e.read(peer, buf, addr)
                else:
                    rc = e.batch_read(peer, [buf], [addr])
            except TransferError as err:
                rc = err.code
            del buf
            held = ref() is not None
            fresh = [bytearray(n) for _ in range(FRESH)]
        self.settle(ref)
        return {"rc": rc, "held": held, "released": ref() is None, "dirty": dirty(fresh)}

    def failed_wait(self) -> dict:
        """`get_batch_transfer_status` of a failing batch and a running one:
        the running one is given up on with its object."""
        e, n = self.engine, self.size
        bad = e.batch_transfer_async_read(self.peer, [bytearray(16)], [8], [16])
        buf = Buffer(n)
        ref = weakref.ref(buf)
        with Stopped(self.pid):
            bid = e.batch_transfer_async_read(self.peer, [buf], [self.addr], [n])
            assert bad != 0 and bid != 0
            del buf
            rc = e.get_batch_transfer_status([bad, bid])
            held = ref() is not None
            fresh = [bytearray(n) for _ in range(FRESH)]
        self.settle(ref)
        return {"rc": rc, "held": held, "released": ref() is None, "dirty": dirty(fresh)}

    def ended(self, how: str) -> dict:
        """An asynchronous READ in flight when the engine ends: closed,
        initialized again, or collected. Its object is released then, and
        no byte lands afterwards."""
        e, n = self.engine, self.size
        buf = Buffer(n)
        ref = weakref.ref(buf)
        with Stopped(self.pid):
            bid = e.batch_transfer_async_read(self.peer, [buf], [self.addr], [n])
            assert bid != 0
            del buf
            held = ref() is not None
            if how == "close":
                e.close()
            elif how == "initialize":
                assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
            else:
                del e
                self.engine = None
                gc.collect()
            released = ref() is None
            fresh = [bytearray(n) for _ in range(FRESH)]
        # Nothing is in flight any more; give a late byte time to show.
        time.sleep(1.0)
        return {"rc": 0, "held": held, "released": released, "dirty": dirty(fresh)}

    def run(self, case: str) -> dict:
        kind, _, how = case.partition(":")
        if kind == "read_async":
            return self.read_async(how)
        if kind == "write_async":
            return self.write_async()
        if kind == "read_sync":
            return self.read_sync(how)
        if kind == "failed_wait":
            return self.failed_wait()
        return self.ended(how)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


def main() -> None:
    peer, addr, pid, size, *cases = sys.argv[1:]
    for case in cases:
        c = Case(peer, int(addr), int(pid), int(size))
        try:
            out = c.run(case)
        finally:
            c.close()
        print(json.dumps({"case": case, **out}), flush=True)


if __name__ == "__main__":
    main()
