"""Copies between two GPUs and peer access on pool memory, in PyTorch (gpu.peer_torch).

Run under the shim (cuda-ckpt run -- python peer_check.py) on a machine with two GPUs that can access each other:
  1. a kernel on GPU 1 reads GPU 0's pool memory after peer access is enabled (cuCtxEnablePeerAccess),
     before any copy between the devices could have given that access;
  2. the driver's unified copies (cuMemcpy, cuMemcpyDtoD) between the devices;
  3. torch's .to("cuda:1") and back (issue 16: `invalid argument` under the shim before).
Every result is compared bitwise. Exit 77 with the reason without PyTorch or two peer-capable GPUs.
"""

import ctypes
import sys

try:
    import torch
except ImportError:
    print("SKIPPED: no PyTorch in this Python")
    sys.exit(77)
if torch.cuda.device_count() < 2:
    print(f"SKIPPED: this check needs two GPUs, PyTorch sees {torch.cuda.device_count()}")
    sys.exit(77)
if not torch.cuda.can_device_access_peer(1, 0):
    print("SKIPPED: GPU 1 cannot access GPU 0's memory (no peer-to-peer between them)")
    sys.exit(77)

# A kernel in PTX, JIT-compiled by the driver: out[i] = in[i] for n 64-bit words.
COPY_PTX = b"""
.version 7.0
.target sm_50
.address_size 64
.visible .entry copy_words(.param .u64 src, .param .u64 dst, .param .u64 n)
{
  .reg .pred %p;
  .reg .b32 %r<5>;
  .reg .b64 %rd<10>;
  ld.param.u64 %rd1, [src];
  ld.param.u64 %rd2, [dst];
  ld.param.u64 %rd3, [n];
  mov.u32 %r1, %ctaid.x;
  mov.u32 %r2, %ntid.x;
  mov.u32 %r3, %tid.x;
  mad.lo.u32 %r4, %r1, %r2, %r3;
  cvt.u64.u32 %rd4, %r4;
  setp.ge.u64 %p, %rd4, %rd3;
  @%p bra DONE;
  cvta.to.global.u64 %rd5, %rd1;
  cvta.to.global.u64 %rd6, %rd2;
  shl.b64 %rd7, %rd4, 3;
  add.s64 %rd8, %rd5, %rd7;
  ld.global.u64 %rd9, [%rd8];
  add.s64 %rd8, %rd6, %rd7;
  st.global.u64 [%rd8], %rd9;
DONE:
  ret;
}
"""

CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704
WORDS = 1 << 20

problems = []


def fail_now(why):
    print(f"FAIL: {why}", flush=True)
    sys.exit(1)


def check(name, got, want):
    if not torch.equal(got.cpu(), want.cpu()):
        problems.append(f"{name}: bytes differ")
    else:
        print(f"ok: {name}", flush=True)


def driver():
    cuda = ctypes.CDLL("libcuda.so.1")
    for name in ("cuMemcpy", "cuMemcpyDtoD_v2", "cuCtxEnablePeerAccess", "cuModuleLoadData", "cuModuleGetFunction",
                 "cuLaunchKernel", "cuDevicePrimaryCtxRetain", "cuCtxSynchronize"):
        getattr(cuda, name).restype = ctypes.c_int
    return cuda


def main():
    with open("/proc/self/maps") as maps:
        if "libvmmckpt" not in maps.read():
            fail_now("not running under the shim (start it with cuda-ckpt run --): the check would prove nothing")
    cuda = driver()
    source = torch.arange(WORDS, device="cuda:0", dtype=torch.int64) * 2654435761
    torch.cuda.synchronize(0)

    # 1. A kernel on GPU 1 dereferences GPU 0's pool memory once peer access is on.
    with torch.cuda.device(1):
        out = torch.zeros(WORDS, device="cuda:1", dtype=torch.int64)
        torch.cuda.synchronize(1)  # GPU 1's context is current in this thread from here
        ctx0 = ctypes.c_void_p()
        if cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx0), 0) != 0:
            fail_now("cuDevicePrimaryCtxRetain(0) failed")
        r = cuda.cuCtxEnablePeerAccess(ctx0, 0)
        if r not in (0, CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED):
            fail_now(f"cuCtxEnablePeerAccess(GPU 1 -> GPU 0) returned {r}")
        module, function = ctypes.c_void_p(), ctypes.c_void_p()
        if cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(COPY_PTX)) != 0:
            fail_now("loading the copy kernel failed")
        if cuda.cuModuleGetFunction(ctypes.byref(function), module, b"copy_words") != 0:
            fail_now("the copy kernel is not in its module")
        src, dst, n = ctypes.c_uint64(source.data_ptr()), ctypes.c_uint64(out.data_ptr()), ctypes.c_uint64(WORDS)
        params = (ctypes.c_void_p * 3)(*(ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in (src, dst, n)))
        r = cuda.cuLaunchKernel(function, WORDS // 256, 1, 1, 256, 1, 1, 0, None, params, None)
        if r != 0:
            fail_now(f"launching the kernel on GPU 1 failed: {r}")
        r = cuda.cuCtxSynchronize()
        if r != 0:
            fail_now(f"the kernel on GPU 1 reading GPU 0's memory failed: {r}")
    check("kernel on GPU 1 reads GPU 0's pool memory (peer access)", out, source)

    # 2. The driver's copies on unified addresses, GPU 0 to GPU 1 and back, from GPU 0's context.
    torch.cuda.set_device(0)
    torch.cuda.synchronize(0)
    def copied(name, fn, src, device, label):
        """A copy of src into a new tensor on `device` by the driver's `fn`; None (a problem noted) on failure."""
        dst = torch.zeros(WORDS, device=f"cuda:{device}", dtype=torch.int64)
        torch.cuda.synchronize(device)
        r = fn(ctypes.c_uint64(dst.data_ptr()), ctypes.c_uint64(src.data_ptr()), ctypes.c_size_t(WORDS * 8))
        if r != 0:
            problems.append(f"{name} {label} returned {r}")
            return None
        check(f"{name} {label}", dst, source)
        return dst

    for name, fn in (("cuMemcpy", cuda.cuMemcpy), ("cuMemcpyDtoD", cuda.cuMemcpyDtoD_v2)):
        to1 = copied(name, fn, source, 1, "GPU 0 -> GPU 1")
        if to1 is not None:
            copied(name, fn, to1, 0, "GPU 1 -> GPU 0")

    # 3. PyTorch's own copies between the devices (the reproducer).
    x = torch.arange(WORDS, device="cuda:0")
    y = x.to("cuda:1")
    check('torch .to("cuda:1")', y, x)
    check('torch .to("cuda:0") back', y.to("cuda:0"), x)
    check("torch copy_ GPU 1 -> GPU 0", torch.empty_like(x).copy_(y), x)

    if problems:
        print("FAIL: " + "; ".join(problems), flush=True)
        return 1
    print("PASS: kernel across GPUs with peer access, driver copies and torch .to() between GPU 0 and GPU 1", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
