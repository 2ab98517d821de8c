"""Our engine and real Mooncake (`mooncake-transfer-engine-non-cuda` from
PyPI) move verified bytes in both directions: our engine in this process,
Mooncake's `mooncake.engine.TransferEngine` in a peer process, each side
initiating WRITEs, READs, batches and notifications.

`protocol` is what both sides pass to `initialize` (the transport itself
is chosen by auto-discovery, in both engines): `tcp` by default, and the
comma-separated list in TE_INTEROP_PROTOCOLS where more exist (e.g.
`tcp,rdma` on a machine with RDMA devices; the RDMA VM suite runs `rdma`).
The metadata backends are those the Mooncake wheel supports (it has no
redis plugin).
"""

import os

import pytest
from checks import exchange
from conftest import connection, engine_name

from transfer_engine import TransferEngine

PROTOCOLS = os.environ.get("TE_INTEROP_PROTOCOLS", "tcp").split(",")


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("metadata", ["P2PHANDSHAKE", "http", "etcd"])
def test_ours_and_mooncake_move_bytes_both_ways(protocol, metadata, request, spawn_peer):
    conn = connection(request, metadata)
    peer = spawn_peer("mooncake", conn, protocol=protocol)
    local = TransferEngine()
    assert local.initialize(engine_name(conn, "ours"), conn, protocol, "") == 0
    try:
        exchange(local, peer, registered_reads=protocol == "rdma")
    finally:
        local.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_ours_and_mooncake_as_separate_processes(protocol, spawn_peer):
    """A Mooncake process and a process of ours, neither being the test."""
    moon = spawn_peer("mooncake", "P2PHANDSHAKE", protocol=protocol)
    ours = spawn_peer("ours", "P2PHANDSHAKE", protocol=protocol)
    ours.call("fill", seed=1)
    moon.call("fill", seed=2)
    n = 1 << 20
    assert ours.call("write", target=moon.name, off=0, remote=moon.addr, len=n)["rc"] == 0
    assert moon.sha(0, n) == ours.sha(0, n)
    moon.call("fill", seed=3)
    assert moon.call("write", target=ours.name, off=0, remote=ours.addr + 7, len=n - 7)["rc"] == 0
    assert ours.sha(7, n - 7) == moon.sha(0, n - 7)
