#!/usr/bin/env python3
"""Kills cuda-ckpt at every phase of dump and suspend against a GPU program whose kernels keep writing.

  fault_check.py --cuda-ckpt build/bin/cuda-ckpt --pattern-check build/tests/programs/busy_pattern_check
                 -- build/tests/programs/gpu_busy_kernels ...

After every kill: the program is alive, its pool consistent (`cuda-ckpt check`), resumable when the
kill came after it had suspended, nothing left behind passes verify, and a new dump verifies with no
torn buffer. Prints the fault points tried and PASS/FAIL; exits 77 without a GPU.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import gpu_checks

DUMP_PHASES = ["connected", "held", "copying", "writing", "renaming"]
SUSPEND_PHASES = DUMP_PHASES + ["verified", "suspended"]


def run(argv, **kw):
    # Never wait forever: a hang is a failure to report, not a test timeout.
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, **kw)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"timed out: {' '.join(argv)}")


def main():
    ap = gpu_checks.argument_parser(__doc__)
    ap.add_argument("--pattern-check", required=True, help="busy_pattern_check")
    ap.add_argument("--buffer-size", type=int, default=64 << 20)
    args = ap.parse_args()
    cmd = gpu_checks.command(args)
    if (reason := gpu_checks.skip_reason(args)):
        return gpu_checks.skipped(reason)
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
                else:
                    try:
                        defect = gpu_checks.busy_problem(ck, args.pattern_check, after, args.buffer_size)
                    except gpu_checks.CheckError as e:
                        defect = str(e)
                    if defect:
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
    return gpu_checks.verdict(
        problems, f"the tool killed at {tried} points; the program ran on unharmed and every later dump verified untorn")


if __name__ == "__main__":
    sys.exit(main())
