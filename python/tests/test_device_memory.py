"""GPU addresses (a tensor's ``data_ptr()``) never reach a CPU copy: with a
test double of the CUDA driver (tests/support/cuda_driver_double.c, NOT a
GPU) loaded into a child interpreter, the byte helpers raise, and
transfers from and to its "device memory" move every byte through the
driver's copy calls; the process lives (the double's memory is mapped
PROT_NONE: a CPU touch would kill it)."""

import pathlib
import shutil
import subprocess
import sys

from conftest import need

ROOT = pathlib.Path(__file__).resolve().parents[2]

CHILD = r"""
import ctypes, sys
double = ctypes.CDLL(sys.argv[1])
double.te_cuda_double_alloc.restype = ctypes.c_void_p
double.te_cuda_double_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int]
from transfer_engine import TransferEngine

dev = double.te_cuda_double_alloc(1 << 20, 0)
host = ctypes.create_string_buffer(1 << 20)
e = TransferEngine()
assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
for call in (lambda: e.write_bytes_to_buffer(dev, b"abc", 3),
             lambda: e.read_bytes_from_buffer(dev + 8, 16)):
    try:
        call()
    except ValueError as err:
        assert "GPU 0" in str(err), err
    else:
        raise AssertionError("a GPU address was copied with the CPU")
assert e.register_memory(dev, 1 << 20, "cpu:0") == 0
assert e.register_memory(ctypes.addressof(host), 1 << 20) == 0
me = e.local_name
h = ctypes.addressof(host)
ctypes.memmove(h, bytes(range(256)) * 16, 4096)
copies = double.te_cuda_double_copies()
assert e.transfer_sync_write(me, h, dev + 8, 4096) == 0
assert e.transfer_sync_read(me, h + 8192, dev + 8, 4096) == 0
assert host.raw[8192:8192 + 4096] == host.raw[:4096], "the bytes came back"
seen = ctypes.create_string_buffer(4096)
assert double.te_cuda_double_read(seen, ctypes.c_uint64(dev + 8), 4096) == 0
assert seen.raw == host.raw[:4096], "the double's GPU memory holds them"
assert double.te_cuda_double_copies() > copies, "the driver double copied"
print("ok")
"""


def test_gpu_addresses_are_copied_by_the_driver_not_the_cpu(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    need(cc is not None, "no C compiler to build the CUDA driver double")
    so = tmp_path / "libcuda.so.1"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(so),
         str(ROOT / "tests/support/cuda_driver_double.c")],
        check=True,
    )
    r = subprocess.run([sys.executable, "-c", CHILD, str(so)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, (r.returncode, r.stdout, r.stderr[-3000:])
