"""Fixtures of the Python suite: engines, peer processes, and private
metadata servers (the project's HTTP metadata server, etcd, redis), each on
free loopback ports with its own temporary directory, stopped at the end.

A missing prerequisite (a server binary, Mooncake's wheel) skips its tests,
or fails them when ``CI=true`` or ``TE_REQUIRE_SERVERS=1``, so a broken
installation cannot turn the suite green.
"""

import json
import os
import pathlib
import queue
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid

import pytest

# Many tests contact dead peers on purpose; the handshake client retries a
# refused connection until MC_HANDSHAKE_CONNECT_TIMEOUT (5 s) has passed.
# The engine reads its configuration when the package is imported; peer
# processes inherit it.
os.environ.setdefault("MC_HANDSHAKE_CONNECT_TIMEOUT", "1")

from transfer_engine import TransferEngine  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
PEER = pathlib.Path(__file__).resolve().with_name("peer.py")
REQUIRED = os.environ.get("CI", "").lower() == "true" or os.environ.get("TE_REQUIRE_SERVERS") == "1"
READY_TIMEOUT = 15.0
REPLY_TIMEOUT = 90.0


def need(ok: bool, why: str) -> None:
    """Skips (or, in CI, fails) the calling test unless `ok`."""
    if ok:
        return
    if REQUIRED:
        pytest.fail(f"{why} (a missing prerequisite fails with CI=true or TE_REQUIRE_SERVERS=1)")
    pytest.skip(why)


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pattern(n: int, seed: int) -> bytes:
    """Deterministic bytes for data checks."""
    return random.Random(seed).randbytes(n)


def unique(tag: str) -> str:
    """A segment name no other test (or run) uses in a shared store."""
    return f"{tag}-{uuid.uuid4().hex[:10]}"


def mooncake_engine():
    """Mooncake's `mooncake.engine` module, or a skip (a failure in CI)."""
    try:
        import mooncake.engine as m
    except ImportError as e:
        need(False, f"mooncake-transfer-engine-non-cuda is not installed ({e})")
    return m


class Server:
    """A server child process logging to a file, stopped by `stop`."""

    def __init__(self, what: str, args: list, log: pathlib.Path) -> None:
        self.what, self.log = what, log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )

    def wait_ready(self, ready) -> bool:
        """Polls `ready()`; False if the server exited because its port was
        taken (the caller retries on other ports)."""
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if ready():
                return True
            if self.proc.poll() is not None:
                text = self.log.read_text(errors="replace")
                if "address already in use" in text.lower():
                    return False
                raise RuntimeError(f"{self.what} exited during startup:\n{text[-3000:]}")
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.what} not ready within {READY_TIMEOUT} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def http_ok(url: str) -> bool:
    """Whether an HTTP server answers `url` (any status)."""
    try:
        with urllib.request.urlopen(url, timeout=0.5):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def find_binary(env: str, name: str, candidates=()) -> str:
    path = os.environ.get(env)
    if path:
        need(os.path.isfile(path), f"{env}={path} is not a file")
        return path
    for c in candidates:
        if c.is_file():
            return str(c)
    found = shutil.which(name) or next(
        (p for p in (f"/usr/bin/{name}", f"/usr/local/bin/{name}") if os.path.isfile(p)), None
    )
    need(found is not None, f"{name} is not installed (or set {env})")
    return found


def start_server(what: str, tmp: pathlib.Path, make_args, ready_url) -> tuple:
    """Starts a server on free ports (3 attempts); returns (server, ports)."""
    for attempt in range(3):
        ports = (free_port(), free_port())
        log = tmp / f"{what}-{attempt}.log"
        server = Server(what, make_args(ports), log)
        if server.wait_ready(lambda: ready_url(ports)):
            return server, ports
    raise RuntimeError(f"{what}: no free ports after 3 attempts")


@pytest.fixture(scope="session")
def metadata_server(tmp_path_factory):
    """The project's HTTP metadata server: `http://127.0.0.1:<port>/metadata`."""
    exe = find_binary(
        "TE_METADATA_SERVER_BIN",
        "transfer-engine-metadata-server",
        [
            REPO / "target" / "debug" / "transfer-engine-metadata-server",
            REPO / "target" / "release" / "transfer-engine-metadata-server",
        ],
    )
    tmp = tmp_path_factory.mktemp("metadata-server")
    server, (port, _) = start_server(
        "metadata-server",
        tmp,
        lambda p: [exe, "--addr", f"127.0.0.1:{p[0]}"],
        lambda p: http_ok(f"http://127.0.0.1:{p[0]}/metadata?key=probe"),
    )
    yield f"http://127.0.0.1:{port}/metadata"
    server.stop()


