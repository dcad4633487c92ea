#!/usr/bin/env python3
"""What a preallocating framework costs to checkpoint: JAX with XLA's default preallocation (75 % of the GPU)
holding N GiB of arrays, dumped, suspended and resumed, for one or more builds of cuda-ckpt side by side.

  prealloc_bench.py --cuda-ckpt NAME=PATH [--cuda-ckpt NAME=PATH ...] [--case CASE ...] [--shm DIR]
                    [--disk DIR] [--python PY]

Cases (each a fresh program per build, the builds in turn):
  jax-1g-shm    1 GiB of arrays; dump into --shm, then suspend (into --shm) and resume
  jax-16g-disk  16 GiB of arrays; dump into --disk, and `dd` of the same bytes to --disk as the limit
  jax-32g-shm   32 GiB of arrays (no block of zeros); dump into --shm
Every program checks its arrays after the dump and after the resume (an exact integer sum of their bits).
Prints one JSON line per measurement; exits 1 when a check failed.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

GIB = 1 << 30

# The program: N GiB of float32 arrays with no zero in them, then answers stdin: `check` prints the exact
# sum of their bits, `quit` ends it.
PROGRAM = r"""
import sys
import jax, jax.numpy as jnp
gib = float(sys.argv[1])
per = 1 << 28  # floats: 1 GiB an array
left, k, arrays = int(gib * (1 << 28)), 0, []
while left > 0:
    n = min(per, left)
    arrays.append(jax.random.uniform(jax.random.PRNGKey(k), (n,), dtype=jnp.float32, minval=1.0, maxval=2.0))
    left -= n
    k += 1
def total():
    return sum(int(jnp.sum(jax.lax.bitcast_convert_type(a, jnp.uint32), dtype=jnp.uint32)) for a in arrays) % 2**32
print("ready", total(), flush=True)
for line in sys.stdin:
    if line.strip() == "check":
        print("sum", total(), flush=True)
    elif line.strip() == "quit":
        break
"""


FAILED = []


def emit(**fields):
    if fields.get("ok") is False or "error" in fields:
        FAILED.append(fields)
    print(json.dumps(fields), flush=True)


class program:
    def __init__(self, cuda_ckpt, python, gib):
        env = dict(os.environ, NCCL_NVLS_ENABLE="0", PYTHONUNBUFFERED="1")
        for k in ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_ALLOCATOR"):
            env.pop(k, None)  # JAX's defaults: preallocation of 75 % of the GPU
        self.p = subprocess.Popen([cuda_ckpt, "run", "--", python, "-c", PROGRAM, str(gib)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env)
        line = self.p.stdout.readline().split()
        if not line or line[0] != "ready":
            self.p.kill()
            raise RuntimeError(f"the JAX program did not start: {line}")
        self.sum = line[1]

    def check(self):
        self.p.stdin.write("check\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().split() == ["sum", self.sum]

    def close(self):
        try:
            self.p.stdin.write("quit\n")
            self.p.stdin.flush()
            self.p.wait(timeout=60)
        except Exception:
            self.p.kill()
            self.p.wait()


def run_json(cmd):
    start = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - start
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()[-500:]}")
    return (json.loads(r.stdout) if r.stdout.strip().startswith("{") else {}), wall


def image_size(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def dump(build, cuda_ckpt, prog, where, case):
    out = os.path.join(where, f"dump-{build}")
    j, wall = run_json([cuda_ckpt, "dump", str(prog.p.pid), "-o", out, "--json"])
    emit(case=case, build=build, op="dump", seconds=j["seconds"], wall_s=wall, hold_ms=j["hold_ms"],
         bytes=j["bytes"], zero_bytes=j.get("zero_bytes", 0), image_bytes=image_size(out),
         checksums=j.get("checksums"), gpu_snapshot=j.get("gpu_snapshot"), ok=prog.check())
    shutil.rmtree(out, ignore_errors=True)


def suspend_resume(build, cuda_ckpt, prog, where, case):
    out = os.path.join(where, f"suspend-{build}")
    s, s_wall = run_json([cuda_ckpt, "suspend", str(prog.p.pid), "-o", out, "--json"])
    _, r_wall = run_json([cuda_ckpt, "resume", str(prog.p.pid)])
    emit(case=case, build=build, op="suspend+resume", suspend_s=s["seconds"], suspend_wall_s=s_wall,
         hold_ms=s["hold_ms"], bytes=s["bytes"], zero_bytes=s.get("zero_bytes", 0), resume_wall_s=r_wall,
         ok=prog.check())
    shutil.rmtree(out, ignore_errors=True)


def dd(where, gib, case):
    target = os.path.join(where, "dd-limit")
    start = time.monotonic()
    r = subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=64M", f"count={int(gib * 16)}", "conv=fdatasync"],
                       capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - start
    os.unlink(target)
    emit(case=case, build="dd", op="dd", seconds=wall, bytes=int(gib * GIB), ok=r.returncode == 0)


CASES = {"jax-1g-shm": (1, "shm", True), "jax-16g-disk": (16, "disk", False), "jax-32g-shm": (32, "shm", False)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cuda-ckpt", action="append", required=True, metavar="NAME=PATH")
    ap.add_argument("--case", action="append", choices=sorted(CASES))
    ap.add_argument("--shm", default="/dev/shm")
    ap.add_argument("--disk", default=tempfile.gettempdir())
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    builds = [b.split("=", 1) for b in args.cuda_ckpt]
    for case in args.case or list(CASES):
        gib, place, with_suspend = CASES[case]
        where = tempfile.mkdtemp(prefix="vmmckpt-prealloc-", dir=args.shm if place == "shm" else args.disk)
        try:
            for build, cuda_ckpt in builds:
                prog = None
                try:
                    prog = program(cuda_ckpt, args.python, gib)
                    dump(build, cuda_ckpt, prog, where, case)
                    if with_suspend:
                        suspend_resume(build, cuda_ckpt, prog, where, case)
                except Exception as e:  # one failure is recorded; the other builds still run
                    emit(case=case, build=build, error=str(e))
                finally:
                    if prog:
                        prog.close()
            if place == "disk":
                dd(where, gib, case)
        finally:
            shutil.rmtree(where, ignore_errors=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
