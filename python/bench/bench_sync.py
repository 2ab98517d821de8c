#!/usr/bin/env python3
"""Per-call cost of `transfer_sync_write` from Python, ours beside Mooncake's.

    python bench_sync.py [--runs 5] [--calls 3000] [--mib-calls 300] [--threads 1,8]
                         [--impl ours,mooncake] [--c-bench PATH]

For each implementation (ours: `transfer_engine`; Mooncake's: `mooncake.engine`
from the `mooncake-transfer-engine-non-cuda` wheel, when installed) a target
process of the same implementation registers 64 MiB on loopback
(P2PHANDSHAKE, TCP), and an initiator process times synchronous WRITEs:
`--calls` of 4 KiB (microseconds per call) and `--mib-calls` of 1 MiB
(GB/s), with 1 and with 8 Python threads, and 4 KiB WRITEs to its own
segment (no network: the cost of the call itself). Runs are interleaved so every
implementation sees the same machine state; the table shows medians over
`--runs`. With `--c-bench` (default: build/transfer_bench when present) the
C API's own loop (allocateBatchID, submitTransfer, getTransferStatus,
freeBatchID: `transfer_bench --batch_size 1`, same sizes and threads) is
timed against our target in the same runs: the limit the Python call is
measured against.

A benchmark, not a test: its verdict is the table. GB = 1e9 bytes.
"""

import argparse
import ctypes
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import threading
import time

MiB = 1 << 20
TARGET_SIZE = 64 * MiB
REGION = TARGET_SIZE // 8
ROOT = pathlib.Path(__file__).resolve().parents[2]


def engine_class(impl: str):
    if impl == "ours":
        from transfer_engine import TransferEngine
    else:
        from mooncake.engine import TransferEngine
    return TransferEngine


def serve(impl: str) -> None:
    """Target: registers TARGET_SIZE bytes and waits for stdin to close."""
    engine = engine_class(impl)()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    buf = ctypes.create_string_buffer(TARGET_SIZE)
    addr = ctypes.addressof(buf)
    assert engine.register_memory(addr, TARGET_SIZE) == 0
    print(json.dumps({"name": f"127.0.0.1:{engine.get_rpc_port()}", "addr": addr}), flush=True)
    sys.stdin.read()


def timed(engine, target: str, base: int, size: int, calls: int, threads: int) -> float:
    """Seconds for `calls` WRITEs of `size` bytes spread over `threads`."""
    per = calls // threads
    srcs = [ctypes.create_string_buffer(size) for _ in range(threads)]
    failed = []

    def work(t: int) -> None:
        src = ctypes.addressof(srcs[t])
        at = base + t * REGION
        for k in range(per):
            if engine.transfer_sync_write(target, src, at + (k * size) % REGION, size) != 0:
                failed.append(k)
                return

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - start
    if failed:
        raise SystemExit(f"transfer_sync_write failed ({len(failed)} threads)")
    return elapsed * calls / (per * threads)


def initiate(impl: str, target: str, base: int, calls: int, mib_calls: int, threads: list) -> None:
    engine = engine_class(impl)()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    timed(engine, target, base, 4096, 500, 1)  # connect and warm up
    out = {}
    # The engine's own segment: no network, so what is left is the cost of
    # the call itself (batch, submit, poll, free, GIL) and a 4 KiB copy.
    own = ctypes.create_string_buffer(REGION)
    assert engine.register_memory(ctypes.addressof(own), REGION) == 0
    me = f"127.0.0.1:{engine.get_rpc_port()}"
    timed(engine, me, ctypes.addressof(own), 4096, 500, 1)
    out["us_own_1"] = timed(engine, me, ctypes.addressof(own), 4096, calls, 1) / calls * 1e6
    for t in threads:
        out[f"us_4k_{t}"] = timed(engine, target, base, 4096, calls, t) / calls * 1e6
        out[f"gbs_1m_{t}"] = mib_calls * MiB / timed(engine, target, base, MiB, mib_calls, t) / 1e9
    print(json.dumps(out), flush=True)


