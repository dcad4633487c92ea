#!/usr/bin/env python3
"""GPU test program: deterministic data-parallel training over NCCL, one rank per GPU (torchrun).

  torchrun --nproc-per-node 2 ddp_train.py [--fsdp] [--steps N] [--sleep S]

Each rank prints `pid RANK PID`, after the first step `ready RANK` and `reserved RANK BYTES`
(torch.cuda.memory_reserved()), and each step's loss as `loss RANK STEP HEX` (float.hex: bitwise). The same
command gives the same losses in every run, native or under the shim, checkpointed meanwhile or not. A
two-layer MLP on fixed random data, wrapped in DistributedDataParallel, or in FullyShardedDataParallel with
--fsdp. NCCL runs with its defaults: nothing here turns a transport off.
"""
import argparse
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from rank_output import say  # noqa: E402  (beside this file)
from torch_reproducible import make_reproducible  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdp", action="store_true")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--sleep", type=float, default=0.02)
    ap.add_argument("--width", type=int, default=2048)
    args = ap.parse_args()
    rank = int(os.environ["RANK"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    say(f"pid {rank} {os.getpid()}")
    make_reproducible(1234)
    model = torch.nn.Sequential(torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                                torch.nn.Linear(args.width, 16)).to(device)
    if args.fsdp:
        from torch.distributed.fsdp import FullyShardedDataParallel
        model = FullyShardedDataParallel(model, device_id=device, use_orig_params=True)
    else:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    generator = torch.Generator(device=device).manual_seed(100 + rank)
    inputs = torch.randn(64, args.width, device=device, generator=generator)
    targets = torch.randn(64, 16, device=device, generator=generator)
    for step in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        say(f"loss {rank} {step} {loss.item().hex()}")
        if step == 0:
            say(f"reserved {rank} {torch.cuda.memory_reserved(device)}")
            say(f"ready {rank}")
        time.sleep(args.sleep)
    dist.barrier()
    dist.destroy_process_group()
    say(f"done {rank}")


if __name__ == "__main__":
    sys.exit(main())
