"""Python objects handed to transfers stay alive, with their buffer export,
until the engine has ended every byte they move: an asynchronous batch
holds them until it is seen finished, a synchronous call that gives up
hands them to the abandoned batch, and closing the engine releases them
once no transfer runs. The cases run in a child process under
``PYTHONMALLOC=debug`` (lifetime_child.py) against a peer process stopped
with SIGSTOP, and are judged by the symptom: no crash, no fresh buffer
receives the peer's bytes, a WRITE delivers the object's bytes. `register`
pins what it registers (a tensor's storage) or refuses it."""

import ctypes
import json
import os
import pathlib
import signal
import subprocess
import sys
import weakref

import pytest
from conftest import pattern

from transfer_engine import TransferEngine, TransferError

CHILD = pathlib.Path(__file__).resolve().with_name("lifetime_child.py")
SIZE = 8 << 20


@pytest.fixture
def peer(spawn_peer):
    """A peer process of ours with SIZE registered bytes of a pattern."""
    p = spawn_peer("ours", "P2PHANDSHAKE", size=SIZE)
    p.call("fill", seed=99)
    return p


def run_child(peer, cases, env=None) -> dict:
    """Runs lifetime_child.py CASES under PYTHONMALLOC=debug; returns its
    results by case. A crash fails with the child's exit status."""
    args = [sys.executable, str(CHILD), peer.name, str(peer.addr), str(peer.proc.pid), str(SIZE)]
    # The peer is stopped to make READs outlast their call: over the
    # network. (By shared memory, the initiator copies a READ itself, and
    # a stopped peer does not hold it up.)
    full_env = {**os.environ, "PYTHONMALLOC": "debug", "MC_TE_SHM": "0", **(env or {})}
    try:
        done = subprocess.run(
            args + cases, env=full_env, capture_output=True, text=True, timeout=600
        )
    finally:
        # A child that died while the peer was stopped leaves it stopped.
        peer.signal(signal.SIGCONT)
    if done.returncode != 0:
        why = (
            f"signal {signal.Signals(-done.returncode).name}"
            if done.returncode < 0
            else f"exit {done.returncode}"
        )
        pytest.fail(
            f"the child process died ({why}) after {done.stdout.strip()!r}\n"
            f"{done.stderr[-3000:]}"
        )
    return {r["case"]: r for r in map(json.loads, done.stdout.splitlines())}


def check(result: dict, rc: int) -> None:
    case = result["case"]
    assert result["dirty"] == 0, f"{case}: fresh buffers received the peer's bytes: {result}"
    assert result["held"], f"{case}: the object was freed while the transfer ran: {result}"
    assert result["released"], f"{case}: the object was kept after the transfer ended: {result}"
    assert result["rc"] == rc, f"{case}: {result}"
    assert result.get("landed", True), f"{case}: the WRITE sent other bytes: {result}"


def test_an_asynchronous_batch_holds_its_objects_until_it_ends(peer):
    """The issue's first reproduction: an asynchronous READ into a
    temporary object, fresh objects of the same size, then the status."""
    cases = ["read_async:batch_transfer_async_read", "read_async:batch_transfer_async"]
    results = run_child(peer, cases + ["write_async"])
    for case in cases:
        check(results[case], 0)
    check(results["write_async"], 1)


def test_a_sync_read_that_times_out_hands_its_object_to_the_abandoned_batch(peer):
    """The issue's second reproduction: MC_TRANSFER_TIMEOUT=5, the peer
    stopped, an 8 MiB `transfer_sync_read` fails after 5 s, the object is
    dropped, fresh objects allocated, the peer continued."""
    results = run_child(peer, ["read_sync:transfer_sync_read"], {"MC_TRANSFER_TIMEOUT": "5"})
    check(results["read_sync:transfer_sync_read"], -1)


def test_every_synchronous_call_keeps_its_objects_when_it_gives_up(peer):
    """Each synchronous READ form, ended after a second by MC_SLICE_TIMEOUT
    (the compatible ones return -1, the raising ones raise code -1)."""
    forms = [
        "transfer_sync",
        "batch_transfer_sync_read",
        "batch_transfer_sync",
        "read",
        "batch_read",
    ]
    cases = [f"read_sync:{f}" for f in forms]
    results = run_child(peer, cases, {"MC_SLICE_TIMEOUT": "1"})
    for case in cases:
        check(results[case], -1)


def test_a_failed_wait_keeps_the_objects_of_the_batches_it_gives_up(peer):
    results = run_child(peer, ["failed_wait"])
    check(results["failed_wait"], -1)


def test_ending_the_engine_releases_objects_after_every_transfer_has_stopped(peer):
    """close(), initialize() again, and collecting the engine object end the
    in-flight batch: its object is released, and no byte arrives later."""
    cases = ["ended:close", "ended:initialize", "ended:collect"]
    results = run_child(peer, cases)
    for case in cases:
        check(results[case], 0)


