"""The same calls, good and bad, on our engine and on real Mooncake
(`mooncake.engine` from PyPI) give the same return values.

Only calls Mooncake survives are compared: where Mooncake crashes or reads
out of bounds (NULL addresses, unknown batch ids, an uninitialized engine)
ours raises instead, and test_api covers that. Each implementation runs
against a target engine of its own kind in this process.
"""

import ctypes
import inspect
import json
import socket

from conftest import mooncake_engine

import transfer_engine

MiB = 1 << 20


def dead_name() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def run_cases(module) -> list:
    """(case, result) for every case, on engines of `module`."""
    eng, tgt = module.TransferEngine(), module.TransferEngine()
    assert eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert tgt.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    target = f"127.0.0.1:{tgt.get_rpc_port()}"
    remote = ctypes.create_string_buffer(MiB)
    r = ctypes.addressof(remote)
    assert tgt.register_memory(r, MiB) == 0
    local = ctypes.create_string_buffer(MiB)
    a = ctypes.addressof(local)
    dead = dead_name()
    write_op = module.TransferOpcode.Write
    cases = [
        ("register", lambda: eng.register_memory(a, MiB)),
        ("register the same range again", lambda: eng.register_memory(a, MiB)),
        ("register an overlapping range", lambda: eng.register_memory(a + 100, 10)),
        ("register zero bytes", lambda: eng.register_memory(a + 2 * MiB, 0)),
        ("unregister an inner address", lambda: eng.unregister_memory(a + 5)),
        ("unregister", lambda: eng.unregister_memory(a)),
        ("unregister twice", lambda: eng.unregister_memory(a)),
        ("batch register", lambda: eng.batch_register_memory([a, a + 4096], [4096, 4096])),
        ("batch register overlapping", lambda: eng.batch_register_memory([a + 8192, a + 8292], [4096, 4096])),
        ("batch register zero bytes", lambda: eng.batch_register_memory([a + 65536], [0])),
        ("batch register nothing", lambda: eng.batch_register_memory([], [])),
        ("batch unregister", lambda: eng.batch_unregister_memory([a, a + 4096])),
        ("batch unregister unknown", lambda: eng.batch_unregister_memory([a + 12345])),
        ("batch unregister nothing", lambda: eng.batch_unregister_memory([])),
        ("write", lambda: eng.transfer_sync_write(target, a, r, 4096)),
        ("read", lambda: eng.transfer_sync_read(target, a, r + 10, 4096)),
        ("write zero bytes", lambda: eng.transfer_sync_write(target, a, r, 0)),
        ("write to a dead peer", lambda: eng.transfer_sync_write(dead, a, r, 16)),
        ("write outside the peer's memory", lambda: eng.transfer_sync_write(target, a, 16, 16)),
        ("write past the end of the peer's memory", lambda: eng.transfer_sync_write(target, a, r + MiB - 8, 16)),
        ("transfer_sync WRITE", lambda: eng.transfer_sync(target, a, r, 64, write_op)),
        ("batch write", lambda: eng.batch_transfer_sync_write(target, [a, a + 8], [r, r + 8], [8, 8])),
        ("batch read", lambda: eng.batch_transfer_sync_read(target, [a, a + 8], [r, r + 8], [8, 8])),
        ("batch with lists of different sizes", lambda: eng.batch_transfer_sync_write(target, [a], [r, r], [8])),
        ("batch of nothing", lambda: eng.batch_transfer_sync_write(target, [], [], [])),
        ("batch to a dead peer", lambda: eng.batch_transfer_sync_read(dead, [a], [r], [8])),
        ("async batch with lists of different sizes", lambda: eng.batch_transfer_async_write(target, [a], [], [8])),
        ("async batch to a dead peer", lambda: eng.batch_transfer_async_write(dead, [a], [r], [8])),
        ("async batch waited for", lambda: eng.get_batch_transfer_status([eng.batch_transfer_async_read(target, [a], [r], [64])])),
        ("no batch waited for", lambda: eng.get_batch_transfer_status([])),
        ("submit to a dead peer", lambda: eng.transfer_submit_write(dead, a, r, 16)),
        ("probe the target", lambda: eng.send_probe(target)),
        ("probe a dead peer", lambda: eng.send_probe(dead)),
        ("probe a name that does not resolve", lambda: eng.send_probe("no-such-host.invalid")),
        ("first buffer of the target", lambda: eng.get_first_buffer_address(target) == r),
        ("first buffer of a dead peer", lambda: eng.get_first_buffer_address(dead)),
        ("warm up EFA", lambda: eng.warmup_efa_segment(target)),
        ("no notifications", lambda: eng.get_notifies()),
        ("topology", lambda: json.loads(eng.get_local_topology())),
        ("initialize with xgmi", lambda: module.TransferEngine().initialize_ext("127.0.0.1", "P2PHANDSHAKE", "xgmi", "", "")),
        ("initialize with a dead HTTP server", lambda: module.TransferEngine().initialize("n", f"http://{dead}/metadata", "tcp", "")),
        ("write bytes", lambda: eng.write_bytes_to_buffer(a, b"abc", 3)),
        ("read bytes", lambda: eng.read_bytes_from_buffer(a, 3)),
        ("managed buffer", lambda: eng.allocate_managed_buffer(4096) != 0),
        ("large managed buffer", lambda: eng.allocate_managed_buffer(300 * MiB) != 0),
    ]  # fmt: skip
    out = []
    for name, call in cases:
        out.append((name, call()))
    return out