def spawn(args: list) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, __file__, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def c_bench(exe: str, target: dict, size: int, threads: int, seconds: float) -> float:
    """Seconds per WRITE (wall time over all threads) of the C API loop of
    transfer_bench: batch 1, `size` bytes, `threads` threads, against our
    target."""
    r = subprocess.run(
        [
            exe, "--mode", "initiator", "--segment_id", target["name"],
            "--target_base", str(target["addr"]), "--target_size", str(TARGET_SIZE),
            "--operation", "write", "--block_size", str(size), "--batch_size", "1",
            "--threads", str(threads), "--duration", str(seconds),
        ],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    m = re.search(r"duration ([\d.]+), batch count (\d+)", r.stdout)
    if not m:
        raise SystemExit(f"unexpected transfer_bench output: {r.stdout!r}")
    return float(m.group(1)) / int(m.group(2))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--calls", type=int, default=3000, help="4 KiB WRITEs per measurement")
    p.add_argument("--mib-calls", type=int, default=300, help="1 MiB WRITEs per measurement")
    p.add_argument("--threads", default="1,8")
    p.add_argument("--impl", default=None, help="ours,mooncake (default: both when installed)")
    p.add_argument("--c-bench", default=str(ROOT / "build" / "transfer_bench"))
    p.add_argument("--serve", help=argparse.SUPPRESS)
    p.add_argument("--initiate", nargs=3, help=argparse.SUPPRESS)
    a = p.parse_args()
    threads = [int(t) for t in a.threads.split(",")]
    if a.serve:
        return serve(a.serve)
    if a.initiate:
        impl, target, base = a.initiate
        return initiate(impl, target, int(base), a.calls, a.mib_calls, threads)

    impls = a.impl.split(",") if a.impl else ["ours", "mooncake"]
    if not a.impl:
        try:
            import mooncake.engine  # noqa: F401
        except ImportError:
            impls = ["ours"]
            print("mooncake.engine is not installed: measuring ours only", file=sys.stderr)
    targets, procs = {}, []
    try:
        for impl in impls:
            proc = spawn(["--serve", impl])
            procs.append(proc)
            targets[impl] = json.loads(proc.stdout.readline())
        results = {impl: [] for impl in impls}
        c_exe = a.c_bench if os.access(a.c_bench, os.X_OK) else None
        if not c_exe:
            print(f"{a.c_bench} not found: no C API column (build it with CMake)", file=sys.stderr)
        c_runs = []
        for run in range(a.runs):
            for impl in impls:
                t = targets[impl]
                args = ["--initiate", impl, t["name"], str(t["addr"]), "--calls", str(a.calls),
                        "--mib-calls", str(a.mib_calls), "--threads", a.threads]  # fmt: skip
                proc = spawn(args)
                out, _ = proc.communicate(timeout=600)
                if proc.returncode != 0:
                    raise SystemExit(f"{impl} initiator failed (exit {proc.returncode})")
                results[impl].append(json.loads(out.strip().splitlines()[-1]))
            if c_exe and "ours" in targets:
                c = {}
                for t in threads:
                    c[f"us_4k_{t}"] = c_bench(c_exe, targets["ours"], 4096, t, 2) * 1e6
                    c[f"gbs_1m_{t}"] = MiB / c_bench(c_exe, targets["ours"], MiB, t, 2) / 1e9
                c_runs.append(c)
            print(f"run {run + 1}/{a.runs} done", file=sys.stderr)
    finally:
        for proc in procs:
            proc.stdin.close()
            proc.wait(30)

    if c_runs:
        results["C API"] = c_runs
    cols = list(results)
    med = {col: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for col, rs in results.items()}
    ratios = [(x, y) for x, y in (("ours", "mooncake"), ("ours", "C API")) if x in med and y in med]
    print(f"\ntransfer_sync_write over loopback TCP (P2PHANDSHAKE), medians of {a.runs} runs")
    print("ours, mooncake: Python; C API: transfer_bench's loop (batch 1) against our target")
    print(f"{'':32}" + "".join(f"{c:>12}" for c in cols) + "".join(f"{x + '/' + y:>16}" for x, y in ratios))
    own = "4 KiB to its own segment, us/call"
    print(f"{own:32}" + "".join(f"{med[c]['us_own_1']:12.1f}" if "us_own_1" in med[c] else f"{'-':>12}" for c in cols))
    for t in threads:
        for label, key, fmt in (
            (f"4 KiB, {t} thread(s), us/call", f"us_4k_{t}", "{:12.1f}"),
            (f"1 MiB, {t} thread(s), GB/s", f"gbs_1m_{t}", "{:12.3f}"),
        ):
            line = f"{label:32}" + "".join(fmt.format(med[c][key]) for c in cols)
            line += "".join(f"{med[x][key] / med[y][key]:16.2f}" for x, y in ratios)
            print(line)
    print("(us/call with several threads: wall time divided by the calls of all threads)")


if __name__ == "__main__":
    main()
