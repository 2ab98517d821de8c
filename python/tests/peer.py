"""A peer process for the two-process and interop tests.

    python peer.py IMPL METADATA NAME SIZE PROTOCOL

IMPL is ``ours`` (``transfer_engine``) or ``mooncake`` (``mooncake.engine``):
the same code drives both, which is the point of an identical API. The peer
initializes an engine, registers SIZE bytes of memory, prints one JSON line
``{"rc", "name", "addr", "size"}`` and then answers one JSON command per
line on stdin with one JSON line on stdout (logs go to stderr):

    {"op": "fill", "seed": S}                   -> {"ok": true}
    {"op": "sha", "off": O, "len": N}           -> {"sha": hex}
    {"op": "write"|"read", "target": T, "off": O, "remote": A, "len": N}
                                                -> {"rc": rc}
    {"op": "batch_write"|"batch_read", "target": T, "offs": [...],
     "remotes": [...], "lens": [...]}           -> {"rc": rc}
    {"op": "notify_write", "target": T, "off": O, "remote": A, "len": N,
     "name": n, "msg": m}                       -> {"rc": rc}
    {"op": "notifies"}                          -> {"notifies": [[name, msg], ...]}
    {"op": "first", "target": T}                -> {"addr": a}
    {"op": "probe", "target": T}                -> {"rc": rc}
    {"op": "quit"}                              -> exits
"""

import ctypes
import hashlib
import json
import random
import sys


def main() -> None:
    impl, metadata, name, size, protocol = sys.argv[1:6]
    size = int(size)
    if impl == "ours":
        from transfer_engine import TransferEngine, TransferNotify, TransferOpcode
    else:
        from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode

    engine = TransferEngine()
    rc = engine.initialize(name, metadata, protocol, "")
    buf = ctypes.create_string_buffer(size)
    base = ctypes.addressof(buf)
    if rc == 0:
        rc = engine.register_memory(base, size)
    if metadata == "P2PHANDSHAKE":
        seg = f"{name.split(':')[0]}:{engine.get_rpc_port()}" if rc == 0 else ""
    else:
        seg = name
    print(json.dumps({"rc": rc, "name": seg, "addr": base, "size": size}), flush=True)
    if rc != 0:
        return

    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "quit":
            break
        if op == "fill":
            ctypes.memmove(base, random.Random(cmd["seed"]).randbytes(size), size)
            out = {"ok": True}
        elif op == "sha":
            data = ctypes.string_at(base + cmd["off"], cmd["len"])
            out = {"sha": hashlib.sha256(data).hexdigest()}
        elif op in ("write", "read"):
            call = engine.transfer_sync_write if op == "write" else engine.transfer_sync_read
            out = {"rc": call(cmd["target"], base + cmd["off"], cmd["remote"], cmd["len"])}
        elif op in ("batch_write", "batch_read"):
            call = (
                engine.batch_transfer_sync_write
                if op == "batch_write"
                else engine.batch_transfer_sync_read
            )
            locals_ = [base + o for o in cmd["offs"]]
            out = {"rc": call(cmd["target"], locals_, cmd["remotes"], cmd["lens"])}
        elif op == "notify_write":
            notify = TransferNotify(cmd["name"], cmd["msg"])
            rc = engine.transfer_sync(
                cmd["target"],
                base + cmd["off"],
                cmd["remote"],
                cmd["len"],
                TransferOpcode.Write,
                notify,
            )
            out = {"rc": rc}
        elif op == "notifies":
            out = {"notifies": [[n.name, n.msg] for n in engine.get_notifies()]}
        elif op == "first":
            out = {"addr": engine.get_first_buffer_address(cmd["target"])}
        elif op == "probe":
            out = {"rc": engine.send_probe(cmd["target"])}
        else:
            out = {"error": f"unknown op {op!r}"}
        print(json.dumps(out), flush=True)
    engine.unregister_memory(base)


if __name__ == "__main__":
    main()
