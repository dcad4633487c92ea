#!/usr/bin/env python3
"""Dumps a GPU linked list from one process and restores it into new ones, in both restore modes.

  restore_check.py --cuda-ckpt build/bin/cuda-ckpt --program build/tests/programs/gpu_linked_list [--nodes N]

Starts `cuda-ckpt run -- PROGRAM build FILE`, waits for `ready`, dumps it, kills it, then runs
`cuda-ckpt restore IMAGE -- PROGRAM walk FILE` (pointers followed by a kernel, checksum compared with the
build's) and `cuda-ckpt restore IMAGE --replay -- PROGRAM replay FILE`. Prints the dump and restore wall
times and PASS/FAIL. Exits 77 when there is no GPU. Standard library only.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import gpu_checks


def read_until_ready(prog, lines, timeout_s):
    """Collects the program's stdout lines until `ready`; False on timeout or exit."""
    done = threading.Event()

    def reader():
        for line in prog.stdout:
            lines.append(line.rstrip("\n"))
            if line.strip() == "ready":
                done.set()
                return
        done.set()

    threading.Thread(target=reader, daemon=True).start()
    return done.wait(timeout_s) and bool(lines) and lines[-1] == "ready"


def timed(argv, env, timeout_s):
    start = time.monotonic()
    try:
        r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, time.monotonic() - start
    return r, time.monotonic() - start


def describe(r):
    return f"exit {r.returncode}\n--- stdout\n{r.stdout.strip()}\n--- stderr\n{r.stderr.strip()}"


def main():
    ap = gpu_checks.argument_parser(__doc__, command=False)
    ap.add_argument("--program", required=True, help="gpu_linked_list (emu_linked_list with --emulated)")
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--workdir", default=None,
                    help="where the image and the list file go (default: a temporary directory)")
    ap.add_argument("--timeout", type=int, default=120, help="seconds for each step")
    args = ap.parse_args()
    if (reason := gpu_checks.skip_reason(args)):
        return gpu_checks.skipped(reason)

    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    work = args.workdir or tempfile.mkdtemp(prefix="vmmckpt-restore-check-")
    os.makedirs(work, exist_ok=True)
    image = os.path.join(work, "image")
    list_file = os.path.join(work, "list.txt")
    problems = []
    figures = {}
    prog = subprocess.Popen([args.cuda_ckpt, "run", "--", args.program, "build", list_file, "--nodes", str(args.nodes)],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env)
    try:
        lines = []
        if not read_until_ready(prog, lines, args.timeout):
            prog.kill()
            print(f"FAIL: the builder was not ready (exit {prog.wait()}); it printed: {lines[-5:]}")
            return 1
        dump, figures["dump_s"] = timed([args.cuda_ckpt, "dump", str(prog.pid), "-o", image, "--json"], env,
                                        args.timeout)
        if dump is None or dump.returncode != 0:
            print("FAIL: dump failed: " + (describe(dump) if dump else "timed out"))
            return 1
        figures["dump"] = json.loads(dump.stdout)
    finally:
        # The restored processes must stand on the image alone.
        prog.kill()
        prog.wait()

    try:
        verify = subprocess.run([args.cuda_ckpt, "verify", image], capture_output=True, text=True, env=env)
        if verify.returncode != 0:
            problems.append(f"the image does not verify: {verify.stderr.strip()}")
        steps = [
            ("walk", [], "walk", f"walked {args.nodes} nodes"),
            ("replay", ["--replay"], "replay", f"replayed {args.nodes} nodes"),
        ]
        if args.emulated:
            gpus = int(os.environ.get("VMMCKPT_EMU_DEVICES", "1"))
        else:
            gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.count("GPU ")
        if gpus >= 2:
            # Migration: the same image restored onto the other GPU, every address unchanged.
            steps.append(("migrate", ["--device", "1"], "walk", f"walked {args.nodes} nodes"))
        figures["gpus"] = gpus
        for name, options, mode, expected in steps:
            argv = [args.cuda_ckpt, "restore", image] + options + ["--", args.program, mode, list_file]
            r, seconds = timed(argv, env, args.timeout)
            figures[f"{name}_s"] = seconds
            if r is None:
                problems.append(f"restore ({name}) timed out after {args.timeout} s")
                continue
            out_lines = r.stdout.splitlines()
            kernel = [l for l in out_lines if l.startswith("walk kernel ")]
            if kernel:
                figures[f"{name}_kernel"] = kernel[-1][len("walk kernel "):]
            if r.returncode != 0 or expected not in out_lines:
                problems.append(f"restore ({name}) did not print '{expected}' with exit 0:\n{describe(r)}")
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)

    d = figures.get("dump", {})
    if d:
        print(f"dump: {d['bytes'] / 2**20:.2f} MiB in {d['allocations']} allocations, {figures['dump_s']:.3f} s wall "
              f"(tool: {d['seconds']:.3f} s, held {d['hold_ms']:.1f} ms)")
    for name in ("walk", "replay", "migrate"):
        if f"{name}_s" in figures:
            kernel = f", walk kernel {figures[name + '_kernel']}" if f"{name}_kernel" in figures else ""
            print(f"restore ({name}): {figures[name + '_s']:.3f} s wall, program start to exit{kernel}")
    migrated = " and on the other GPU (--device 1)" if figures.get("gpus", 0) >= 2 else " (one GPU: --device not tried)"
    return gpu_checks.verdict(problems,
                              f"{args.nodes} nodes dumped, restored and walked on the device in both modes{migrated}")


if __name__ == "__main__":
    sys.exit(main())
