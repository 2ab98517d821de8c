"""Python threads and the GIL.

The verdicts do not depend on timing: each test needs Python code to run
*while* engine calls are in progress, which only happens if those calls
release the GIL. The metadata server of these tests is written in Python
and runs in this process: an engine call that kept the GIL could never get
an answer from it.

The throughput of 8 threads against 1 is measured and printed, not asserted.
"""

import hashlib
import http.server
import threading
import time
import urllib.parse

import pytest
from conftest import pattern, unique

from transfer_engine import TransferEngine

MiB = 1 << 20


class PyMetadataServer:
    """Mooncake's HTTP metadata protocol (GET/PUT/DELETE /metadata?key=K)
    served by Python threads of this process. `hold(keys, n)` makes the
    first GET of each key wait until `n` of them are waiting at once."""

    def __init__(self) -> None:
        self.data: dict = {}
        self.lock = threading.Lock()
        self.gets = 0
        self.barrier = None
        self.held: set = set()
        self.broken = False
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _key(self):
                return urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query).get("key", [""])[0]

            def _reply(self, code: int, body: bytes = b"") -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                key = self._key()
                with server.lock:
                    server.gets += 1
                    barrier = server.barrier if key in server.held else None
                    server.held.discard(key)
                if barrier is not None:
                    try:
                        barrier.wait()
                    except threading.BrokenBarrierError:
                        server.broken = True
                with server.lock:
                    value = server.data.get(key)
                self._reply(200, value) if value is not None else self._reply(404, b"metadata not found")

            def do_PUT(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with server.lock:
                    server.data[self._key()] = body
                self._reply(200)

            def do_DELETE(self):
                with server.lock:
                    server.data.pop(self._key(), None)
                self._reply(200)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metadata"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def hold(self, keys, n: int, timeout: float) -> None:
        with self.lock:
            self.barrier = threading.Barrier(n, timeout=timeout)
            self.held = set(keys)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def py_metadata():
    server = PyMetadataServer()
    yield server
    server.close()


def test_calls_release_the_gil_while_the_engine_waits_on_python(py_metadata):
    """initialize, register and a first transfer each wait for HTTP answers
    from Python threads of this process; they only come if the GIL is free."""
    a, b = TransferEngine(), TransferEngine()
    try:
        assert a.initialize(unique("gil-a"), py_metadata.url, "tcp", "") == 0
        assert b.initialize(unique("gil-b"), py_metadata.url, "tcp", "") == 0
        remote = bytearray(MiB)
        base = b.register(remote)
        before = py_metadata.gets
        data = pattern(MiB, 7)
        assert a.transfer_sync_write(b.local_name, data, base, MiB) == 0
        assert remote == data
        assert py_metadata.gets > before, "the first transfer did not consult the metadata server"
    finally:
        a.close()
        b.close()


def test_eight_threads_are_inside_transfer_calls_at_once(py_metadata):
    """Eight threads each make a first transfer to their own peer. The
    Python metadata server answers the eight descriptor lookups only once
    all eight are waiting at the same time, so the transfers complete only
    if eight threads were inside the engine concurrently: no GIL, no lock
    of the binding serializing them."""
    n = 8
    initiator = TransferEngine()
    peers = [TransferEngine() for _ in range(n)]
    try:
        assert initiator.initialize(unique("init"), py_metadata.url, "tcp", "") == 0
        memories, addrs = [], []
        for i, p in enumerate(peers):
            assert p.initialize(unique(f"peer{i}"), py_metadata.url, "tcp", "") == 0
            mem = bytearray(MiB)
            addrs.append(p.register(mem))
            memories.append(mem)
        keys = [f"mooncake/ram/{p.local_name}" for p in peers]
        # Shorter than the engine's 3 s HTTP timeout: a broken barrier is
        # reported, not hidden behind a retry.
        py_metadata.hold(keys, n, timeout=2.5)
        results = [None] * n

        def work(i: int) -> None:
            data = pattern(MiB, i)
            target = peers[i].local_name
            rc = initiator.transfer_sync_write(target, data, addrs[i], MiB)
            results[i] = (rc, memories[i] == data)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not py_metadata.broken, "the eight descriptor lookups never waited at the same time"
        assert results == [(0, True)] * n
    finally:
        initiator.close()
        for p in peers:
            p.close()


REGION = 8 * MiB


def run_threads(engine, target: str, base: int, threads: int, size: int, total: int) -> float:
    """`total` bytes of `size`-byte synchronous WRITEs split over `threads`
    threads, thread t writing its pattern over its own REGION; returns
    bytes per second."""
    per_thread = total // threads // size
    payloads = [pattern(size, t) for t in range(threads)]
    errors = []

    def work(t: int) -> None:
        at = base + t * REGION
        for k in range(per_thread):
            rc = engine.transfer_sync_write(target, payloads[t], at + (k * size) % REGION, size)
            if rc != 0:
                errors.append((t, k, rc))

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - start
    assert not errors, errors[:5]
    return per_thread * threads * size / elapsed


def test_eight_threads_move_verified_bytes_and_their_throughput_is_reported(make_engine, spawn_peer, capsys):
    peer = spawn_peer("ours", "P2PHANDSHAKE", size=64 * MiB)
    engine = make_engine()
    figures = []
    for size, total in ((4096, 16 * MiB), (MiB, 512 * MiB)):
        one = run_threads(engine, peer.name, peer.addr, 1, size, total)
        eight = run_threads(engine, peer.name, peer.addr, 8, size, total)
        figures.append((size, one, eight))
    # Every 1 MiB slot of thread t's region holds thread t's pattern.
    for t in range(8):
        for slot in (0, REGION - MiB):
            assert peer.sha(t * REGION + slot, MiB) == hashlib.sha256(pattern(MiB, t)).hexdigest()
    with capsys.disabled():
        for size, one, eight in figures:
            label = "4 KiB" if size == 4096 else "1 MiB"
            print(
                f"\n[python threads] transfer_sync_write {label} over loopback TCP: "
                f"1 thread {one / 1e9:.3f} GB/s ({one / size:,.0f} ops/s), "
                f"8 threads {eight / 1e9:.3f} GB/s ({eight / size:,.0f} ops/s), x{eight / one:.2f}"
            )
