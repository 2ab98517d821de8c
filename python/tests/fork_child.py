"""The child process of test_misuse.py's fork test: initializes an engine,
writes to a peer, then forks children that misuse the engine they
inherited and exit normally (the interpreter's finalization runs in
them), and times its own next transfer after each.

    python fork_child.py PEER_NAME PEER_ADDR

Each case prints one JSON line:

    {"case", "exit": the child's exit code (negative: killed by a signal),
     "error": the exception class the child's call raised, or "",
     "rc": the parent's next transfer's return code,
     "after": how long that transfer took, in seconds}
"""

import ctypes
import json
import os
import sys
import time

from transfer_engine import TransferEngine

SIZE = 1 << 20


def main() -> None:
    name, addr = sys.argv[1], int(sys.argv[2])
    e = TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    buf = ctypes.create_string_buffer(SIZE)
    base = ctypes.addressof(buf)
    assert e.register_memory(base, SIZE) == 0

    def transfer():
        t = time.monotonic()
        rc = e.transfer_sync_write(name, base, addr, SIZE)
        return rc, time.monotonic() - t

    assert transfer()[0] == 0
    for case in ("exit", "close", "transfer", "bytes"):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            error = ""
            try:
                if case == "close":
                    e.close()
                elif case == "transfer":
                    e.transfer_sync_write(name, base, addr, SIZE)
                elif case == "bytes":
                    e.read_bytes_from_buffer(base, 16)
            except Exception as x:  # noqa: BLE001 - reported to the parent
                error = type(x).__name__
            os.write(w, error.encode())
            os.close(w)
            sys.exit(0)
        os.close(w)
        error = os.read(r, 100).decode()
        os.close(r)
        _, status = os.waitpid(pid, 0)
        rc, after = transfer()
        line = {
            "case": case,
            "exit": os.waitstatus_to_exitcode(status),
            "error": error,
            "rc": rc,
            "after": after,
        }
        print(json.dumps(line), flush=True)
    e.close()


if __name__ == "__main__":
    main()
