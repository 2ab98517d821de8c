#!/usr/bin/env python3
"""bench-sweep.py: throughput against block size for every transport this
host has, each beside its physical anchor measured in the same run.

    scripts/bench-sweep.py [--blocks 4K,64K,1M,...] [--ops write,read]
                           [--duration S] [--runs N] [--threads N]
                           [--out DIR]

Builds release with CMake (build/, or $BUILD_DIR). Transports: local
(in-process copies, c-examples/local_bench, WRITE only: a local READ is
the same copy), shm (caller memory, cross-memory attach), shm with engine
buffers (te_allocate_buffer: memfds, copied with memcpy) and tcp over
loopback, each between two processes through transfer_bench targets on
127.0.0.1 (P2PHANDSHAKE). Anchors, measured between the points of the
same run: memcpy of the same block by the same number of threads
(local_bench's baseline) for local and shm with engine buffers;
cross-memory attach by one thread (c-examples/cma_bench: process_vm_readv
from another process, in calls of at most 256 KiB as the transport
makes them), the kernel's ceiling for caller memory, for shm; iperf3 on
loopback with as
many streams as threads and the block as its buffer length (at most 1
MiB, iperf3's largest) for tcp; RDMA is swept by scripts/bench-rdma.sh in
the soft-RoCE VM, beside ib_write_bw.

Each point is the median of --runs runs of --duration seconds; batches
hold up to 64 requests and at most 256 MiB. Progress is printed as each
point is measured; then the table. Writes DIR/sweep.csv (transport, op,
block_bytes, gb_per_s, requests_per_s, anchor, anchor_gb_per_s, ratio)
and DIR/sweep.svg (GB/s against block size, log scale, one line per
transport and operation, the anchors dashed), drawn with matplotlib (a
virtualenv build/bench-venv with it is made when this Python has none).
Defaults: blocks 4 KiB to 64 MiB by powers of 4, WRITE and READ, 1 run of
1 s, 1 thread, DIR build/bench-sweep. GB = 1e9 bytes. A benchmark, not a
test: the exit status is non-zero only when something failed to run.
"""

import argparse
import csv
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("BUILD_DIR", os.path.join(ROOT, "build"))
BUFFER = 256 << 20
IPERF_MAX_LEN = 1 << 20


