#!/usr/bin/env python3
"""A multi-rank NCCL training job as users launch it, under the shim, checkpointed rank by rank mid-job.

  nccl_job_check.py --cuda-ckpt build/bin/cuda-ckpt [--legacy-ipc] -- python3 -m torch.distributed.run \\
      --nproc-per-node 2 ddp_train.py [--fsdp]

Runs the job natively first, then under `cuda-ckpt run`, with NCCL's defaults (NCCL_NVLS_ENABLE=0 only;
--legacy-ipc adds NCCL_CUMEM_ENABLE=0). Once every rank has taken its first step, each rank is dumped while
the job runs, with no --allow-partial: the dump must succeed, its image verify, and hold at least the rank's
torch.cuda.memory_reserved() plus what `cuda-ckpt ps` counts as NCCL's; `ps` must list every rank with its
device. The job must then end by itself, and every rank's loss at every step must be bitwise the native run's.
Exits 77 without two GPUs or PyTorch.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import gpu_checks


def losses(lines):
    """{(rank, step): hex} from the job's `loss RANK STEP HEX` lines, found anywhere in a line: NCCL writes its
    own messages to the same stdout through C's buffered stdio, and a part of one can precede a rank's line."""
    out = {}
    for line in lines:
        for rank, step, value in re.findall(r"loss (\d+) (\d+) (\S+)", line):
            out[(int(rank), int(step))] = value
    return out


def field(lines, name):
    """{rank: int} from `NAME RANK VALUE` lines."""
    out = {}
    for line in lines:
        parts = line.split()
        if len(parts) == 3 and parts[0] == name:
            out[int(parts[1])] = int(parts[2])
    return out


def dump_rank(args, env, rank, pid, reserved, work, figures):
    """Problems with a mid-job dump of one rank (an empty list when there are none)."""
    problems = []
    ps = subprocess.run([args.cuda_ckpt, "ps", str(pid), "--json"], capture_output=True, text=True, env=env)
    entry = next((e for e in json.loads(ps.stdout or "[]") if e.get("pid") == pid), None) if ps.returncode == 0 else None
    if entry is None:
        return [f"ps does not list rank {rank} ({pid}): {gpu_checks.failure(ps)}"]
    if not entry.get("devices"):
        problems.append(f"ps lists no device for rank {rank}")
    nccl = entry.get("nccl_bytes", 0)
    figures[f"rank{rank}_nccl_mib"] = nccl / 2**20
    if not args.legacy_ipc and nccl == 0:
        problems.append(f"ps counts nothing as NCCL's in rank {rank}")
    image = os.path.join(work, f"rank{rank}")
    d = subprocess.run([args.cuda_ckpt, "dump", str(pid), "-o", image, "--json"], capture_output=True, text=True, env=env)
    if d.returncode != 0:
        return problems + [f"dump of rank {rank} failed: {gpu_checks.failure(d)}"]
    figures[f"rank{rank}_held_ms"] = json.loads(d.stdout).get("hold_ms", 0)
    m = json.loads(subprocess.run([args.cuda_ckpt, "inspect", "--json", image], capture_output=True, text=True).stdout)
    if m.get("lacking"):
        problems.append(f"rank {rank}'s image lacks {m['lacking']}")
    stored = sum(a["size"] for pool in m.get("pools", []) for a in pool["allocations"])
    figures[f"rank{rank}_image_mib"] = stored / 2**20
    if stored < reserved + nccl:
        problems.append(f"rank {rank}'s image holds {stored} bytes, less than memory_reserved {reserved} plus NCCL's "
                        f"{nccl}")
    imports = len((m.get("vmm") or {}).get("imports", [])) + len(m.get("ipc_imports", []))
    figures[f"rank{rank}_imports"] = imports
    if subprocess.run([args.cuda_ckpt, "verify", image], capture_output=True).returncode != 0:
        problems.append(f"rank {rank}'s image does not verify")
    shutil.rmtree(image, ignore_errors=True)
    return problems


def main():
    ap = gpu_checks.argument_parser(__doc__)
    ap.add_argument("--legacy-ipc", action="store_true", help="NCCL_CUMEM_ENABLE=0: buffers shared by legacy CUDA IPC")
    args = ap.parse_args()
    cmd = gpu_checks.command(args)
    if (reason := gpu_checks.skip_reason(args, torch=True)):
        return gpu_checks.skipped(reason)
    if gpu_checks.gpu_count() < 2:
        return gpu_checks.skipped("this check needs two GPUs (nvidia-h100-x2 or nvidia-h200-x2)")
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", PYTHONUNBUFFERED="1")
    if args.legacy_ipc:
        env["NCCL_CUMEM_ENABLE"] = "0"
    native = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=280)
    if native.returncode != 0:
        return gpu_checks.verdict([f"the native run failed ({native.returncode}): {native.stderr[-2000:]}"], "")
    expected = losses(native.stdout.splitlines())

    work = tempfile.mkdtemp(prefix="vmmckpt-nccl-job-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    problems, figures, lines = [], {}, []
    job = subprocess.Popen([args.cuda_ckpt, "run", "--"] + cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=env)
    try:
        ready = set()
        for line in job.stdout:
            lines.append(line.strip())
            if line.startswith("ready "):
                ready.add(int(line.split()[1]))
            if len(ready) == 2:
                break
        else:
            raise gpu_checks.CheckError(f"the job ended before every rank took a step (exit {job.wait()}): "
                                        f"{job.stderr.read()[-3000:]}")
        pids, reserved = field(lines, "pid"), field(lines, "reserved")
        for rank in sorted(pids):
            problems += dump_rank(args, env, rank, pids[rank], reserved.get(rank, 0), work, figures)
        rest, err = gpu_checks.finish(job, 240)
        lines += rest.splitlines()
        if job.returncode != 0:
            problems.append(f"the job exited with {job.returncode}: {err[-3000:]}")
    except (gpu_checks.CheckError, subprocess.TimeoutExpired) as e:
        problems.append(str(e))
    finally:
        job.kill()
        job.wait()
        shutil.rmtree(work, ignore_errors=True)
    got = losses(lines)
    if len(got) != len(expected):
        print("the job's output under the shim:\n" + "\n".join(lines))
    if got != expected:
        differing = sorted(k for k in expected if got.get(k) != expected[k])
        problems.append(f"{len(differing)} of {len(expected)} losses differ from the native run's "
                        f"(first: rank {differing[0][0]} step {differing[0][1]})" if differing else
                        f"the run has {len(got)} losses, the native run {len(expected)}")
    print("figures: " + ", ".join(f"{k}={v:.1f}" for k, v in figures.items()))
    return gpu_checks.verdict(problems, f"{len(expected)} losses bitwise the native run's; every rank dumped mid-job "
                                        "without --allow-partial, its image verified")


if __name__ == "__main__":
    sys.exit(main())
