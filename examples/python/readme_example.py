# Two engines in one process: one writes a buffer into the other's over
# TCP on loopback ("P2PHANDSHAKE": no metadata server), then checks it.
from transfer_engine import TransferEngine

with TransferEngine() as target, TransferEngine() as me:
    target.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
    me.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
    src = bytearray(b"transfer-engine " * 65536)  # 1 MiB
    dst = bytearray(len(src))
    me.register(src)
    dst_addr = target.register(dst)  # the address peers write to
    rc = me.transfer_sync_write(target.local_name, src, dst_addr, len(src))
    assert rc == 0 and dst == src, rc
    print(f"ok: {len(src)} bytes written to {target.local_name}")
