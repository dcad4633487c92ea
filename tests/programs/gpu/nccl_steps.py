"""GPU test program: a two-rank NCCL job (torchrun --nproc-per-node 2), one all-reduce per step.

Each rank prints `pid <rank> <pid>`, `ready <rank>` after the first step, and `result <rank> step_<i> <value>`
per step; it sleeps a little between steps so that a checkpoint can land in the middle. Step i's all-reduce
of (rank + 1) * (i + 1) over 1 Mi floats sums to 3 * (i + 1) per element on two ranks.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist

from rank_output import say  # beside this file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--sleep", type=float, default=0.1)
    args = ap.parse_args()
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    say(f"pid {rank} {os.getpid()}")
    t = torch.empty(1 << 20, device="cuda")
    for step in range(args.steps):
        t.fill_(float((rank + 1) * (step + 1)))
        dist.all_reduce(t)
        value = t.sum().item() / t.numel()
        say(f"result {rank} step_{step} {value!r}")
        if step == 0:
            say(f"ready {rank}")
        time.sleep(args.sleep)
    dist.destroy_process_group()
    say(f"done {rank}")


if __name__ == "__main__":
    main()
