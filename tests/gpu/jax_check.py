#!/usr/bin/env python3
"""JAX, with its default preallocation, checkpointed on a GPU.

  jax_check.py --cuda-ckpt build/bin/cuda-ckpt -- python3 jax_hold.py

Under the shim: every array lies in memory the shim owns (the pool or program-made VMM memory); a dump
holds each array's exact bytes (`cuda-ckpt cat`); a suspend frees memory and a resume gives every array
its bytes back; a new process restored from the dump with --replay finds each array's bytes at its old
address before JAX writes anything, and computes the same sums. Prints PASS/FAIL; exits 77 without a GPU
or JAX.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import gpu_checks


def owned_ranges(cuda_ckpt, image):
    r = subprocess.run([cuda_ckpt, "inspect", "--json", image], capture_output=True, text=True)
    if r.returncode != 0:
        raise gpu_checks.CheckError(f"inspect failed: {r.stderr.strip()}")
    m = json.loads(r.stdout)
    return [(int(a["addr"], 16), a["size"]) for p in m["pools"] for a in p["allocations"]], m


def main():
    args = gpu_checks.argument_parser(__doc__).parse_args()
    cmd = gpu_checks.command(args)
    if (reason := gpu_checks.skip_reason(args)):
        return gpu_checks.skipped(reason)
    try:
        import jax  # noqa: F401
    except ImportError:
        return gpu_checks.skipped("JAX is not installed")
    # Preallocation as JAX does it by default, of a smaller share so that images stay small.
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", PYTHONUNBUFFERED="1", XLA_PYTHON_CLIENT_MEM_FRACTION="0.05")
    env.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)
    work = tempfile.mkdtemp(prefix="vmmckpt-jax-check-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    problems, figures = [], {}
    prog = subprocess.Popen([args.cuda_ckpt, "run", "--"] + cmd, stdout=subprocess.PIPE, stdin=subprocess.PIPE,
                            text=True, env=env)
    try:
        lines = []
        for line in prog.stdout:
            lines.append(line)
            if line.strip() == "ready":
                break
        else:
            return gpu_checks.verdict([f"the program exited before it was ready (exit {prog.wait()})"], "")
        arrays = [l.split() for l in lines if l.startswith("array ")]
        image = os.path.join(work, "image")
        d = subprocess.run([args.cuda_ckpt, "dump", str(prog.pid), "-o", image, "--json"], capture_output=True,
                           text=True, env=env)
        if d.returncode != 0:
            raise gpu_checks.CheckError(f"dump failed: {d.stderr.strip()}")
        figures["dump_gib"] = json.loads(d.stdout)["bytes"] / 2**30
        ranges, manifest = owned_ranges(args.cuda_ckpt, image)
        figures["vmm_mappings"] = len((manifest.get("vmm") or {}).get("mappings", []))
        for _, name, ptr, nbytes, sha, _ in arrays:
            addr, size = int(ptr, 16), int(nbytes)
            if not any(a <= addr and addr + size <= a + n for a, n in ranges):
                problems.append(f"array {name} at {ptr} is in no memory the image holds")
            elif hashlib.sha256(gpu_checks.image_bytes(args.cuda_ckpt, image, addr, size)).hexdigest() != sha:
                problems.append(f"array {name}: the image's bytes differ")
        s = subprocess.run([args.cuda_ckpt, "suspend", str(prog.pid), "-o", os.path.join(work, "suspend"), "--json"],
                           capture_output=True, text=True, env=env)
        if s.returncode != 0:
            problems.append(f"suspend failed: {s.stderr.strip()}")
        else:
            figures["suspend_freed_gib"] = json.loads(s.stdout)["freed_bytes"] / 2**30
            r = subprocess.run([args.cuda_ckpt, "resume", str(prog.pid)], capture_output=True, text=True, env=env)
            if r.returncode != 0:
                problems.append(f"resume failed: {r.stderr.strip()}")
        prog.stdin.write("check\n")
        prog.stdin.flush()
        answer = prog.stdout.readline().strip()
        if answer != "ok":
            problems.append(f"after suspend and resume the program says: {answer!r}")
        prog.stdin.write("quit\n")
        prog.stdin.flush()
        prog.wait(timeout=60)
        recorded = os.path.join(work, "arrays.txt")
        with open(recorded, "w") as f:
            f.writelines(l for l in lines if l.startswith("array "))
        rr = subprocess.run([args.cuda_ckpt, "restore", image, "--replay", "--"] + cmd + ["--replayed", recorded],
                            capture_output=True, text=True, env=dict(env, VMMCKPT_LOG_LEVEL="info"), timeout=300)
        out = rr.stdout.split()
        if rr.returncode != 0 or "replay-match" not in out or "ok" not in out:
            shim_lines = [l for l in rr.stderr.splitlines() if "restore" in l or "error" in l][-12:]
            problems.append(f"the --replay restore: exit {rr.returncode}, said {rr.stdout.strip()!r}; "
                            + " | ".join(shim_lines) + " | " + rr.stderr.strip()[-400:])
    except gpu_checks.CheckError as e:
        problems.append(str(e))
    finally:
        prog.kill()
        prog.wait()
        shutil.rmtree(work, ignore_errors=True)
    print("figures: " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()))
    return gpu_checks.verdict(problems, f"{len(arrays)} JAX arrays exact in the dump, after suspend/resume, and in "
                                        "a --replay restore")


if __name__ == "__main__":
    sys.exit(main())
