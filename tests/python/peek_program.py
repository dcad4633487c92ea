"""A program for the Python API's peek check: allocates device memory through the driver API (ctypes), fills it
with a pattern, names it with vmmckpt.name, then reads it back through cuda-ckpt peek by name and by address, and
writes it with poke. Run under the shim (cuda-ckpt run -- python peek_program.py). Exit status 0 when every check
holds."""

import ctypes
import os
import sys

import vmmckpt

from driver_context import check, cuda  # noqa: E402  (device 0's context made current)
size = 4096
pattern = bytes((i * 7 + 3) % 251 for i in range(size))
ptr = ctypes.c_uint64()
check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size)), "cuMemAlloc")
check(cuda.cuMemcpyHtoD_v2(ctypes.c_uint64(ptr.value), pattern, ctypes.c_size_t(size)), "cuMemcpyHtoD")

vmmckpt.name(ptr.value, "py.buffer", size)
me = os.getpid()
if vmmckpt.peek(me, "py.buffer") != pattern:
    sys.exit("peek by name did not read the pattern")
if vmmckpt.peek(me, ptr.value + 8, 8, order="quiesce") != pattern[8:16]:
    sys.exit("peek by address did not read the pattern")
if vmmckpt.poke(me, "py.buffer", b"\xff" * 4) != 4:
    sys.exit("poke did not say it wrote 4 bytes")
back = ctypes.create_string_buffer(8)
check(cuda.cuMemcpyDtoH_v2(back, ctypes.c_uint64(ptr.value), ctypes.c_size_t(8)), "cuMemcpyDtoH")
if back.raw != b"\xff" * 4 + pattern[4:8]:
    sys.exit(f"the program reads {back.raw.hex()} after poke")
try:
    vmmckpt.peek(me, 0x1234, 16)
    sys.exit("peek of 0x1234 did not raise")
except vmmckpt.CommandFailedError as e:
    if "0x1234" not in str(e):
        sys.exit(f"peek of 0x1234 raised without naming it: {e}")
try:
    import numpy
except ImportError:
    numpy = None
if numpy is not None:
    values = vmmckpt.peek(me, "py.buffer", dtype=numpy.uint8, shape=(64, 64))
    if values.shape != (64, 64) or int(values[0, 5]) != pattern[5]:
        sys.exit(f"peek as an array: {values.shape}, {values[0, :8]}")
print("peek ok")