def test_same_codes_as_mooncake():
    ours = run_cases(transfer_engine)
    theirs = run_cases(mooncake_engine())
    assert [name for name, _ in ours] == [name for name, _ in theirs]
    differ = [(n, o, t) for (n, o), (_, t) in zip(ours, theirs) if o != t]
    assert not differ, "\n".join(f"{n}: ours {o!r}, Mooncake {t!r}" for n, o, t in differ)


def pybind_params(doc: str) -> list:
    """(name, default text or None) of a pybind11 signature line."""
    inner = doc.split("(", 1)[1].rsplit(")", 1)[0]
    params, depth, cur = [], 0, ""
    for ch in inner:
        depth += ch in "[(" and 1 or ch in "])" and -1 or 0
        if ch == "," and depth == 0:
            params.append(cur.strip())
            cur = ""
        else:
            cur += ch
    params.append(cur.strip())
    out = []
    for p in params[1:]:  # self
        name, _, rest = p.partition(":")
        default = rest.split("=", 1)[1].strip() if "=" in rest else None
        out.append((name.strip(), default))
    return out


def test_mooncakes_methods_exist_with_their_keywords_and_defaults():
    """Every public method of Mooncake's class exists here, and where
    Mooncake names its parameters, ours have the same names, order and
    defaults, so keyword calls written for Mooncake work."""
    moon = mooncake_engine().TransferEngine
    ours = transfer_engine.TransferEngine
    names = [n for n in dir(moon) if not n.startswith("_")]
    missing = [n for n in names if not hasattr(ours, n)]
    assert not missing, f"methods of Mooncake's TransferEngine missing here: {missing}"
    mismatched = []
    for name in names:
        doc = getattr(moon, name).__doc__ or ""
        if not doc.startswith(name + "("):
            continue
        theirs = pybind_params(doc.splitlines()[0])
        if any(p.startswith("arg") for p, _ in theirs):
            continue  # positional-only in Mooncake
        try:
            sig = inspect.signature(getattr(ours, name))
        except (TypeError, ValueError):
            mismatched.append((name, "no signature"))
            continue
        params = [p for p in sig.parameters.values() if p.name != "self"]
        if params and params[0].kind is inspect.Parameter.VAR_POSITIONAL:
            continue  # raises NotImplementedError for any arguments
        mine = [(p.name, None if p.default is p.empty else repr(p.default)) for p in params]
        if mine[: len(theirs)] != theirs:
            mismatched.append((name, theirs, mine))
    assert not mismatched, "\n".join(map(str, mismatched))
