"""A program for the Python API's tags check: allocates device memory through the driver API (ctypes) inside
vmmckpt.region("weights"), inside region("kv_cache") (a pool block and a VMM mapping), and untagged; fills each
with a pattern, sleeps at level 1 and wakes, and checks that the weights and the untagged memory kept their bytes
while the KV cache reads as zeros; then level 2 (the weights dropped too). A block freed and made again untagged
at the same address keeps no tag. Run under the shim (cuda-ckpt run -- python tags_program.py). Exit status 0
when every check holds."""

import ctypes
import sys

import vmmckpt

from driver_context import check, cuda  # noqa: E402  (device 0's context made current)
SIZE = 2 << 20


def alloc(seed):
    ptr = ctypes.c_uint64()
    check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(SIZE)), "cuMemAlloc")
    fill(ptr.value, seed)
    return ptr.value


def fill(addr, seed):
    data = bytes((i * 7 + seed) % 251 for i in range(256)) * (SIZE // 256)
    check(cuda.cuMemcpyHtoD_v2(ctypes.c_uint64(addr), data, ctypes.c_size_t(SIZE)), "cuMemcpyHtoD")
    return data


def read(addr):
    back = ctypes.create_string_buffer(SIZE)
    check(cuda.cuMemcpyDtoH_v2(back, ctypes.c_uint64(addr), ctypes.c_size_t(SIZE)), "cuMemcpyDtoH")
    return back.raw


class Prop(ctypes.Structure):  # CUmemAllocationProp: type, location {type, id}, handle types, ...
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location_type", ctypes.c_int),
                ("location_id", ctypes.c_int), ("win32", ctypes.c_void_p), ("alloc_flags", ctypes.c_ubyte * 8)]


class Access(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location_type", ctypes.c_int), ("location_id", ctypes.c_int), ("flags", ctypes.c_int)]


def vmm_alloc(seed):
    """A handle made inside the current region, mapped: the program's own VMM memory."""
    prop = Prop(type=1, requestedHandleTypes=0, location_type=1, location_id=0)
    handle, va = ctypes.c_uint64(), ctypes.c_uint64()
    check(cuda.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(SIZE), ctypes.byref(prop), ctypes.c_uint64(0)),
          "cuMemCreate")
    check(cuda.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(SIZE), ctypes.c_size_t(0), ctypes.c_uint64(0),
                                   ctypes.c_uint64(0)), "cuMemAddressReserve")
    check(cuda.cuMemMap(va, ctypes.c_size_t(SIZE), ctypes.c_size_t(0), handle, ctypes.c_uint64(0)), "cuMemMap")
    access = Access(location_type=1, location_id=0, flags=3)
    check(cuda.cuMemSetAccess(va, ctypes.c_size_t(SIZE), ctypes.byref(access), ctypes.c_size_t(1)), "cuMemSetAccess")
    fill(va.value, seed)
    return va.value


with vmmckpt.region("weights"):
    weights = alloc(1)
    with vmmckpt.region("kv_cache"):
        kv_block = alloc(2)
        kv_vmm = vmm_alloc(3)
    weights_after_nested = alloc(4)  # the region around comes back
plain = alloc(5)
expected = {a: read(a) for a in (weights, kv_block, kv_vmm, weights_after_nested, plain)}
zeros = bytes(SIZE)

stats = vmmckpt.sleep(1)
if stats.bytes_copied < 3 * SIZE or stats.bytes_copied >= 5 * SIZE:
    sys.exit(f"level 1 kept {stats.bytes_copied} bytes in host memory, not the weights and the untagged memory")
vmmckpt.resume()
for a in (weights, weights_after_nested, plain):
    if read(a) != expected[a]:
        sys.exit(f"memory at {a:#x} lost its bytes in a level-1 sleep")
for a in (kv_block, kv_vmm):
    if read(a) != zeros:
        sys.exit(f"the KV cache at {a:#x} kept its bytes in a level-1 sleep")

fill(kv_block, 2)
vmmckpt.sleep(2)
vmmckpt.resume()
if read(plain) != expected[plain] or read(weights) != zeros or read(kv_block) != zeros:
    sys.exit("a level-2 sleep did not drop the weights and the KV cache and keep the rest")

# A tagged block freed, and a block made untagged at the same address: it keeps its bytes where the tag's are dropped.
check(cuda.cuMemFree_v2(ctypes.c_uint64(kv_block)), "cuMemFree")
again = alloc(6)
if again == kv_block:
    kept = read(again)
    vmmckpt.pause(True, {"kv_cache": "discard"})
    vmmckpt.resume()
    if read(again) != kept:
        sys.exit("a block made untagged where a tagged one was lost its bytes to the tag's policy")

for bad in ("", "has space", "x" * 65):
    try:
        with vmmckpt.region(bad):
            pass
        sys.exit(f"region({bad!r}) did not raise")
    except (TypeError, ValueError):
        pass
try:
    vmmckpt.pause(True, {"kv_cache": "drop"})
    sys.exit("a policy other than keep or discard did not raise")
except ValueError:
    pass
print("tags ok")
