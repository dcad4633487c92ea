#!/usr/bin/env python3
"""NCCL under the shim against native, side by side: all-reduce bus bandwidth and a DDP training step.

  nccl_bench.py --cuda-ckpt build/bin/cuda-ckpt [--gpus 2] [--rounds 3] [--size-mib 1024] [--json OUT]

Runs a two-part job with torchrun, one rank per GPU, NCCL's defaults (NCCL_NVLS_ENABLE=0 only), alternately
natively and under `cuda-ckpt run`, `--rounds` times each (ABAB, so that drift affects both alike):
- all-reduce of --size-mib MiB of float32, 5 warm-up and 20 timed calls: bus bandwidth as nccl-tests counts
  it (bytes / time * 2 (n - 1) / n; with --gpus 1, bytes / time), the timed calls' median per round;
- a DDP step of a 4096-wide MLP (forward, backward, all-reduce of the gradients, SGD), 10 warm-up and 50 timed.
Prints each round and the medians with their ratio (shim / native); --json writes them too.
As a worker (under torchrun, --worker) it runs one round and rank 0 prints one JSON line.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def worker(size_mib):
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    data = torch.ones(size_mib * 2**20 // 4, device=device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(5):
        dist.all_reduce(data)
    times = []
    for _ in range(20):
        start.record()
        dist.all_reduce(data)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    bytes_ = data.numel() * 4
    # One rank moves nothing between GPUs (a bus factor of 0): its figure is the algorithm bandwidth instead.
    busbw = bytes_ / statistics.median(times) * (2 * (world - 1) / world if world > 1 else 1) / 1e9

    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096)).to(device)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 4096, device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    for _ in range(10):
        step()
    torch.cuda.synchronize()
    steps = []
    for _ in range(50):
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        steps.append(time.perf_counter() - t)
    dist.barrier()
    if rank == 0:
        print("RESULT " + json.dumps({"busbw_gbs": busbw, "step_ms": statistics.median(steps) * 1000}), flush=True)
    dist.destroy_process_group()


def one_round(args, under_shim):
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={args.gpus}", os.path.abspath(__file__),
           "--worker", "--size-mib", str(args.size_mib)]
    if under_shim:
        cmd = [args.cuda_ckpt, "run", "--"] + cmd
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{'shim' if under_shim else 'native'} round failed ({r.returncode}): {r.stderr[-2000:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cuda-ckpt")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--json")
    ap.add_argument("--worker", action="store_true")
    args = ap.parse_args()
    if args.worker:
        return worker(args.size_mib)
    if not args.cuda_ckpt:
        ap.error("--cuda-ckpt is required")
    rounds = {"native": [], "shim": []}
    for i in range(args.rounds):
        for mode in ("native", "shim"):
            r = one_round(args, mode == "shim")
            rounds[mode].append(r)
            print(f"round {i + 1} {mode:6s}: all-reduce {args.size_mib} MiB {r['busbw_gbs']:.1f} GB/s bus, "
                  f"DDP step {r['step_ms']:.3f} ms", flush=True)
    summary = {}
    for key in ("busbw_gbs", "step_ms"):
        native = statistics.median(r[key] for r in rounds["native"])
        shim = statistics.median(r[key] for r in rounds["shim"])
        summary[key] = {"native": native, "shim": shim, "ratio": shim / native}
    print(f"median all-reduce bus bandwidth: native {summary['busbw_gbs']['native']:.1f} GB/s, shim "
          f"{summary['busbw_gbs']['shim']:.1f} GB/s ({summary['busbw_gbs']['ratio']:.4f})")
    print(f"median DDP step: native {summary['step_ms']['native']:.3f} ms, shim {summary['step_ms']['shim']:.3f} ms "
          f"({summary['step_ms']['ratio']:.4f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rounds": rounds, "summary": summary, "size_mib": args.size_mib, "gpus": args.gpus}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
