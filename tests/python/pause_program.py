"""A program for the Python API's tests: allocates device memory through the driver API (ctypes), fills it
with a pattern, then pauses and resumes itself through vmmckpt and checks the bytes.

Usage: python3 pause_program.py keep|discard MIB STATE_FILE
Writes "paused <pid>" to STATE_FILE while paused and waits for STATE_FILE.go to appear before resuming,
so that a test can look at the process in between. Exit status 0 when every check holds.
"""

import ctypes
import os
import sys
import time

import vmmckpt

mode, mib, state_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
from driver_context import check, cuda  # noqa: E402  (device 0's context made current)

size = mib << 20
pattern = bytes((i * 7 + 3) % 251 for i in range(size))
buffers = []
for _ in range(3):  # several allocations, so that the pool holds more than one block
    ptr = ctypes.c_uint64()
    check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size)), "cuMemAlloc")
    check(cuda.cuMemcpyHtoD_v2(ctypes.c_uint64(ptr.value), pattern, ctypes.c_size_t(size)), "cuMemcpyHtoD")
    buffers.append(ptr.value)

assert vmmckpt.under_shim(), "not under the shim"
assert vmmckpt.state() == "running", vmmckpt.state()
# keep must be a bool: None would drop every byte (falsy), "no" keep them (truthy). Refused before anything.
for wrong in (None, "no", 0, 1.0):
    try:
        vmmckpt.pause(keep=wrong)
        sys.exit(f"pause(keep={wrong!r}) was accepted")
    except TypeError:
        pass
    assert vmmckpt.state() == "running", f"pause(keep={wrong!r}) paused: {vmmckpt.state()}"
stats = vmmckpt.pause(keep=(mode == "keep"))
assert vmmckpt.state() == "paused", vmmckpt.state()
assert stats.bytes_released >= 3 * size, stats
assert stats.bytes_copied == (3 * size if mode == "keep" else 0) or (mode == "keep" and stats.bytes_copied >= 3 * size), stats
try:
    vmmckpt.pause()
    sys.exit("a second pause was accepted")
except vmmckpt.PauseStateError:
    pass
with open(state_file + ".tmp", "w") as f:
    f.write(f"paused {os.getpid()} {stats.bytes_released}\n")
os.rename(state_file + ".tmp", state_file)
deadline = time.monotonic() + 120
while not os.path.exists(state_file + ".go"):
    if time.monotonic() > deadline:
        sys.exit("nobody said go")
    time.sleep(0.05)
back = vmmckpt.resume()
assert vmmckpt.state() == "running", vmmckpt.state()
assert back.bytes_released >= 3 * size, back

expected = pattern if mode == "keep" else bytes(size)
out = ctypes.create_string_buffer(size)
for ptr in buffers:
    check(cuda.cuMemcpyDtoH_v2(out, ctypes.c_uint64(ptr), ctypes.c_size_t(size)), "cuMemcpyDtoH")
    if out.raw != expected:
        first = next(i for i in range(size) if out.raw[i] != expected[i])
        sys.exit(f"bytes differ after resume at {ptr:#x}+{first}")
# The memory works as before: a new allocation, and the old ones freed.
ptr = ctypes.c_uint64()
check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size)), "cuMemAlloc after resume")
for p in buffers + [ptr.value]:
    check(cuda.cuMemFree_v2(ctypes.c_uint64(p)), "cuMemFree")
print(f"ok {mode}: {stats.bytes_released} bytes released, {back.bytes_copied} written back", flush=True)
