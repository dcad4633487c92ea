#!/usr/bin/env python3
"""A multi-rank NCCL job checkpointed as a whole (docs/job-checkpoint.md), as users launch it.

  job_check.py --cuda-ckpt build/bin/cuda-ckpt --mode live|process -- python3 -m torch.distributed.run \\
      --nproc-per-node 2 ddp_train.py [--fsdp]

Runs the job natively first for its losses, then under `cuda-ckpt run`, with NCCL's defaults (NCCL_NVLS_ENABLE=0
only). Once every rank has taken a step:
  live:    `dump --job` (every rank's image verifies, job.json names them), then `suspend --job` (every GPU's
           memory in use falls to what the CUDA contexts take) and `resume --job`; the job then ends by itself.
  process: `dump --job --process` (the job ends), `restore DIR` (it comes back with its pids), and the job ends
           by itself.
Every rank's loss at every step must be bitwise the native run's. Exits 77 without two GPUs, PyTorch, or (process)
CRIU and root.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import gpu_checks

# What a GPU keeps in use once a rank's memory is given back: its CUDA context (about 0.5 GiB on an H100) and
# what the driver keeps for NCCL's peer connections.
CONTEXT_MIB = 1024


def losses(text):
    """{(rank, step): hex} from `loss RANK STEP HEX` lines, found anywhere in a line (NCCL writes to the same
    stdout)."""
    return {(int(r), int(s)): v for r, s, v in re.findall(r"loss (\d+) (\d+) (\S+)", text)}


def used_mib():
    """Memory in use on each GPU, as nvidia-smi counts it."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60).stdout
    return [int(x) for x in out.split()]


def ckpt(args, env, *words):
    r = subprocess.run([args.cuda_ckpt, *words, "--json"], capture_output=True, text=True, env=env, timeout=300)
    if r.returncode != 0:
        raise gpu_checks.CheckError(f"cuda-ckpt {' '.join(words)} failed ({r.returncode}): {gpu_checks.failure(r)}")
    return json.loads(r.stdout)


def wait_for(log, pattern, count, seconds, alive):
    """Waits until the log has `count` lines matching pattern; CheckError when the job ended first or time ran out."""
    until = time.time() + seconds
    while time.time() < until:
        with open(log, errors="replace") as f:
            if len(re.findall(pattern, f.read(), re.M)) >= count:
                return
        if not alive():
            raise gpu_checks.CheckError(f"the job ended before /{pattern}/ showed {count} times")
        time.sleep(0.2)
    raise gpu_checks.CheckError(f"/{pattern}/ did not show {count} times within {seconds} s")


def ranks_of(cmd):
    """The job's ranks: torchrun's --nproc-per-node (2 when not given)."""
    for i, word in enumerate(cmd):
        if word.startswith("--nproc-per-node="):
            return int(word.split("=", 1)[1])
        if word == "--nproc-per-node" and i + 1 < len(cmd):
            return int(cmd[i + 1])
    return 2


def live(args, env, job, work, figures):
    """dump --job, then suspend --job and resume --job, mid-job."""
    image = os.path.join(work, "dump")
    d = ckpt(args, env, "dump", "--job", str(job), "-o", image)
    figures.update(dump_s=d["seconds"], dump_cut_ms=d["cut_seconds"] * 1000, dump_held_ms=d["held_ms"],
                   dump_gib=d["bytes"] / 2**30)
    if len(d["ranks"]) != args.ranks:
        raise gpu_checks.CheckError(f"dump --job found {len(d['ranks'])} ranks, not {args.ranks}")
    ckpt(args, env, "verify", image)
    listed = json.load(open(os.path.join(image, "job.json")))
    if sorted(r["pid"] for r in listed["ranks"]) != sorted(r["pid"] for r in d["ranks"]):
        raise gpu_checks.CheckError("job.json does not name the ranks dumped")
    shutil.rmtree(image, ignore_errors=True)
    before = used_mib()
    s = ckpt(args, env, "suspend", "--job", str(job), "-o", os.path.join(work, "suspend"))
    time.sleep(1)
    during = used_mib()
    figures.update(suspend_s=s["seconds"], suspend_cut_ms=s["cut_seconds"] * 1000,
                   freed_gib=s["freed_bytes"] / 2**30)
    for gpu, (b, a) in enumerate(zip(before, during)):
        figures[f"gpu{gpu}_mib_before"], figures[f"gpu{gpu}_mib_suspended"] = b, a
        if a > CONTEXT_MIB:
            raise gpu_checks.CheckError(f"GPU {gpu} still has {a} MiB in use while the job is suspended ({b} before)")
    r = ckpt(args, env, "resume", "--job", str(job))
    figures.update(resume_s=r["seconds"])


