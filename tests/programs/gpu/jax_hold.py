"""GPU test program: JAX arrays, with JAX's default preallocation, held while they are checkpointed.

  jax_hold.py                  makes its arrays, prints `array <name> 0x<ptr> <nbytes> <sha256> <sum>` per
                               array and `ready`; then answers stdin: `check` (recomputes every array's
                               hash: `ok` or `bad <name>`), `quit`
  jax_hold.py --replayed FILE  started by `cuda-ckpt restore --replay` with FILE holding those lines: puts one
                               byte on the device (JAX's preallocation lands where it was), reads
                               each array's bytes at its old address through the driver, prints
                               `replay-match <n>` or `replay-mismatch <name>`; then makes the arrays again
                               and prints `ok` when their sums are the recorded ones
"""
import argparse
import ctypes
import hashlib
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np


def make_arrays():
    key = jax.random.PRNGKey(0)
    a = jax.random.normal(key, (1 << 20,), dtype=jnp.float32)
    b = jnp.arange(3 << 18, dtype=jnp.int32) * 7
    c = jnp.tanh(a[: 1 << 19]) @ jnp.ones((1 << 19,), dtype=jnp.float32)
    w = jax.random.uniform(jax.random.PRNGKey(1), (1024, 1024), dtype=jnp.float32)
    m = w @ w.T
    arrays = {"a": a, "b": b, "c": jnp.reshape(c, (1,)), "w": w, "m": m}
    for x in arrays.values():
        x.block_until_ready()
    return arrays


def digest(x):
    return hashlib.sha256(np.asarray(x).tobytes()).hexdigest()


def driver_bytes(ptr, nbytes):
    """The device bytes at ptr through the driver, in device 0's primary context."""
    cuda = ctypes.CDLL("libcuda.so.1")
    ctx = ctypes.c_void_p()
    if cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) != 0 or cuda.cuCtxPushCurrent_v2(ctx) != 0:
        raise RuntimeError("no CUDA context")
    out = ctypes.create_string_buffer(nbytes)
    r = cuda.cuMemcpyDtoH_v2(out, ctypes.c_uint64(ptr), ctypes.c_size_t(nbytes))
    cuda.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
    if r != 0:
        raise RuntimeError(f"cuMemcpyDtoH at {ptr:#x}: CUDA error {r}")
    return out.raw


def replayed(path):
    recorded = [line.split() for line in open(path) if line.startswith("array ")]
    # One byte to the device: the client starts and maps its preallocated memory (whose bytes the restore
    # then puts back), and that byte lands in the first slot, where the dumped run's key is. No computation
    # runs (a computation's temporaries would land on the arrays' old places).
    jax.device_put(np.zeros(1, np.uint8)).block_until_ready()
    for _, name, ptr, nbytes, sha, _sum in recorded:
        if hashlib.sha256(driver_bytes(int(ptr, 16), int(nbytes))).hexdigest() != sha:
            print(f"replay-mismatch {name}", flush=True)
            return 1
    print(f"replay-match {len(recorded)}", flush=True)
    arrays = make_arrays()
    sums = {name: float(s) for _, name, _, _, _, s in recorded}
    # The bytes were compared exactly above; a sum on the GPU may add in another order from run to run.
    bad = [n for n, x in arrays.items()
           if abs(float(jnp.sum(x.astype(jnp.float32))) - sums[n]) > 1e-4 * max(1.0, abs(sums[n]))]
    print("ok" if not bad else f"bad {' '.join(bad)}", flush=True)
    return 0 if not bad else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replayed", metavar="FILE")
    args = ap.parse_args()
    if args.replayed:
        return replayed(args.replayed)
    arrays = make_arrays()
    digests = {}
    for name, x in arrays.items():
        digests[name] = digest(x)
        s = repr(float(jnp.sum(x.astype(jnp.float32))))
        print(f"array {name} {x.unsafe_buffer_pointer():#x} {x.nbytes} {digests[name]} {s}", flush=True)
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "check":
            bad = [n for n, x in arrays.items() if digest(x) != digests[n]]
            print("ok" if not bad else f"bad {' '.join(bad)}", flush=True)
        elif line.strip() == "quit":
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