@pytest.fixture(scope="session")
def etcd(tmp_path_factory):
    """A private single-member etcd: `etcd://127.0.0.1:<port>`."""
    exe = find_binary("TE_ETCD_BIN", "etcd")
    tmp = tmp_path_factory.mktemp("etcd")

    def args(p):
        client, peer = f"http://127.0.0.1:{p[0]}", f"http://127.0.0.1:{p[1]}"
        return [
            exe, "--name", "default", "--data-dir", str(tmp / f"data-{p[0]}"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"default={peer}", "--log-level", "warn",
        ]  # fmt: skip

    def healthy(p):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{p[0]}/health", timeout=0.5) as r:
                return b"true" in r.read()
        except OSError:
            return False

    server, (port, _) = start_server("etcd", tmp, args, healthy)
    yield f"etcd://127.0.0.1:{port}"
    server.stop()


@pytest.fixture(scope="session")
def redis(tmp_path_factory):
    """A private redis-server without persistence: `redis://127.0.0.1:<port>`."""
    exe = find_binary("TE_REDIS_SERVER_BIN", "redis-server")
    tmp = tmp_path_factory.mktemp("redis")

    def args(p):
        return [
            exe, "--port", str(p[0]), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(tmp), "--daemonize", "no",
            "--loglevel", "warning",
        ]  # fmt: skip

    def pong(p):
        try:
            with socket.create_connection(("127.0.0.1", p[0]), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    server, (port, _) = start_server("redis", tmp, args, pong)
    yield f"redis://127.0.0.1:{port}"
    server.stop()


STORES = {"http": "metadata_server", "etcd": "etcd", "redis": "redis"}


def connection(request, kind: str) -> str:
    """The connection string of metadata backend `kind` (P2PHANDSHAKE or a
    store fixture's server)."""
    if kind == "P2PHANDSHAKE":
        return kind
    return request.getfixturevalue(STORES[kind])


def engine_name(conn: str, tag: str) -> str:
    """The name to initialize an engine with: P2P renames `127.0.0.1` to
    `127.0.0.1:<port>`; in a store names must be unique."""
    return "127.0.0.1" if conn == "P2PHANDSHAKE" else unique(tag)


@pytest.fixture
def make_engine():
    """Creates initialized engines of ours, closed at the end of the test."""
    made = []

    def make(conn: str = "P2PHANDSHAKE", tag: str = "ours") -> TransferEngine:
        e = TransferEngine()
        rc = e.initialize(engine_name(conn, tag), conn, "tcp", "")
        assert rc == 0, f"initialize over {conn} returned {rc}"
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


@pytest.fixture
def engine(make_engine) -> TransferEngine:
    """One engine of ours in P2P mode on 127.0.0.1."""
    return make_engine()


class Peer:
    """A peer process (tests/peer.py) running our engine or Mooncake's."""

    def __init__(
        self, impl: str, conn: str, size: int, protocol: str = "tcp", env: dict | None = None
    ) -> None:
        self.impl = impl
        name = engine_name(conn, impl)
        self.proc = subprocess.Popen(
            [sys.executable, str(PEER), impl, conn, name, str(size), protocol],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.replies: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        hello = self._reply()
        assert hello["rc"] == 0, f"{impl} peer failed to start over {conn}: {hello}"
        self.name, self.addr, self.size = hello["name"], hello["addr"], hello["size"]

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.replies.put(line)
        self.replies.put(None)

    def _reply(self) -> dict:
        try:
            line = self.replies.get(timeout=REPLY_TIMEOUT)
        except queue.Empty:
            self.kill()
            raise AssertionError(f"{self.impl} peer did not answer within {REPLY_TIMEOUT} s")
        if line is None:
            raise AssertionError(f"{self.impl} peer exited (code {self.proc.wait()})")
        return json.loads(line)

    def call(self, op: str, **args) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def sha(self, off: int, n: int) -> str:
        return self.call("sha", off=off, len=n)["sha"]

    def quit(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(15)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def signal(self, sig: int) -> None:
        """Sends `sig`; a SIGSTOP returns once the process is stopped (a
        transfer started after it finds it stopped, not about to stop)."""
        self.proc.send_signal(sig)
        if sig == signal.SIGSTOP:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                with open(f"/proc/{self.proc.pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                        return
                time.sleep(0.001)


@pytest.fixture
def spawn_peer():
    """Starts peer processes; they quit (or are killed) after the test."""
    peers = []

    def spawn(
        impl: str, conn: str, size: int = 4 << 20, protocol: str = "tcp", env: dict | None = None
    ) -> Peer:
        if impl == "mooncake":
            mooncake_engine()
        peer = Peer(impl, conn, size, protocol, env)
        peers.append(peer)
        return peer

    yield spawn
    for p in peers:
        p.quit()