def ensure_matplotlib():
    """Re-runs this script in build/bench-venv (made once) when this Python
    cannot import matplotlib."""
    try:
        import matplotlib  # noqa: F401

        return
    except ImportError:
        pass
    venv = os.path.join(ROOT, "build", "bench-venv")
    py = os.path.join(venv, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(venv):
        sys.exit("bench-sweep: matplotlib is missing from %s" % venv)
    if not os.path.exists(py):
        print("bench-sweep: making %s with matplotlib" % venv, flush=True)
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([py, "-m", "pip", "install", "--quiet", "matplotlib"], check=True)
    os.execv(py, [py] + sys.argv)


def size_arg(text):
    """4K, 64K, 1M, 64M or a number of bytes."""
    m = re.fullmatch(r"([0-9]+)([KMG]?)", text.strip().upper())
    if not m:
        raise argparse.ArgumentTypeError("not a size: %r" % text)
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def human(n):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return "%d %s" % (n >> shift, unit)
    return "%d B" % n


def batch_for(block):
    return max(1, min(64, BUFFER // block))


class Targets:
    """transfer_bench targets on 127.0.0.1 and an iperf3 server."""

    def __init__(self, tmp, bench):
        self.procs = []
        self.segments = {}
        flags = {"shm": ["--protocol", "shm"],
                 "shm-engine-buffers": ["--protocol", "shm", "--engine_buffers"],
                 "tcp": ["--protocol", "tcp"]}
        self.flags = flags
        for who, f in flags.items():
            out = open(os.path.join(tmp, "target-%s.out" % who), "w+")
            p = subprocess.Popen([bench, "--mode", "target", *f, "--metadata_server", "P2PHANDSHAKE",
                                  "--local_server_name", "127.0.0.1", "--buffer_size", str(BUFFER)],
                                 stdout=out, stderr=subprocess.DEVNULL)
            self.procs.append(p)
            self.segments[who] = self.wait_segment(out, p, who)
        self.iperf_port = 15201
        self.procs.append(subprocess.Popen(["iperf3", "-s", "-p", str(self.iperf_port)],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(0.5)

    @staticmethod
    def wait_segment(out, proc, who):
        deadline = time.time() + 60
        while time.time() < deadline:
            out.seek(0)
            m = re.search(r"^segment (\S+) base ([0-9]+) size ([0-9]+)", out.read(), re.M)
            if m:
                return m.group(1), int(m.group(2))
            if proc.poll() is not None:
                sys.exit("bench-sweep: the %s target exited" % who)
            time.sleep(0.1)
        sys.exit("bench-sweep: the %s target printed no segment line" % who)

    def stop(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()


def run_bench(bench, targets, who, op, block, args):
    """One transfer_bench initiator run -> (GB/s, requests/s)."""
    name, base = targets.segments[who]
    batch = batch_for(block)
    cmd = [bench, "--mode", "initiator", *targets.flags[who], "--metadata_server", "P2PHANDSHAKE",
           "--local_server_name", "127.0.0.1", "--segment_id", name, "--target_base", str(base),
           "--target_size", str(BUFFER), "--operation", op, "--block_size", str(block),
           "--batch_size", str(batch), "--threads", str(args.threads), "--duration", str(args.duration),
           "--buffer_size", str(BUFFER), "--report_unit", "GB", "--report_precision", "4"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.duration + 120)
    m = re.search(r"Test completed: duration ([0-9.]+), batch count ([0-9]+), throughput ([0-9.]+) GB/s",
                  r.stdout)
    if r.returncode != 0 or not m:
        sys.exit("bench-sweep: %s %s of %d B failed:\n%s%s" % (who, op, block, r.stdout[-2000:],
                                                              r.stderr[-2000:]))
    d, n, gbs = float(m.group(1)), int(m.group(2)), float(m.group(3))
    return gbs, n * batch / d


def run_local(args, block):
    """local_bench at one block -> ((engine GB/s, requests/s), memcpy GB/s)."""
    r = subprocess.run([os.path.join(BUILD, "local_bench"), "--duration", str(args.duration), "--runs", "1",
                        "--threads", str(args.threads), "--blocks", str(block >> 10)],
                       capture_output=True, text=True, timeout=args.duration * 10 + 120)
    m = re.search(r"engine=([0-9.]+) GB/s \(([0-9]+) req/s\) memcpy=([0-9.]+) GB/s", r.stdout)
    if r.returncode != 0 or not m:
        sys.exit("bench-sweep: local_bench failed:\n%s%s" % (r.stdout[-2000:], r.stderr[-2000:]))
    return (float(m.group(1)), float(m.group(2))), float(m.group(3))


def run_cma(args, block):
    """cma_bench at one block -> process_vm_readv GB/s (one thread)."""
    r = subprocess.run([os.path.join(BUILD, "cma_bench"), "--block", str(block), "--duration", str(args.duration)],
                       capture_output=True, text=True, timeout=args.duration * 4 + 60)
    m = re.search(r"process_vm_readv=([0-9.]+) GB/s", r.stdout)
    if r.returncode != 0 or not m:
        sys.exit("bench-sweep: cma_bench failed:\n%s%s" % (r.stdout[-2000:], r.stderr[-2000:]))
    return float(m.group(1))


def run_iperf(targets, args, block):
    """iperf3 on loopback, --threads streams, buffer length min(block, 1 MiB) -> GB/s."""
    r = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", str(targets.iperf_port), "-J",
                        "-t", str(max(1, round(args.duration))), "-P", str(args.threads),
                        "-l", str(min(block, IPERF_MAX_LEN))],
                       capture_output=True, text=True, timeout=args.duration + 60)
    try:
        return json.loads(r.stdout)["end"]["sum_received"]["bits_per_second"] / 8e9
    except (ValueError, KeyError) as e:
        sys.exit("bench-sweep: iperf3 failed (%s):\n%s" % (e, r.stdout[-2000:] + r.stderr[-2000:]))


def draw(rows, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    series = {}
    anchors = {}
    for r in rows:
        series.setdefault("%s %s" % (r["transport"], r["op"]), []).append((r["block_bytes"], r["gb_per_s"]))
        anchors.setdefault(r["anchor"], {})[r["block_bytes"]] = r["anchor_gb_per_s"]
    for label, pts in sorted(series.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    for label, pts in sorted(anchors.items()):
        xs = sorted(pts)
        ax.plot(xs, [pts[x] for x in xs], linestyle="--",
                color={"memcpy": "black", "iperf3": "grey"}.get(label, "tab:brown"), label=label + " (anchor)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({r["block_bytes"] for r in rows}))
    ax.set_xticklabels([human(b) for b in sorted({r["block_bytes"] for r in rows})])
    ax.set_xlabel("block size")
    ax.set_ylabel("GB/s")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    fig.savefig(path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", default="4K,16K,64K,256K,1M,4M,16M,64M",
                   type=lambda s: [size_arg(x) for x in s.split(",")])
    p.add_argument("--ops", default="write,read", type=lambda s: s.split(","))
    p.add_argument("--duration", type=float, default=1.0)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=os.path.join(ROOT, "build", "bench-sweep"))
    args = p.parse_args()
    if any(b < 4096 or b > 64 << 20 or b % 1024 for b in args.blocks):
        sys.exit("bench-sweep: blocks are whole KiB from 4 KiB to 64 MiB")
    if any(o not in ("write", "read") for o in args.ops):
        sys.exit("bench-sweep: --ops takes write and read")
    ensure_matplotlib()
    if not shutil.which("iperf3"):
        sys.exit("bench-sweep: iperf3 is required (scripts/setup.sh installs it)")
    subprocess.run(["cmake", "-S", ROOT, "-B", BUILD, "-DCMAKE_BUILD_TYPE=Release"], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", BUILD, "-j", os.environ.get("JOBS", "2"), "--target", "transfer_bench",
                    "local_bench", "cma_bench"], check=True, stdout=subprocess.DEVNULL)
    bench = os.path.join(BUILD, "transfer_bench")
    os.makedirs(args.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="te-bench-sweep.")
    targets = Targets(tmp, bench)
    samples = {}
    cases = [(w, o) for w in ("shm", "shm-engine-buffers", "tcp") for o in args.ops]
    total = len(args.blocks) * args.runs * (len(cases) + 3)
    done = 0
    t0 = time.time()

    def progress(what, value):
        nonlocal done
        done += 1
        print("[%3d/%d %5.0f s] %-36s %8.3f GB/s" % (done, total, time.time() - t0, what, value), flush=True)

    try:
        for run in range(args.runs):
            for block in args.blocks:
                (gbs, rps), mem = run_local(args, block)
                samples.setdefault(("local", "write", block), []).append((gbs, rps))
                samples.setdefault(("memcpy", block), []).append(mem)
                progress("local WRITE %s (memcpy %.2f)" % (human(block), mem), gbs)
                cma = run_cma(args, block)
                samples.setdefault(("process_vm_readv", block), []).append(cma)
                progress("process_vm_readv %s" % human(block), cma)
                ip = run_iperf(targets, args, block)
                samples.setdefault(("iperf3", block), []).append(ip)
                progress("iperf3 -l %s" % human(min(block, IPERF_MAX_LEN)), ip)
                for who, op in cases:
                    gbs, rps = run_bench(bench, targets, who, op, block, args)
                    samples.setdefault((who, op, block), []).append((gbs, rps))
                    progress("%s %s %s" % (who, op.upper(), human(block)), gbs)
    finally:
        targets.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    rows = []
    for (key, vals) in samples.items():
        if len(key) != 3:
            continue
        who, op, block = key
        anchor = {"tcp": "iperf3", "shm": "process_vm_readv"}.get(who, "memcpy")
        a = statistics.median(samples[(anchor, block)])
        g = statistics.median(v[0] for v in vals)
        rows.append({"transport": who, "op": op, "block_bytes": block, "gb_per_s": round(g, 4),
                     "requests_per_s": round(statistics.median(v[1] for v in vals)),
                     "anchor": anchor, "anchor_gb_per_s": round(a, 4), "ratio": round(g / a, 3)})
    rows.sort(key=lambda r: (r["transport"], r["op"], r["block_bytes"]))
    csv_path = os.path.join(args.out, "sweep.csv")
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    title = "one host (%d CPUs), %d thread(s), median of %d run(s) of %g s" % (
        os.cpu_count(), args.threads, args.runs, args.duration)
    svg_path = os.path.join(args.out, "sweep.svg")
    draw(rows, svg_path, title)
    print()
    print("# " + title)
    print("%-20s %-5s %9s %10s %12s %-16s %10s %6s" % ("transport", "op", "block", "GB/s", "requests/s",
                                                      "anchor", "anchor", "ratio"))
    for r in rows:
        print("%-20s %-5s %9s %10.3f %12d %-16s %10.3f %6.2f" % (
            r["transport"], r["op"], human(r["block_bytes"]), r["gb_per_s"], r["requests_per_s"],
            r["anchor"], r["anchor_gb_per_s"], r["ratio"]))
    print("\nwrote %s and %s" % (csv_path, svg_path))


if __name__ == "__main__":
    main()
