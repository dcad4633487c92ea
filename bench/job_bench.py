#!/usr/bin/env python3
"""A whole multi-rank job checkpointed, side by side with one process's checkpoint and NVIDIA's path.

  job_bench.py --build DIR [--ranks 2] [--gib 16] [--out FILE.jsonl] [--criu CRIU]

Each rank of the job (torchrun, one rank per GPU, NCCL's defaults: NCCL_NVLS_ENABLE=0 only) fills --gib GiB of
GPU memory with random data and then all-reduces 64 MiB every 10 ms until told to stop; it then checks that its
data is what it wrote. In one run, one after the other on the same machine:
  job:     under the shim: `dump --job` (the cut, how long each rank was held), `suspend --job` / `resume --job`,
           then `dump --job --process` and `restore DIR` (whole job through CRIU);
  single:  one rank of the same size alone (torchrun --nproc-per-node 1) under the shim: `dump --process` and
           `restore DIR`, the one process the job's figures are compared with;
  nvidia:  the same job natively, NVIDIA's path: the driver's lock and checkpoint of each process
           (vmmckpt_bench_driver_ckpt, as cuda-checkpoint does it), `criu dump --tcp-established` of the tree,
           then `criu restore` and the driver's restore; where a step fails, what it said is recorded.
Every restored job must check its data. Prints a table; --out appends every figure as a JSON line.
As a worker (under torchrun, --worker DIR) it is one rank.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

GIB = 1 << 30


def worker(directory, gib):
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    generator = torch.Generator(device=device).manual_seed(1000 + rank)
    data = [torch.randn(GIB // 4, device=device, generator=generator) for _ in range(gib)]
    sums = [float(t.double().sum()) for t in data]
    buffer = torch.ones(64 << 18, device=device)
    dist.barrier()
    print(f"ready {rank} {os.getpid()}", flush=True)
    stop = os.path.join(directory, "stop")
    steps = 0
    while not os.path.exists(stop):
        dist.all_reduce(buffer)
        buffer.div_(dist.get_world_size())
        torch.cuda.synchronize()
        steps += 1
        time.sleep(0.01)
    good = all(float(t.double().sum()) == s for t, s in zip(data, sums)) and bool((buffer == 1).all())
    print(f"check {rank} {'ok' if good else 'bad'} {steps}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


class Job:
    """torchrun with `ranks` ranks of the worker, detached (its own session, output in a file), natively or under
    the shim."""

    def __init__(self, args, ranks, shim):
        self.dir = tempfile.mkdtemp(prefix="vmmckpt-job-bench-", dir="/dev/shm")
        self.log = os.path.join(self.dir, "log")
        self.ranks = ranks
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), os.path.abspath(__file__),
               "--worker", self.dir, "--gib", str(args.gib)]
        if shim:
            cmd = [args.cuda_ckpt, "run", "--"] + cmd
        env = dict(os.environ, NCCL_NVLS_ENABLE="0", PYTHONUNBUFFERED="1", UV_USE_IO_URING="0")
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        self.pid = self.proc.pid
        self.wait_for(lambda t: t.count("ready ") >= ranks, 300, "the ranks did not get ready")

    def text(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def wait_for(self, done, seconds, what):
        until = time.time() + seconds
        while not done(self.text()):
            if time.time() > until:
                raise RuntimeError(f"{what} within {seconds} s: {self.text()[-1500:]}")
            time.sleep(0.1)

    def gone(self):
        try:
            os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            pass
        try:
            os.kill(self.pid, 0)
            return False
        except ProcessLookupError:
            return True

    def wait_gone(self, seconds=60):
        until = time.time() + seconds
        while not self.gone():
            if time.time() > until:
                raise RuntimeError(f"the job (process {self.pid}) did not end")
            time.sleep(0.05)

    def rank_pids(self):
        return [int(line.split()[2]) for line in self.text().splitlines() if line.startswith("ready ")]

    def check(self):
        """Stops the job; True when every rank found its data as it wrote it."""
        open(os.path.join(self.dir, "stop"), "w").close()
        self.wait_for(lambda t: t.count("check ") >= self.ranks, 300, "the ranks did not check")
        return self.text().count(" ok ") >= self.ranks

    def close(self):
        subprocess.run(["pkill", "-KILL", "-s", str(self.pid)], capture_output=True)
        self.gone()
        shutil.rmtree(self.dir, ignore_errors=True)


def tool(args, *words, timeout=900):
    start = time.monotonic()
    r = subprocess.run([args.cuda_ckpt, *words, "--json"], capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, VMMCKPT_CRIU=args.criu))
    wall = time.monotonic() - start
    if r.returncode != 0:
        raise RuntimeError(f"cuda-ckpt {' '.join(words)}: {r.stdout.strip() or r.stderr.strip()}")
    return json.loads(r.stdout), wall


def job_part(args, record):
    job = Job(args, args.ranks, shim=True)
    try:
        image = os.path.join(job.dir, "dump")
        d, wall = tool(args, "dump", "--job", str(job.pid), "-o", image)
        record(part="job", step="dump --job", seconds=wall, cut_ms=d["cut_seconds"] * 1000, held_ms=d["held_ms"],
               gib=d["bytes"] / GIB, ranks_held_ms=[r["hold_ms"] for r in d["ranks"]])
        shutil.rmtree(image, ignore_errors=True)
        s, wall = tool(args, "suspend", "--job", str(job.pid))
        record(part="job", step="suspend --job", seconds=wall, cut_ms=s["cut_seconds"] * 1000,
               freed_gib=s["freed_bytes"] / GIB)
        r, wall = tool(args, "resume", "--job", str(job.pid))
        record(part="job", step="resume --job", seconds=wall)
        whole = os.path.join(job.dir, "whole")
        d, wall = tool(args, "dump", "--job", str(job.pid), "--process", "-o", whole)
        record(part="job", step="dump --job --process", seconds=wall, stopped_s=d["stopped_seconds"])
        job.wait_gone()
        r, wall = tool(args, "restore", whole)
        record(part="job", step="restore DIR", seconds=wall)
        record(part="job", step="check", ok=job.check())
    finally:
        job.close()


def single_part(args, record):
    job = Job(args, 1, shim=True)
    try:
        whole = os.path.join(job.dir, "whole")
        # torchrun's store is a TCP connection within the process: CRIU keeps it only when told to.
        d, wall = tool(args, "dump", str(job.pid), "--process", "-o", whole, "--criu-arg=--tcp-established")
        record(part="single", step="dump --process", seconds=wall, stopped_s=d["stopped_seconds"])
        job.wait_gone()
        r, wall = tool(args, "restore", whole, "--criu-arg=--tcp-established")
        record(part="single", step="restore DIR", seconds=wall)
        record(part="single", step="check", ok=job.check())
    finally:
        job.close()


def run_step(record, step, cmd, timeout=900):
    """One step of NVIDIA's path; records its time, or what it said when it failed. True when it succeeded."""
    start = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    wall = time.monotonic() - start
    if r.returncode != 0:
        record(part="nvidia", step=step, seconds=wall, failed=(r.stderr.strip() or r.stdout.strip())[-600:])
        return False
    record(part="nvidia", step=step, seconds=wall)
    return True


