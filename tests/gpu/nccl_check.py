#!/usr/bin/env python3
"""A two-rank NCCL job checkpointed on two GPUs.

  nccl_check.py --cuda-ckpt build/bin/cuda-ckpt -- python3 -m torch.distributed.run --nproc-per-node 2 nccl_steps.py

Runs the job under the shim (NCCL allocates its own buffers with cuMemCreate), with NCCL's transports
between the ranks kept to the network stack (NCCL_P2P_DISABLE, NCCL_SHM_DISABLE): CUDA memory one rank
imports from another is that rank's to save (`imported VMM`). Checks: a dump of each rank holds
program-made VMM memory (NCCL's buffers) and verifies; rank 0 is suspended after step 5 and resumed a moment
later; every step's result on both ranks is the expected sum. Exits 77 without two GPUs or PyTorch.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import gpu_checks


def gpu_count():
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return len(out.stdout.splitlines()) if out.returncode == 0 else 0


def main():
    args = gpu_checks.argument_parser(__doc__).parse_args()
    cmd = gpu_checks.command(args)
    if (reason := gpu_checks.skip_reason(args, torch=True)):
        return gpu_checks.skipped(reason)
    if gpu_count() < 2:
        return gpu_checks.skipped("this check needs two GPUs (the nvidia-h200-x2 machine)")
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1", PYTHONUNBUFFERED="1")
    work = tempfile.mkdtemp(prefix="vmmckpt-nccl-check-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    problems, figures, lines, pids = [], {}, [], {}
    job = subprocess.Popen([args.cuda_ckpt, "run", "--"] + cmd, stdout=subprocess.PIPE, text=True, env=env)
    try:
        for line in job.stdout:
            lines.append(line.strip())
            if line.startswith("pid "):
                _, rank, pid = line.split()
                pids[int(rank)] = int(pid)
            if line.startswith("result 0 step_5 "):
                break
        else:
            raise gpu_checks.CheckError(f"the job ended before step 5 (exit {job.wait()})")
        for rank, pid in sorted(pids.items()):
            image = os.path.join(work, f"rank{rank}")
            d = subprocess.run([args.cuda_ckpt, "dump", str(pid), "-o", image, "--json"], capture_output=True,
                               text=True, env=env)
            if d.returncode != 0:
                problems.append(f"dump of rank {rank} failed: {d.stderr.strip()}")
                continue
            m = json.loads(subprocess.run([args.cuda_ckpt, "inspect", "--json", image], capture_output=True,
                                          text=True).stdout)
            mappings = (m.get("vmm") or {}).get("mappings", [])
            figures[f"rank{rank}_vmm_mib"] = sum(x["size"] for x in mappings) / 2**20
            if not mappings:
                problems.append(f"rank {rank}'s image holds no NCCL buffers (no program-made VMM memory)")
            if subprocess.run([args.cuda_ckpt, "verify", image], capture_output=True).returncode != 0:
                problems.append(f"rank {rank}'s image does not verify")
            shutil.rmtree(image, ignore_errors=True)
        s = subprocess.run([args.cuda_ckpt, "suspend", str(pids[0]), "-o", os.path.join(work, "suspend"), "--json"],
                           capture_output=True, text=True, env=env)
        if s.returncode != 0:
            problems.append(f"suspend of rank 0 failed: {s.stderr.strip()}")
        else:
            figures["rank0_freed_mib"] = json.loads(s.stdout)["freed_bytes"] / 2**20
            time.sleep(2)
            r = subprocess.run([args.cuda_ckpt, "resume", str(pids[0])], capture_output=True, text=True, env=env)
            if r.returncode != 0:
                problems.append(f"resume of rank 0 failed: {r.stderr.strip()}")
        rest, _ = job.communicate(timeout=300)
        lines += rest.splitlines()
        if job.returncode != 0:
            problems.append(f"the job exited with {job.returncode}")
    except (gpu_checks.CheckError, subprocess.TimeoutExpired) as e:
        problems.append(str(e))
    finally:
        job.kill()
        job.wait()
        shutil.rmtree(work, ignore_errors=True)
    results = [l.split() for l in lines if l.startswith("result ")]
    wrong = [l for l in results if float(l[3]) != 3.0 * (int(l[2].split("_")[1]) + 1)]
    steps = {r: sum(1 for l in results if l[1] == str(r)) for r in (0, 1)}
    if wrong:
        problems.append(f"{len(wrong)} wrong results, the first: {' '.join(wrong[0])}")
    if steps[0] != steps[1] or steps[0] == 0:
        problems.append(f"the ranks ran {steps[0]} and {steps[1]} steps")
    print("figures: " + ", ".join(f"{k}={v:.1f}" for k, v in figures.items()))
    return gpu_checks.verdict(problems, f"both ranks dumped with NCCL's buffers; rank 0 suspended and resumed "
                                        f"mid-job; {steps[0]} steps on each rank, every result exact")


if __name__ == "__main__":
    sys.exit(main())
