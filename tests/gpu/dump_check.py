#!/usr/bin/env python3
"""Dumps a running program under the shim on a GPU and checks every image.

  dump_check.py --cuda-ckpt build/bin/cuda-ckpt --mode busy --pattern-check build/tests/programs/busy_pattern_check
                -- build/tests/programs/gpu_busy_kernels
  dump_check.py --cuda-ckpt build/bin/cuda-ckpt --mode torch -- python3 torch_hold.py

busy:  dumps --dumps times while kernels rewrite the buffers; every image must verify and every
       buffer hold one whole generation (no torn copy: busy_pattern_check, --pattern-check).
torch: dumps once; every tensor's bytes must be in the image at its data_ptr.
The image is read through cuda-ckpt (inspect --json, cat), never decoded here (gpu_checks.py).
Prints the dump figures (bytes, GB/s, hold time) and PASS/FAIL. Exits 77 when there is no GPU.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import gpu_checks


def check_torch(cuda_ckpt, image, tensors):
    for name, (ptr, nbytes, digest) in tensors.items():
        if nbytes == 0:
            continue
        if hashlib.sha256(gpu_checks.image_bytes(cuda_ckpt, image, ptr, nbytes)).hexdigest() != digest:
            return f"tensor {name} at 0x{ptr:x}: bytes in the image differ from the program's"
    return None


def main():
    ap = gpu_checks.argument_parser(__doc__)
    ap.add_argument("--mode", choices=["busy", "torch"], required=True)
    ap.add_argument("--pattern-check", help="busy_pattern_check (busy mode)")
    ap.add_argument("--dumps", type=int, default=10)
    ap.add_argument("--buffer-size", type=int, default=64 << 20)
    ap.add_argument("--workdir", default=None, help="where images go (default: a temporary directory)")
    args = ap.parse_args()
    cmd = gpu_checks.command(args)
    if args.mode == "busy" and not args.pattern_check:
        ap.error("--mode busy needs --pattern-check")
    if (reason := gpu_checks.skip_reason(args, torch=args.mode == "torch")):
        return gpu_checks.skipped(reason)
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
            try:
                defect = (gpu_checks.busy_problem(args.cuda_ckpt, args.pattern_check, image, args.buffer_size)
                          if args.mode == "busy" else check_torch(args.cuda_ckpt, image, tensors))
            except gpu_checks.CheckError as e:
                defect = str(e)
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
    return gpu_checks.verdict(problems, f"{len(figures)} images verified, "
                              f"{'no torn buffer' if args.mode == 'busy' else f'{len(tensors)} tensors exact'}")


if __name__ == "__main__":
    sys.exit(main())
