"""Two processes running our engine move verified bytes in both directions
over every metadata backend: the P2P handshake, the project's HTTP metadata
server, etcd and redis."""

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
