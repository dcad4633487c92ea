#!/usr/bin/env python3
"""Dumps a running program under the shim on a GPU and checks every image.

  dump_check.py --cuda-ckpt build/bin/cuda-ckpt --mode busy  -- build/tests/programs/gpu_busy_kernels
  dump_check.py --cuda-ckpt build/bin/cuda-ckpt --mode torch -- python3 torch_hold.py

busy:  dumps --dumps times while kernels rewrite the buffers; every image must verify and every
       buffer hold one whole generation (no torn copy).
torch: dumps once; every tensor's bytes must be in the image at its data_ptr.
Prints the dump figures (bytes, GB/s, hold time) and PASS/FAIL. Exits 77 when there is no GPU.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HEADER = 64


def read_image(path):
    manifest = json.load(open(os.path.join(path, "manifest.json")))
    return manifest, path


def read_range(image, manifest, addr, nbytes):
    """The image's bytes for [addr, addr + nbytes), gathered from the extents (and data files) that
    hold them; None when some byte is in no extent."""
    out = bytearray(nbytes)
    covered = 0
    for pool in manifest["pools"]:
        for e in pool["extents"]:
            start, size = int(e["addr"], 16), e["size"]
            lo, hi = max(start, addr), min(start + size, addr + nbytes)
            if lo >= hi:
                continue
            name = "data.bin" if e.get("file", 0) == 0 else f"data.{e['file']}.bin"
            with open(os.path.join(image, name), "rb") as f:
                f.seek(HEADER + e["offset"] + (lo - start))
                out[lo - addr:hi - addr] = f.read(hi - lo)
            covered += hi - lo
    return bytes(out) if covered == nbytes else None


def check_busy(image, buffer_size):
    import numpy as np
    manifest, _ = read_image(image)
    buffers = 0
    for pool in manifest["pools"]:
        for a in pool["allocations"]:
            if a["size"] != buffer_size:
                continue
            raw = read_range(image, manifest, int(a["addr"], 16), buffer_size)
            if raw is None:
                return f"buffer {a['addr']}: not all of it is in the image"
            words = np.frombuffer(raw, dtype=np.uint64)
            gen = int(words[0])
            if int(words[-1]) != gen:
                return f"buffer {a['addr']}: first word {gen}, last {int(words[-1])}"
            if gen == 0:
                if words.any():
                    return f"buffer {a['addr']}: generation 0 but not zero"
            else:
                k = np.arange(len(words), dtype=np.uint64)
                mult = np.uint64((gen * 0x9e3779b97f4a7c15) & 0xFFFFFFFFFFFFFFFF)
                buffer = (int(words[1]) ^ int(mult) ^ 1) >> 40
                expected = mult ^ np.uint64(buffer << 40) ^ k
                expected[0] = expected[-1] = np.uint64(gen)
                bad = np.nonzero(words != expected)[0]
                if len(bad):
                    return f"buffer {a['addr']}: torn at word {int(bad[0])} (generation {gen})"
            buffers += 1
    return None if buffers else "no buffers of the expected size in the image"


def check_torch(image, tensors):
    manifest, _ = read_image(image)
    for name, (ptr, nbytes, digest) in tensors.items():
        if nbytes == 0:
            continue
        raw = read_range(image, manifest, ptr, nbytes)
        if raw is None:
            return f"tensor {name} at 0x{ptr:x} ({nbytes} bytes) is not all in the image"
        if hashlib.sha256(raw).hexdigest() != digest:
            return f"tensor {name} at 0x{ptr:x}: bytes in the image differ from the program's"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cuda-ckpt", required=True)
    ap.add_argument("--mode", choices=["busy", "torch"], required=True)
    ap.add_argument("--dumps", type=int, default=10)
    ap.add_argument("--buffer-size", type=int, default=64 << 20)
    ap.add_argument("--workdir", default=None, help="where images go (default: a temporary directory)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd
    if not os.path.exists("/dev/nvidia0"):
        print("SKIPPED: no GPU (/dev/nvidia0 does not exist)")
        return 77
    if args.mode == "torch":
        try:
            import torch  # noqa: F401
        except ImportError:
            print("SKIPPED: PyTorch is not installed")
            return 77
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", PYTHONUNBUFFERED="1")
    work = args.workdir or tempfile.mkdtemp(prefix="vmmckpt-dump-check-")
    prog = subprocess.Popen([args.cuda_ckpt, "run", "--"] + cmd, stdout=subprocess.PIPE, stdin=subprocess.PIPE,
                            text=True, env=env)
    tensors = {}
    problems = []
    figures = []
    try:
        for line in prog.stdout:
            if line.startswith("tensor "):
                _, name, ptr, nbytes, digest = line.split()
                tensors[name] = (int(ptr, 16), int(nbytes), digest)
            if line.strip() == "ready":
                break
        else:
            print(f"FAIL: the program exited before it was ready (exit {prog.wait()})")
            return 1
        dumps = args.dumps if args.mode == "busy" else 1
        for i in range(dumps):
            image = os.path.join(work, f"image-{i}")
            r = subprocess.run([args.cuda_ckpt, "dump", str(prog.pid), "-o", image, "--json"], capture_output=True,
                               text=True, env=env)
            if r.returncode != 0:
                problems.append(f"dump {i} failed: {r.stderr.strip()}")
                break
            figures.append(json.loads(r.stdout))
            v = subprocess.run([args.cuda_ckpt, "verify", image], capture_output=True, text=True)
            if v.returncode != 0:
                problems.append(f"image {i} does not verify: {v.stderr.strip()}")
            defect = check_busy(image, args.buffer_size) if args.mode == "busy" else check_torch(image, tensors)
            if defect:
                problems.append(f"image {i}: {defect}")
            shutil.rmtree(image, ignore_errors=True)
            time.sleep(0.2)
        if prog.poll() is not None:
            problems.append(f"the program died during the dumps (exit {prog.returncode})")
    finally:
        prog.kill()
        prog.wait()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    for i, f in enumerate(figures):
        print(f"dump {i}: {f['bytes'] / 2**30:.2f} GiB in {f['allocations']} allocations, {f['seconds']:.3f} s "
              f"({f['gb_per_s']:.2f} GB/s), copy {f['copy_gb_per_s']:.2f} GB/s, held {f['hold_ms']:.1f} ms")
    if figures:
        best = max(f["gb_per_s"] for f in figures)
        hold = sorted(f["hold_ms"] for f in figures)[len(figures) // 2]
        print(f"figures: {len(figures)} dumps, best {best:.2f} GB/s overall, median hold {hold:.1f} ms")
    if problems:
        print("FAIL: " + "; ".join(problems))
        return 1
    print(f"PASS: {len(figures)} images verified, {'no torn buffer' if args.mode == 'busy' else f'{len(tensors)} tensors exact'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
