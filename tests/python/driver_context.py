"""What the Python API's test programs share: the CUDA driver through ctypes, its calls checked, device 0's primary
context made current. `cuda` is the library; `check(result, what)` ends the program on a failed call."""

import ctypes
import sys

cuda = ctypes.CDLL("libcuda.so.1")


def check(result, what):
    if result != 0:
        sys.exit(f"{what} failed: CUDA error {result}")


check(cuda.cuInit(0), "cuInit")
_device, _context = ctypes.c_int(), ctypes.c_void_p()
check(cuda.cuDeviceGet(ctypes.byref(_device), 0), "cuDeviceGet")
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(_context), _device), "cuDevicePrimaryCtxRetain")
check(cuda.cuCtxSetCurrent(_context), "cuCtxSetCurrent")
