#!/usr/bin/env python3
"""PUT and GET latency of transfer-engine-metadata-server holding many keys.

usage: scripts/bench-metadata.py [--server PATH] [--keys N] [--value BYTES]
                                 [--ops N] [--runs N]
       scripts/bench-metadata.py [--server PATH] --unread N [--value BYTES]

Writes a data file of N keys (default 10000) with values of BYTES bytes
(default 1024, a descriptor with a few buffers), starts the server binary
(default target/release/transfer-engine-metadata-server) on it with --data
in a temporary directory, and measures, each client on one kept-alive
connection:

  PUT          overwriting random keys, one after the other
  GET          random keys, one after the other
  GET + PUTs   random keys while another client PUTs without pause

Prints the median, 99th percentile and maximum of each, in microseconds,
over --runs runs of --ops operations (defaults 3 and 300), beside the
limit a PUT cannot beat, measured in the same directory: appending a value
to a file and fdatasync. The log is compacted after about as many bytes of
PUTs as the data file holds (10,000 PUTs here): --ops 12000 --runs 1
includes one. The data file is the server's format in every version, so
the same command measures an older binary: --server /path/to/old/binary.

With --unread N: PUTs one value of --value bytes (16 MiB with --unread),
opens N clients that GET it and never read the reply, and meanwhile
GETs a small key 32 times from a normal client; prints the server's
resident memory (VmRSS before, VmHWM after) and the normal GETs' latency.
"""

import argparse
import http.client
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def value_of(i, size):
    """A JSON value of about `size` bytes, different for each `i`."""
    head = '{"i":%d,"pad":"' % i
    return (head + "x" * max(0, size - len(head) - 2) + '"}').encode()


def start(server, data):
    """Starts the server on a free port; returns (process, port)."""
    proc = subprocess.Popen(
        [server, "--addr", "127.0.0.1:0", "--data", data],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = proc.stdout.readline()
    m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", line)
    if not m:
        proc.kill()
        sys.exit("the server did not start: %r" % line)
    return proc, int(m.group(1))


def timed(conn, method, key, body=None):
    """One request; returns its latency in microseconds."""
    t = time.perf_counter()
    conn.request(method, "/metadata?key=" + key, body=body)
    r = conn.getresponse()
    r.read()
    took = (time.perf_counter() - t) * 1e6
    if r.status != 200:
        sys.exit("%s %s: status %d" % (method, key, r.status))
    return took


def fsync_limit(path, size, ops):
    """Latencies of appending `size` bytes to a file and fdatasync."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    out = []
    try:
        for i in range(ops):
            t = time.perf_counter()
            os.write(fd, value_of(i, size) + b"\n")
            os.fdatasync(fd)
            out.append((time.perf_counter() - t) * 1e6)
    finally:
        os.close(fd)
    return out


def summary(name, samples):
    samples = sorted(samples)
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
    print(
        "%-12s median %9.0f us   p99 %9.0f us   max %9.0f us   (%d requests)"
        % (name, statistics.median(samples), p99, samples[-1], len(samples))
    )


def rss_kb(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def unread(args):
    """Clients that never read the replies of one large value."""
    import socket

    size = args.value if args.value != 1024 else 16 << 20
    with tempfile.TemporaryDirectory(prefix="te-bench-metadata-") as tmp:
        proc, port = start(args.server, os.path.join(tmp, "data.json"))
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            timed(conn, "PUT", "big", value_of(0, size))
            timed(conn, "PUT", "small", b'{"v":1}')
            before = rss_kb(proc.pid, "VmRSS")
            stalled = []
            for _ in range(args.unread):
                s = socket.create_connection(("127.0.0.1", port))
                s.sendall(b"GET /metadata?key=big HTTP/1.1\r\nHost: x\r\n\r\n")
                stalled.append(s)
            lat, failed = [], 0
            for _ in range(32):
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                t = time.perf_counter()
                try:
                    lat.append(timed(c, "GET", "small"))
                except (OSError, http.client.HTTPException):
                    failed += 1
                    lat.append((time.perf_counter() - t) * 1e6)
                c.close()
                time.sleep(0.02)
            for s in stalled:
                s.recv(1, socket.MSG_PEEK)
            peak = rss_kb(proc.pid, "VmHWM")
            now = rss_kb(proc.pid, "VmRSS")
        finally:
            proc.terminate()
            proc.wait()
    print(
        "%s: %d clients not reading a %d MiB value: RSS %d MiB before, %d MiB after, "
        "peak %d MiB" % (args.server, args.unread, size >> 20, before >> 10, now >> 10, peak >> 10)
    )
    summary("normal GET", lat)
    slow = sum(1 for l in lat if l > 2e6)
    print("normal GETs failed: %d of 32; over 2 s: %d of 32" % (failed, slow))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--server",
        default=os.path.join(ROOT, "target/release/transfer-engine-metadata-server"),
    )
    ap.add_argument("--keys", type=int, default=10000)
    ap.add_argument("--value", type=int, default=1024)
    ap.add_argument("--ops", type=int, default=300)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--unread", type=int, default=0)
    args = ap.parse_args()
    if args.unread:
        return unread(args)

    rng = random.Random(1)
    keys = ["mooncake/ram/10.0.%d.%d:%d" % (i // 250, i % 250, 12000 + i) for i in range(args.keys)]
    puts, gets, gets_busy, puts_busy, syncs = [], [], [], [], []
    with tempfile.TemporaryDirectory(prefix="te-bench-metadata-") as tmp:
        data = os.path.join(tmp, "data.json")
        with open(data, "w") as f:
            json.dump({k: value_of(i, args.value).decode() for i, k in enumerate(keys)}, f)
        size = os.path.getsize(data)
        for _ in range(args.runs):
            syncs += fsync_limit(os.path.join(tmp, "fsync"), args.value, args.ops)
            proc, port = start(args.server, data)
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port)
                for n in range(args.ops):
                    k = rng.randrange(args.keys)
                    puts.append(timed(conn, "PUT", keys[k], value_of(k + n, args.value)))
                for _ in range(args.ops):
                    gets.append(timed(conn, "GET", keys[rng.randrange(args.keys)]))
                stop = threading.Event()

                def writer():
                    w = http.client.HTTPConnection("127.0.0.1", port)
                    n = 0
                    while not stop.is_set():
                        k = (n * 7919) % args.keys
                        puts_busy.append(timed(w, "PUT", keys[k], value_of(n, args.value)))
                        n += 1

                t = threading.Thread(target=writer)
                t.start()
                time.sleep(0.2)
                for _ in range(args.ops):
                    gets_busy.append(timed(conn, "GET", keys[rng.randrange(args.keys)]))
                stop.set()
                t.join()
            finally:
                proc.terminate()
                proc.wait()
    print(
        "%s: %d keys of %d bytes (data file %.1f MB), %d runs"
        % (args.server, args.keys, args.value, size / 1e6, args.runs)
    )
    summary("PUT", puts)
    summary("GET", gets)
    summary("GET + PUTs", gets_busy)
    summary("(the PUTs)", puts_busy)
    summary("fdatasync", syncs)


if __name__ == "__main__":
    main()
