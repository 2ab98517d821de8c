#!/usr/bin/env python3
"""Real Mooncake (the PyPI wheel's mooncake.engine.TransferEngine) as the
RDMA peer of our C programs, for the interoperability tests of the VM suite.

  mooncake_peer.py target DEVICE SIZE
      Mooncake engine (P2PHANDSHAKE on 127.0.0.1, RDMA on DEVICE) with SIZE
      bytes filled with the pattern of ctests/net_peer.c's target (seed
      0x7a11), registered; prints "segment <name> base <addr> size <bytes>"
      and then, like `net_peer target`, every notification it receives as
      "notify name=.. msg=..", and for "check OFF LEN SEED" the result of
      checking its own memory: "check ok OFF LEN" or "check FAILED ...".
      Stops on SIGTERM/SIGINT.

  mooncake_peer.py initiator DEVICE SEGMENT BASE SIZE
      Mooncake engine against our `net_peer target`: READs of the target's
      pattern, WRITEs of new patterns read back, 1 B .. 16 MiB at odd
      offsets, every byte checked; each written range is then checked by
      the target itself (a Notify "check OFF LEN SEED" sent to its handshake
      port), printed as "expect: check ok OFF LEN" for the driver. A request
      past the end of the target's buffer must fail. Exits 0 when all
      checks passed.

The byte pattern is the C tests' te_pattern(seed, i).
"""
import ctypes
import json
import mmap
import signal
import socket
import struct
import sys
import time

from mooncake.engine import TransferEngine

TARGET_SEED = 0x7A11
MIB = 1 << 20
_CYCLE = bytes(range(251)) * 18
_XOR = [bytes(b ^ c for b in range(256)) for c in range(256)]


def pattern(seed, start, n):
    """Bytes start..start+n of te_pattern(seed, i)."""
    k = ((seed * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF) >> 56
    out = bytearray()
    i, end = start, start + n
    while i < end:
        page = i >> 12
        stop = min(end, (page + 1) << 12)
        o = i % 251
        out += _CYCLE[o:o + stop - i].translate(_XOR[(k ^ page) & 0xFF])
        i = stop
    return bytes(out)


class Memory:
    """Anonymous memory with a stable address."""

    def __init__(self, size):
        self.map = mmap.mmap(-1, size)
        self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.size = size

    def fill(self, seed, origin=0):
        for off in range(0, self.size, 8 * MIB):
            n = min(8 * MIB, self.size - off)
            self.map[off:off + n] = pattern(seed, origin + off, n)


def engine(device):
    e = TransferEngine()
    rc = e.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", device)
    if rc != 0:
        sys.exit(f"mooncake: initialize(rdma, {device}) returned {rc}")
    return e


def say(line):
    print(line, flush=True)


def target(device, size):
    e = engine(device)
    mem = Memory(size)
    mem.fill(TARGET_SEED)
    rc = e.register_memory(mem.addr, size, "cpu:0")
    if rc != 0:
        sys.exit(f"mooncake: register_memory returned {rc}")
    stop = []
    signal.signal(signal.SIGTERM, lambda s, f: stop.append(s))
    signal.signal(signal.SIGINT, lambda s, f: stop.append(s))
    say(f"segment 127.0.0.1:{e.get_rpc_port()} base {mem.addr} size {size}")
    while not stop:
        for n in e.get_notifies():
            say(f"notify name={n.name} msg={n.msg}")
            words = n.msg.split()
            if len(words) == 4 and words[0] == "check":
                off, length, seed = (int(w) for w in words[1:])
                if off > size or length > size - off:
                    say(f"check FAILED {off} {length}: outside the buffer")
                    continue
                got = mem.map[off:off + length]
                want = pattern(seed, 0, length)
                if got == want:
                    say(f"check ok {off} {length}")
                else:
                    bad = next(i for i in range(length) if got[i] != want[i])
                    say(f"check FAILED {off} {length}: byte {bad} is {got[bad]}, want {want[bad]}")
        time.sleep(0.02)
    e.unregister_memory(mem.addr)
    say(f"target: stopped by signal {stop[0]}")


def notify(segment, msg):
    """Sends a Notify frame (spec 3.2/3.4) to the segment's handshake port."""
    host, port = segment.rsplit(":", 1)
    payload = json.dumps({"name": "mooncake_peer", "notify_msg": msg}).encode() + b"\n"
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(struct.pack("<QB", len(payload) + 1, 2) + payload)
        head = b""
        while len(head) < 9:
            chunk = s.recv(9 - len(head))
            if not chunk:
                raise OSError("handshake peer closed early")
            head += chunk
        length, kind = struct.unpack("<QB", head)
        body = b""
        while len(body) < length - 1:
            chunk = s.recv(length - 1 - len(body))
            if not chunk:
                break
            body += chunk
    reply = json.loads(body)
    if kind != 2 or "notify_msg" not in reply:
        raise OSError(f"unexpected notify reply {kind} {reply}")


def initiator(device, segment, base, size):
    e = engine(device)
    mem = Memory(48 * MIB)
    if e.register_memory(mem.addr, mem.size, "cpu:0") != 0:
        sys.exit("mooncake: register_memory failed")
    failures = 0

    def check(ok, what):
        nonlocal failures
        if not ok:
            failures += 1
            say(f"FAILED: {what}")

    toff, loff = 1, 3
    for i, length in enumerate([1, 4095, 65537, MIB + 13, 16 * MIB + 1]):
        assert toff + length <= size
        # READ the target's initial pattern.
        rc = e.transfer_sync_read(segment, mem.addr + loff, base + toff, length)
        check(rc == 0, f"READ {length} at +{toff}: rc {rc}")
        check(mem.map[loff:loff + length] == pattern(TARGET_SEED, toff, length),
              f"READ {length} at +{toff}: bytes differ")
        # WRITE a new pattern, READ it back elsewhere.
        seed = 700 + i
        mem.map[loff:loff + length] = pattern(seed, 0, length)
        rc = e.transfer_sync_write(segment, mem.addr + loff, base + toff, length)
        check(rc == 0, f"WRITE {length} at +{toff}: rc {rc}")
        back = loff + length + 4099
        mem.map[back:back + length] = bytes(length)
        rc = e.transfer_sync_read(segment, mem.addr + back, base + toff, length)
        check(rc == 0, f"read-back {length}: rc {rc}")
        check(mem.map[back:back + length] == pattern(seed, 0, length),
              f"read-back {length} at +{toff}: bytes differ")
        notify(segment, f"check {toff} {length} {seed}")
        say(f"expect: check ok {toff} {length}")
        say(f"size {length} at target +{toff}: done")
        toff = (toff + length + 4096 + 2) | 1
    rc = e.transfer_sync_write(segment, mem.addr, base + size - 8, 16)
    check(rc != 0, "a WRITE past the end of the target buffer succeeded")
    say("past the end: refused")
    e.unregister_memory(mem.addr)
    say(f"mooncake initiator: {'OK' if failures == 0 else f'{failures} FAILED'}")
    sys.exit(1 if failures else 0)


def main(argv):
    if len(argv) == 4 and argv[1] == "target":
        target(argv[2], int(argv[3]))
    elif len(argv) == 6 and argv[1] == "initiator":
        initiator(argv[2], argv[3], int(argv[4]), int(argv[5]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