class Watched(bytearray):
    """A bytearray a weak reference can watch."""


def test_objects_are_released_as_soon_as_their_transfer_has_ended(make_engine):
    """Nothing is kept longer than the engine needs it: after a completed,
    failed or refused transfer, and after an asynchronous batch is seen
    finished, the object is freed as soon as the caller drops it."""
    a, b = make_engine(), make_engine()
    remote = bytearray(1 << 20)
    base = b.register(remote)
    target = b.local_name

    def released(call) -> bool:
        obj = Watched(pattern(4096, 1))
        ref = weakref.ref(obj)
        call(obj)
        del obj
        return ref() is None

    assert released(lambda o: a.write(target, o, base))
    assert released(lambda o: a.read(target, o, base))
    assert released(lambda o: a.batch_read(target, [o], [base]))
    assert released(lambda o: a.transfer_sync_write(target, o, base, len(o)))
    assert released(lambda o: a.transfer_sync_write(target, o, 8, len(o)))  # fails
    assert released(lambda o: a.transfer_sync_write("127.0.0.1:1", o, base, len(o)))  # refused
    assert released(lambda o: a.batch_transfer_async_write("127.0.0.1:1", [o], [base], [len(o)]))

    def waited(o) -> None:
        bid = a.batch_transfer_async_read(target, [o], [base], [len(o)])
        assert a.get_batch_transfer_status([bid]) == 0

    def polled(o) -> None:
        bid = a.transfer_submit_write(target, o, base, len(o))
        while a.transfer_check_status(bid) == 0:
            pass

    assert released(waited)
    assert released(polled)
    assert remote[:4096] == pattern(4096, 1)


class Storage:
    """What `register` uses of a torch.UntypedStorage: data_ptr(), nbytes(),
    resizable(), and resize_() that moves the bytes to new memory (as
    torch does, freeing the old memory)."""

    def __init__(self, n: int, resizable: bool) -> None:
        self.mem = ctypes.create_string_buffer(n)
        self.can_resize = resizable

    def data_ptr(self) -> int:
        return ctypes.addressof(self.mem)

    def nbytes(self) -> int:
        return len(self.mem)

    def resizable(self) -> bool:
        return self.can_resize

    def resize_(self, n: int) -> None:
        assert self.can_resize, "Trying to resize storage that is not resizable"
        old, self.mem = self.mem, ctypes.create_string_buffer(n)
        ctypes.memmove(self.mem, old, min(n, len(old)))


class Tensor:
    """A CPU tensor over a Storage: data_ptr(), nbytes, untyped_storage(),
    resize_() and set_() (which points it at another storage, dropping its
    reference to the old one)."""

    def __init__(self, storage: Storage, offset: int = 0, nbytes: int | None = None) -> None:
        self.storage, self.offset = storage, offset
        self.nbytes = storage.nbytes() - offset if nbytes is None else nbytes
        self.is_cuda = False

    def data_ptr(self) -> int:
        return self.storage.data_ptr() + self.offset

    def untyped_storage(self) -> Storage:
        return self.storage

    def is_contiguous(self) -> bool:
        return True

    def resize_(self, nbytes: int) -> None:
        self.storage.resize_(self.offset + nbytes)
        self.nbytes = nbytes

    def set_(self, storage: Storage) -> None:
        self.storage, self.offset, self.nbytes = storage, 0, storage.nbytes()


def test_register_refuses_a_tensor_whose_storage_can_be_resized(engine):
    """`t.resize_(bigger)` moves a resizable storage's bytes to new memory
    and frees the registered memory, whatever references are held: such a
    tensor is refused, and nothing is registered."""
    t = Tensor(Storage(4096, resizable=True))
    with pytest.raises(ValueError, match="resizable"):
        engine.register(t)
    with pytest.raises(TransferError) as err:
        engine.unregister(t.data_ptr())
    assert err.value.code == -3


def test_register_pins_a_tensors_storage(make_engine):
    """A tensor with a fixed-size storage is registered, and the storage
    itself stays alive while registered, also after the tensor is pointed
    at other memory and dropped; peers' bytes land in it."""
    a, b = make_engine(), make_engine()
    storage = Storage(8192, resizable=False)
    t = Tensor(storage, offset=4096)
    base = b.register(t)
    assert base == storage.data_ptr() + 4096
    gone = weakref.ref(storage)
    del storage
    t.set_(Storage(16, resizable=False))
    del t
    assert gone() is not None, "the registered storage was freed"
    data = pattern(4096, 5)
    a.write(b.local_name, data, base)
    assert gone().mem.raw[4096:] == data
    b.unregister(base)
    assert gone() is None, "unregister kept the storage"


def test_register_refuses_a_tensor_outside_its_storage(engine):
    t = Tensor(Storage(4096, resizable=False), offset=1024, nbytes=4096)
    with pytest.raises(ValueError, match="storage"):
        engine.register(t)
