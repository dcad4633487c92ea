#!/usr/bin/env python3
"""A two-rank NCCL job checkpointed on two GPUs.

  nccl_check.py --cuda-ckpt build/bin/cuda-ckpt [--legacy-ipc] -- python3 -m torch.distributed.run --nproc-per-node 2 nccl_steps.py

Runs the job under the shim with NCCL's defaults (NCCL_NVLS_ENABLE=0 only: every transport stays on). Two modes:

- default: NCCL allocates its own buffers with cuMemCreate and, between two GPUs of one host, shares them through
  its P2P (and SHM) transports as POSIX FDs each rank imports from the other. Checks: a dump of each rank holds
  program-made VMM memory (NCCL's buffers), records the other rank's memory it maps as imports naming that rank
  (`vmm.imports`), needs no --allow-partial and verifies; a suspend of rank 0 is refused, naming rank 1 (its
  memory is mapped there), and leaves no image; every step's result on both ranks is the expected sum.
- --legacy-ipc: NCCL_CUMEM_ENABLE=0: NCCL's buffers are cudaMalloc'd pool memory that each rank shares with the
  other through cudaIpcGetMemHandle (docs/ipc.md). Checks: a dump of each rank verifies, holds pool memory and
  records the other rank's memory it maps (`ipc_imports`, exporter = the other rank); a suspend of rank 0 is
  refused, naming rank 1, and leaves no image; every step's result on both ranks is the expected sum.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import gpu_checks


def refusal_problem(r, image, importer_pid):
    """What is wrong with the refused suspend of an exporter whose memory `importer_pid` maps, or None."""
    if r.returncode == 0:
        return "the suspend of rank 0 succeeded while rank 1 maps its memory: it must be refused"
    text = gpu_checks.failure(r)
    named = re.search(r"\(pid ([0-9, ]+)", text)
    if not named or str(importer_pid) not in named.group(1).replace(" ", "").split(","):
        return f"the suspend of rank 0 was refused, but not for rank 1 ({importer_pid}) mapping its memory: {text}"
    if os.path.exists(image):
        return f"the refused suspend left {image}"
    return None


def main():
    ap = gpu_checks.argument_parser(__doc__)
    ap.add_argument("--legacy-ipc", action="store_true",
                    help="NCCL_CUMEM_ENABLE=0 with its P2P transport: buffers shared through legacy CUDA IPC")
    args = ap.parse_args()
    cmd = gpu_checks.command(args)
    if (reason := gpu_checks.skip_reason(args, torch=True)):
        return gpu_checks.skipped(reason)
    if gpu_checks.gpu_count() < 2:
        return gpu_checks.skipped("this check needs two GPUs (the nvidia-h200-x2 machine)")
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", PYTHONUNBUFFERED="1")
    if args.legacy_ipc:
        env["NCCL_CUMEM_ENABLE"] = "0"
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
        if sorted(pids) != [0, 1]:
            raise gpu_checks.CheckError(f"the job named the pids of ranks {sorted(pids)}, not of 0 and 1")
        for rank, pid in sorted(pids.items()):
            image = os.path.join(work, f"rank{rank}")
            d = subprocess.run([args.cuda_ckpt, "dump", str(pid), "-o", image, "--json"], capture_output=True,
                               text=True, env=env)
            if d.returncode != 0:
                problems.append(f"dump of rank {rank} failed: {gpu_checks.failure(d)}")
                continue
            m = json.loads(subprocess.run([args.cuda_ckpt, "inspect", "--json", image], capture_output=True,
                                          text=True).stdout)
            mappings = (m.get("vmm") or {}).get("mappings", [])
            figures[f"rank{rank}_vmm_mib"] = sum(x["size"] for x in mappings) / 2**20
            if args.legacy_ipc:
                pooled = sum(a["size"] for pool in m.get("pools", []) for a in pool["allocations"])
                figures[f"rank{rank}_pool_mib"] = pooled / 2**20
                if not pooled:
                    problems.append(f"rank {rank}'s image holds no pool memory (NCCL's cudaMalloc'd buffers)")
                other = pids[1 - rank]
                imports = m.get("ipc_imports", [])
                figures[f"rank{rank}_imported_mib"] = sum(i["size"] for i in imports) / 2**20
                if not any(i["exporter_pid"] == other for i in imports):
                    problems.append(f"rank {rank}'s image records no memory of rank {1 - rank} ({other}) mapped "
                                    f"through CUDA IPC (imports: {[i['exporter_pid'] for i in imports]}); did NCCL "
                                    "use its P2P transport between the GPUs? (NCCL_DEBUG=INFO names the transport)")
            else:
                if not mappings:
                    problems.append(f"rank {rank}'s image holds no NCCL buffers (no program-made VMM memory)")
                other = pids[1 - rank]
                imports = (m.get("vmm") or {}).get("imports", [])
                figures[f"rank{rank}_imported_mib"] = sum(i["size"] for i in imports) / 2**20
                if not any(i["exporter_pid"] == other for i in imports):
                    problems.append(f"rank {rank}'s image records no memory of rank {1 - rank} ({other}) it imported")
                if m.get("lacking"):
                    problems.append(f"rank {rank}'s image lacks {m['lacking']}")
            if subprocess.run([args.cuda_ckpt, "verify", image], capture_output=True).returncode != 0:
                problems.append(f"rank {rank}'s image does not verify")
            shutil.rmtree(image, ignore_errors=True)
        suspend_image = os.path.join(work, "suspend")
        s = subprocess.run([args.cuda_ckpt, "suspend", str(pids[0]), "-o", suspend_image, "--json"],
                           capture_output=True, text=True, env=env)
        if (problem := refusal_problem(s, suspend_image, pids[1])):
            problems.append(problem)
        if s.returncode == 0:  # refused by design; if it was not, the job still needs its rank back
            subprocess.run([args.cuda_ckpt, "resume", str(pids[0])], capture_output=True, env=env)
        rest, _ = gpu_checks.finish(job, 300)
        lines += rest.splitlines()
        if job.returncode != 0:
            problems.append(f"the job exited with {job.returncode}")
    except (gpu_checks.CheckError, subprocess.TimeoutExpired) as e:
        problems.append(str(e))
    finally:
        job.kill()
        job.wait()
        shutil.rmtree(work, ignore_errors=True)
    # Found anywhere in a line: NCCL writes its own messages to the same stdout, through C's buffered stdio, and
    # a part of one can precede a rank's line.
    results = [["result", r, step, value] for l in lines
               for r, step, value in re.findall(r"result (\d) (step_\d+) ([0-9.]+)", l)]
    wrong = [l for l in results if float(l[3]) != 3.0 * (int(l[2].split("_")[1]) + 1)]
    steps = {r: sum(1 for l in results if l[1] == str(r)) for r in (0, 1)}
    if steps[0] != steps[1]:
        print("the job's output:\n" + "\n".join(lines))
    if wrong:
        problems.append(f"{len(wrong)} wrong results, the first: {' '.join(wrong[0])}")
    if steps[0] != steps[1] or steps[0] == 0:
        problems.append(f"the ranks ran {steps[0]} and {steps[1]} steps")
    print("figures: " + ", ".join(f"{k}={v:.1f}" for k, v in figures.items()))
    how = "CUDA IPC" if args.legacy_ipc else "imported POSIX FDs"
    passed = (f"both ranks dumped, each recording the other's memory it maps through {how}; the suspend of rank 0 "
              "refused, naming rank 1")
    return gpu_checks.verdict(problems, f"{passed}; {steps[0]} steps on each rank, every result exact")


if __name__ == "__main__":
    sys.exit(main())
