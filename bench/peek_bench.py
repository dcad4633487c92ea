"""What cuda-ckpt peek costs, on a GPU (docs/peek.md): a PyTorch program under the shim holds a 4 KiB tensor and a
bulk tensor, both named, and runs matmuls when asked; the real cuda-ckpt reads them from outside.

- latency: the whole `cuda-ckpt peek PID small -o FILE` command (a new process each time), by copy, each order;
- bulk: `peek PID big -o /dev/shm/...` by copy and by map, GB/s of the whole command;
- watch: the program's matmul steps in fixed windows, alone and with `peek --watch 0.1` reading the small tensor,
  the windows alternating so the machine's drift falls on both sides.

One JSON line per figure. Usage: python3 peek_bench.py --cuda-ckpt BUILD/bin/cuda-ckpt [--bulk-mib 1024]
[--window 5] [--windows 3] [--repeat 20]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

TARGET = r"""
import sys, torch, vmmckpt
small = torch.arange(1024, dtype=torch.float32, device="cuda")
big = torch.ones(int(sys.argv[1]) << 18, dtype=torch.float32, device="cuda")
vmmckpt.name(small, "small"); vmmckpt.name(big, "big")
a = torch.randn(4096, 4096, device="cuda"); b = torch.randn(4096, 4096, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
for line in sys.stdin:
    end = time.time() + float(line)
    steps = 0
    while time.time() < end:
        a.copy_(a @ b * 1e-3); steps += 1
        if steps % 16 == 0: torch.cuda.synchronize()
    torch.cuda.synchronize()
    print(steps, flush=True)
"""


def emit(**fields):
    print(json.dumps({"bench": "peek", **fields}), flush=True)


def timed(cmd):
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - t


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cuda-ckpt", required=True)
    p.add_argument("--bulk-mib", type=int, default=1024)
    p.add_argument("--window", type=float, default=5.0)
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args()
    tool = args.cuda_ckpt
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), "..", "python"))
    target = subprocess.Popen([tool, "run", "--", sys.executable, "-c", "import time\n" + TARGET, str(args.bulk_mib)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        if target.stdout.readline().strip() != "ready":
            sys.exit("the target did not start")
        pid = str(target.pid)
        with tempfile.TemporaryDirectory(dir="/dev/shm") as scratch:
            out = os.path.join(scratch, "bytes")
            for order in ("live", "ordered", "quiesce"):
                runs = sorted(timed([tool, "peek", pid, "small", "-o", out, "--" + order]) for _ in range(args.repeat))
                emit(figure="latency_4k", order=order, median_ms=round(statistics.median(runs) * 1e3, 2),
                     max_ms=round(runs[-1] * 1e3, 2), runs=len(runs))
            bulk = args.bulk_mib << 20
            for via in ("copy", "map"):
                runs = sorted(timed([tool, "peek", pid, "big", "-o", out, "--via", via, "--ordered"]) for _ in range(3))
                emit(figure="bulk", via=via, bytes=bulk, best_s=round(runs[0], 3), gbps=round(bulk / runs[0] / 1e9, 2))
                os.remove(out)

            def window(watch):
                watcher = None
                if watch:
                    watcher = subprocess.Popen([tool, "peek", pid, "small", "16", "--watch", "0.1", "-t", "f32"],
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                target.stdin.write(f"{args.window}\n")
                target.stdin.flush()
                steps = int(target.stdout.readline())
                if watcher:
                    watcher.terminate()
                    watcher.wait()
                return steps

            alone, watched = [], []
            for _ in range(args.windows):
                alone.append(window(False))
                watched.append(window(True))
            emit(figure="watch_0.1", steps_alone=alone, steps_watched=watched,
                 overhead_pct=round(100 * (1 - sum(watched) / sum(alone)), 2))
    finally:
        target.stdin.close()
        target.wait(timeout=60)


if __name__ == "__main__":
    main()
