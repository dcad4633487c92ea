#!/usr/bin/env python3
"""Suspends a PyTorch training run in the middle and resumes it, on a GPU.

  suspend_check.py --cuda-ckpt build/bin/cuda-ckpt -- python3 torch_steps.py

Runs the program once uninterrupted under the shim, then again with a suspend after step 10 and a
resume a moment later. Checks: suspend and resume succeed; the GPU memory in use drops while
suspended (nvidia-smi); the program makes no progress while suspended; the loss sequence is bitwise
the uninterrupted one. Prints the figures and PASS/FAIL; exits 77 without a GPU or PyTorch.

With --gpus N the program uses GPUs 0 to N-1 (torch_two_gpu_steps.py: a model split over two): the memory in
use is that of those GPUs together, and the check skips with the reason where fewer exist.
"""
import json
import os
import subprocess
import sys
import time

import gpu_checks


def gpu_used_mib(gpus):
    """MiB in use on GPUs 0 to gpus-1 together (nvidia-smi lists them in that order), or -1."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True)
    used = out.stdout.split() if out.returncode == 0 else []
    return sum(int(u) for u in used[:gpus]) if len(used) >= gpus else -1


def losses(lines):
    return [l for l in lines if l.startswith("result loss_")]


def main():
    ap = gpu_checks.argument_parser(__doc__)
    ap.add_argument("--expect-vmm", action="store_true",
                    help="the program maps VMM memory itself (PyTorch's expandable segments): the image must hold some")
    ap.add_argument("--gpus", type=int, default=1,
                    help="the program uses GPUs 0 to N-1: their memory is counted together; skipped where fewer exist")
    args = ap.parse_args()
    cmd = gpu_checks.command(args)
    if (reason := gpu_checks.skip_reason(args, torch=True)):
        return gpu_checks.skipped(reason)
    if args.gpus > 1 and (found := gpu_checks.gpu_count()) < args.gpus:
        return gpu_checks.skipped(f"this check needs {args.gpus} GPUs (the nvidia-h200-x2 machine), "
                                  f"nvidia-smi lists {found}")
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", PYTHONUNBUFFERED="1")
    base = subprocess.run([args.cuda_ckpt, "run", "--"] + cmd, capture_output=True, text=True, env=env)
    if base.returncode != 0:
        print(f"FAIL: the uninterrupted run failed: {base.stderr[-2000:]}")
        return 1
    expected = losses(base.stdout.splitlines())

    prog = subprocess.Popen([args.cuda_ckpt, "run", "--"] + cmd, stdout=subprocess.PIPE, text=True, env=env)
    lines = []
    problems = []
    figures = {}
    for line in prog.stdout:
        lines.append(line.strip())
        if line.startswith("result loss_10 "):
            break
    before = gpu_used_mib(args.gpus)
    t0 = time.time()
    s = subprocess.run([args.cuda_ckpt, "suspend", str(prog.pid), "--json"], capture_output=True, text=True, env=env)
    figures["suspend_s"] = time.time() - t0
    if s.returncode != 0:
        problems.append(f"suspend failed: {gpu_checks.failure(s)}")
    else:
        r = json.loads(s.stdout)
        figures["freed_mib"] = r["freed_bytes"] / 2**20
        reserved = next((int(l.split()[1]) for l in lines if l.startswith("reserved ")), 0)
        figures["torch_reserved_mib"] = reserved / 2**20
        inspected = subprocess.run([args.cuda_ckpt, "inspect", "--json", r["image"]], capture_output=True, text=True)
        if inspected.returncode == 0:
            mappings = (json.loads(inspected.stdout).get("vmm") or {}).get("mappings", [])
            figures["vmm_mappings"] = len(mappings)
            figures["vmm_mib"] = sum(m["size"] for m in mappings) / 2**20
            if args.expect_vmm and not mappings:
                problems.append("the image holds no program-made VMM memory (were expandable segments used?)")
        # PyTorch's own memory, whichever way it maps it (cudaMalloc or expandable segments), is freed.
        if reserved and r["freed_bytes"] < 0.9 * reserved:
            problems.append(f"suspend freed {r['freed_bytes']} bytes of the {reserved} PyTorch had reserved")
        figures["image_mib"] = r["bytes"] / 2**20
        time.sleep(1.0)
        during = gpu_used_mib(args.gpus)
        figures["gpu_used_mib_before"] = before
        figures["gpu_used_mib_suspended"] = during
        if during >= 0 and before >= 0 and before - during < r["freed_bytes"] / 2**20 * 0.9:
            problems.append(f"GPU memory in use went from {before} to only {during} MiB while suspended")
        t1 = time.time()
        res = subprocess.run([args.cuda_ckpt, "resume", str(prog.pid), "--json"], capture_output=True, text=True,
                             env=env)
        figures["resume_s"] = time.time() - t1
        if res.returncode != 0:
            problems.append(f"resume failed: {gpu_checks.failure(res)}")
    rest, _ = gpu_checks.finish(prog, 300)
    lines += rest.splitlines()
    if prog.returncode != 0:
        problems.append(f"the program exited with {prog.returncode}")
    got = losses(lines)
    if got != expected:
        diff = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
        problems.append(f"loss sequence differs from the uninterrupted run at entry {diff} "
                        f"({len(got)} vs {len(expected)} steps)")
    print("figures: " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()))
    return gpu_checks.verdict(problems,
                              f"suspended at step 10 and resumed; {len(got)} losses bitwise equal to the uninterrupted run")


if __name__ == "__main__":
    sys.exit(main())
