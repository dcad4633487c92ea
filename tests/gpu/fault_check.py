#!/usr/bin/env python3
"""Kills cuda-ckpt at every phase of dump and suspend against a GPU program whose kernels keep writing.

  fault_check.py --cuda-ckpt build/bin/cuda-ckpt -- build/tests/programs/gpu_busy_kernels ...

After every kill: the program is alive, its pool consistent (`cuda-ckpt check`), resumable when the
kill came after it had suspended, nothing left behind passes verify, and a new dump verifies with no
torn buffer. Prints the fault points tried and PASS/FAIL; exits 77 without a GPU.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dump_check import check_busy  # noqa: E402

DUMP_PHASES = ["connected", "held", "copying", "writing", "renaming"]
SUSPEND_PHASES = DUMP_PHASES + ["verified", "suspended"]


def run(argv, **kw):
    # Never wait forever: a hang is a failure to report, not a test timeout.
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, **kw)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"timed out: {' '.join(argv)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cuda-ckpt", required=True)
    ap.add_argument("--buffer-size", type=int, default=64 << 20)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd
    if not os.path.exists("/dev/nvidia0"):
        print("SKIPPED: no GPU (/dev/nvidia0 does not exist)")
        return 77
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    ck = args.cuda_ckpt
    work = tempfile.mkdtemp(prefix="vmmckpt-fault-check-")
    prog = subprocess.Popen([ck, "run", "--"] + cmd, stdout=subprocess.PIPE, text=True, env=env)
    problems, tried = [], 0

    def state():
        for p in json.loads(run([ck, "ps", "--json"]).stdout or "[]"):
            if p["pid"] == prog.pid:
                return p
        return {}

    try:
        for line in prog.stdout:
            if line.strip() == "ready":
                break
        for command, phases in (("dump", DUMP_PHASES), ("suspend", SUSPEND_PHASES)):
            for phase in phases:
                tried += 1
                out = os.path.join(work, f"{command}-{phase}")
                print(f"{command} killed at {phase}", flush=True)
                r = run([ck, command, str(prog.pid), "-o", out], env=dict(env, VMMCKPT_TEST_FAULT=phase))
                where = f"{command} killed at {phase}"
                if r.returncode != -9:
                    problems.append(f"{where}: the tool did not die there (exit {r.returncode}): {r.stderr[-500:]}")
                if prog.poll() is not None:
                    problems.append(f"{where}: the program died")
                    return 1
                if state().get("state") == "suspended":
                    if phase != "suspended":
                        problems.append(f"{where}: the program was suspended though the tool died first")
                    if run([ck, "resume", str(prog.pid)]).returncode != 0:
                        problems.append(f"{where}: resume failed")
                if run([ck, "check", str(prog.pid)]).returncode != 0:
                    problems.append(f"{where}: the pool is not consistent")
                for name in os.listdir(work):
                    if name.startswith(f"{command}-{phase}") and not (command == "suspend" and phase in ("verified", "suspended")):
                        if run([ck, "verify", os.path.join(work, name)]).returncode == 0:
                            problems.append(f"{where}: left {name}, which passes verify")
                after = os.path.join(work, f"after-{command}-{phase}")
                d = run([ck, "dump", str(prog.pid), "-o", after], env=env)
                if d.returncode != 0:
                    problems.append(f"{where}: the next dump failed: {d.stderr.strip()}")
                elif (defect := check_busy(after, args.buffer_size)):
                    problems.append(f"{where}: the next dump: {defect}")
                shutil.rmtree(after, ignore_errors=True)
    finally:
        alive = prog.poll() is None
        prog.kill()
        prog.wait()
        shutil.rmtree(work, ignore_errors=True)
    if not alive:
        problems.append("the program did not survive")
    print(f"fault points tried: {tried} ({len(DUMP_PHASES)} in dump, {len(SUSPEND_PHASES)} in suspend)")
    if problems:
        print("FAIL: " + "; ".join(problems))
        return 1
    print(f"PASS: the tool killed at {tried} points; the program ran on unharmed and every later dump verified untorn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