def nvidia_part(args, record):
    job = Job(args, args.ranks, shim=False)
    driver = os.path.join(args.build, "bin", "vmmckpt_bench_driver_ckpt")
    try:
        image = os.path.join(job.dir, "criu")
        os.makedirs(image)
        # Every process of the tree that initialized the driver (the ranks, torchrun's own Python), one after the
        # other, as cuda-checkpoint takes them.
        tree = subprocess.run(["pgrep", "-s", str(job.pid)], capture_output=True, text=True).stdout.split()
        cuda = [int(p) for p in tree if any("libcuda" in l for l in open(f"/proc/{p}/maps", errors="replace"))]
        start = time.monotonic()
        for pid in cuda:
            if not run_step(record, f"driver lock and checkpoint of {pid}", [driver, str(pid), "checkpoint"]):
                return
        if not run_step(record, "criu dump --tcp-established",
                        [args.criu, "dump", "-t", str(job.pid), "-D", image, "--shell-job", "--tcp-established"]):
            return
        record(part="nvidia", step="checkpoint (all)", seconds=time.monotonic() - start)
        job.wait_gone()
        start = time.monotonic()
        if not run_step(record, "criu restore --tcp-established",
                        [args.criu, "restore", "-D", image, "-d", "--shell-job", "--tcp-established"]):
            return
        for pid in cuda:
            if not run_step(record, f"driver restore of {pid}", [driver, str(pid), "restore"]):
                return
        record(part="nvidia", step="restore (all)", seconds=time.monotonic() - start)
        record(part="nvidia", step="check", ok=job.check())
    finally:
        job.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker")
    ap.add_argument("--build")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--gib", type=int, default=16)
    ap.add_argument("--out")
    ap.add_argument("--criu", default=os.environ.get("VMMCKPT_CRIU", "criu"))
    ap.add_argument("--parts", default="job,single,nvidia")
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.gib)
    args.cuda_ckpt = os.path.join(args.build, "bin", "cuda-ckpt")
    rows = []

    def record(**row):
        row.update(ranks=args.ranks if row["part"] != "single" else 1, gib_per_rank=args.gib)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")

    parts = {"job": job_part, "single": single_part, "nvidia": nvidia_part}
    for name in args.parts.split(","):
        try:
            parts[name](args, record)
        except Exception as e:  # a part that fails is recorded; the others still run
            record(part=name, step="error", failed=str(e)[-800:])
    return 0 if all(r.get("ok", True) and "failed" not in r for r in rows if r["part"] != "nvidia") else 1


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    sys.exit(main())
