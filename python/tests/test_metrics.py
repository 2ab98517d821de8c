"""The engine's Prometheus metrics from Python, parsed with the official
client's parser: after known WRITEs and a READ over TCP between two
engines and a failed WRITE, the counters equal what moved, nothing is in
flight, and the duration histogram counts every task."""

import ctypes
import time

from prometheus_client.parser import text_string_to_metric_families

from conftest import pattern


def samples(engine):
    """{(sample name, sorted labels): value} of the engine's metrics."""
    out = {}
    for family in text_string_to_metric_families(engine.get_metrics_text()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_counters_equal_what_moved(make_engine):
    a, b = make_engine(), make_engine()
    size = 1 << 20
    remote = ctypes.create_string_buffer(size)
    assert b.register_memory(ctypes.addressof(remote), size) == 0
    src = ctypes.create_string_buffer(pattern(size, 3), size)
    assert a.register_memory(ctypes.addressof(src), size) == 0
    writes = [4096, 65536, 200_000]
    for n in writes:
        assert a.transfer_sync_write(b.local_name, ctypes.addressof(src), ctypes.addressof(remote), n) == 0
    assert a.transfer_sync_read(b.local_name, ctypes.addressof(src), ctypes.addressof(remote), 8192) == 0
    bad = ctypes.addressof(remote) + (64 << 20)
    assert a.transfer_sync_write(b.local_name, ctypes.addressof(src), bad, 4096) < 0

    # An end is counted by the thread finishing the task's last slice, a
    # moment after the caller may see the task ended.
    deadline = time.monotonic() + 10
    m = samples(a)
    while m[("transfer_engine_inflight_tasks", ())] and time.monotonic() < deadline:
        time.sleep(0.001)
        m = samples(a)
    tcp_write = (("op", "write"), ("transport", "tcp"))
    tcp_read = (("op", "read"), ("transport", "tcp"))
    assert m[("transfer_engine_transferred_bytes_total", tcp_write)] == sum(writes)
    assert m[("transfer_engine_transferred_bytes_total", tcp_read)] == 8192
    assert m[("transfer_engine_tasks_total", (("op", "write"), ("result", "completed")))] == 3
    assert m[("transfer_engine_tasks_total", (("op", "write"), ("result", "failed")))] == 1
    assert m[("transfer_engine_tasks_total", (("op", "read"), ("result", "completed")))] == 1
    assert m[("transfer_engine_tasks_total", (("op", "write"), ("result", "canceled")))] == 0
    assert m[("transfer_engine_inflight_tasks", ())] == 0
    assert m[("transfer_engine_inflight_bytes", ())] == 0
    assert m[("transfer_engine_task_duration_seconds_count", tcp_write)] == 4
    assert m[("transfer_engine_task_duration_seconds_count", tcp_read)] == 1
    assert m[("transfer_engine_registered_bytes", ())] == size
