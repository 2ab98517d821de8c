"""Two processes running our engine move verified bytes in both directions
over every metadata backend: the P2P handshake, the project's HTTP metadata
server, etcd and redis."""

import signal
import time

import pytest
from checks import exchange
from conftest import connection


@pytest.mark.parametrize("metadata", ["P2PHANDSHAKE", "http", "etcd", "redis"])
def test_two_processes_of_ours(metadata, request, make_engine, spawn_peer):
    conn = connection(request, metadata)
    local = make_engine(conn)
    peer = spawn_peer("ours", conn)
    exchange(local, peer)


def test_a_killed_peer_fails_the_transfer_and_a_new_one_is_reached(make_engine, spawn_peer):
    local = make_engine()
    peer = spawn_peer("ours", "P2PHANDSHAKE")
    buf = bytearray(4096)
    assert local.transfer_sync_write(peer.name, buf, peer.addr, 4096) == 0
    peer.kill()
    assert local.transfer_sync_write(peer.name, buf, peer.addr, 4096) == -1
    again = spawn_peer("ours", "P2PHANDSHAKE")
    assert local.transfer_sync_write(again.name, buf, again.addr, 4096) == 0


def test_a_stalled_peer_ends_a_sync_transfer_at_mc_slice_timeout(spawn_peer):
    """A peer stopped with SIGSTOP never answers. With MC_SLICE_TIMEOUT=1
    the engine reports the task TIMEOUT after a second and the synchronous
    call returns -1 then, not at its own deadline (MC_TRANSFER_TIMEOUT,
    60 s here); once the peer runs again, transfers to it work."""
    target = spawn_peer("ours", "P2PHANDSHAKE")
    initiator = spawn_peer(
        "ours", "P2PHANDSHAKE", env={"MC_SLICE_TIMEOUT": "1", "MC_TRANSFER_TIMEOUT": "60"}
    )
    args = dict(target=target.name, off=0, remote=target.addr, len=1 << 20)
    assert initiator.call("write", **args)["rc"] == 0
    target.signal(signal.SIGSTOP)
    try:
        start = time.monotonic()
        assert initiator.call("write", **args)["rc"] == -1
        took = time.monotonic() - start
    finally:
        target.signal(signal.SIGCONT)
    assert took < 30, f"the stalled write took {took:.1f} s: MC_SLICE_TIMEOUT was not honoured"
    initiator.call("fill", seed=5)
    assert initiator.call("write", **args)["rc"] == 0
    assert target.sha(0, 1 << 20) == initiator.sha(0, 1 << 20)


def test_a_sync_call_whose_notification_is_not_delivered_returns_nonzero(spawn_peer):
    """A target whose notification queue holds one (MC_NOTIFY_QUEUE_MAX_COUNT=1)
    takes the first notification; the second is refused (the queue is full),
    tried again for MC_TE_NOTIFY_TIMEOUT_SEC (1 s here) and the synchronous
    call returns -1, though its data landed; the target keeps the first."""
    target = spawn_peer("ours", "P2PHANDSHAKE", env={"MC_NOTIFY_QUEUE_MAX_COUNT": "1"})
    initiator = spawn_peer("ours", "P2PHANDSHAKE", env={"MC_TE_NOTIFY_TIMEOUT_SEC": "1"})
    initiator.call("fill", seed=9)
    write = dict(target=target.name, off=0, remote=target.addr, len=4096, name="kv")
    assert initiator.call("notify_write", msg="first", **write)["rc"] == 0
    start = time.monotonic()
    assert initiator.call("notify_write", msg="second", **write)["rc"] != 0
    assert time.monotonic() - start >= 0.5, "tried again for the window"
    assert target.sha(0, 4096) == initiator.sha(0, 4096), "the data landed"
    assert target.call("notifies")["notifies"] == [["kv", "first"]]