def gone(pid):
    """The process is no more (reaped here when it was this checker's child)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
        return False
    except ProcessLookupError:
        return True


def whole(args, env, job, work, figures):
    """dump --job --process, then restore DIR; the restored job's pid is the launcher's."""
    image = os.path.join(work, "whole")
    d = ckpt(args, env, "dump", "--job", str(job), "--process", "-o", image)
    figures.update(process_dump_s=d["seconds"], stopped_s=d["stopped_seconds"])
    until = time.time() + 15  # the job ends as with criu dump; its pids must be free for the restore
    while not gone(job) and time.time() < until:
        time.sleep(0.05)
    r = ckpt(args, env, "restore", image)
    figures.update(process_restore_s=r["seconds"])
    if r.get("pid") != job:
        raise gpu_checks.CheckError(f"restore brought back process {r.get('pid')}, not {job}")


def main():
    ap = gpu_checks.argument_parser(__doc__)
    ap.add_argument("--mode", choices=["live", "process"], required=True)
    args = ap.parse_args()
    cmd = gpu_checks.command(args)
    args.ranks = ranks_of(cmd)
    if (reason := gpu_checks.skip_reason(args, torch=True)):
        return gpu_checks.skipped(reason)
    if gpu_checks.gpu_count() < args.ranks:
        return gpu_checks.skipped(f"this check needs {args.ranks} GPUs (nvidia-h100-x2 or nvidia-h200-x2 for two)")
    if args.mode == "process" and (os.geteuid() != 0 or not os.environ.get("VMMCKPT_CRIU")):
        return gpu_checks.skipped("whole-process checkpoints need root and CRIU 4 (VMMCKPT_CRIU)")
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", PYTHONUNBUFFERED="1")
    native = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=280)
    if native.returncode != 0:
        return gpu_checks.verdict([f"the native run failed ({native.returncode}): {native.stderr[-2000:]}"], "")
    expected = losses(native.stdout)

    work = tempfile.mkdtemp(prefix="vmmckpt-job-", dir="/dev/shm")
    log = os.path.join(work, "job.log")
    problems, figures = [], {}
    # Its own session, its standard streams a file: what a whole-process checkpoint needs (CRIU restores them).
    with open(log, "w") as out:
        job = subprocess.Popen([args.cuda_ckpt, "run", "--"] + cmd, stdin=subprocess.DEVNULL, stdout=out,
                               stderr=subprocess.STDOUT, env=env, start_new_session=True)
    pid = job.pid
    try:
        wait_for(log, r"^ready \d", args.ranks, 120, lambda: not gone(pid))
        (live if args.mode == "live" else whole)(args, env, pid, work, figures)
        until = time.time() + 240
        while not gone(pid) and time.time() < until:
            time.sleep(0.2)
        if not gone(pid):
            problems.append("the job did not end within 240 s")
        text = open(log, errors="replace").read()
        if len(re.findall(r"^done \d", text, re.M)) != args.ranks:
            problems.append(f"not every rank ended ('done'): {text[-3000:]}")
    except (gpu_checks.CheckError, subprocess.TimeoutExpired) as e:
        problems.append(str(e))
    finally:
        subprocess.run(["pkill", "-KILL", "-s", str(pid)], capture_output=True)
        gone(pid)
    got = losses(open(log, errors="replace").read())
    if problems and len(got) < len(expected):
        problems.append(f"the job was ended after {len(got)} of {len(expected)} losses")
    elif got != expected:
        differing = sorted(k for k in expected if got.get(k) != expected[k])
        problems.append(f"{len(differing)} of {len(expected)} losses differ from the native run's (first: rank "
                        f"{differing[0][0]} step {differing[0][1]})" if differing else
                        f"the run has {len(got)} losses, the native run {len(expected)}")
    print("figures: " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()))
    if problems:
        print(open(log, errors="replace").read()[-4000:])
    shutil.rmtree(work, ignore_errors=True)
    return gpu_checks.verdict(problems, f"{len(expected)} losses bitwise the native run's; the job checkpointed "
                                        f"whole ({args.mode})")


if __name__ == "__main__":
    sys.exit(main())
