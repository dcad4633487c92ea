#!/usr/bin/env python3
"""Runs vmmckpt's benchmarks and writes every figure as a JSON line to OUT/results.jsonl,
the machine's description to OUT/env.json, and each command's output to OUT/logs/. bench/report.py
turns them into docs/benchmarks.md; scripts/bench.sh runs both.

usage: run_bench.py --build DIR --out DIR [--sizes 1,4,16,32] [--skip PARTS] [--quick] [--append]
                    [--disk-dir PATH] [--tmpfs-dir PATH] [--huge-tmpfs-dir PATH] [--python PY]
                    [--dump-args ARGS]
       run_bench.py --cpu-only --build DIR --out DIR [--cpu-sizes-mib 256,512]

Parts (GPU): limits, dump, driver, process (whole-process with CRIU, as root), incremental (dump --parent),
prealloc (JAX with its default preallocation: bench/prealloc_bench.py),
alloc, launch, torch, frag, peer (a copy of 1 GiB between two GPUs; skipped on one). Images go to a tmpfs, to disk, and (as
root, or where one is mounted already) to a tmpfs with huge pages that the run mounts for itself. With --cpu-only, on the emulated
driver (DIR/lib/emu): allocator, limits (no GPU), dump (tmpfs only).
A part that fails records {"bench": ..., "error": ...} and the run goes on with the next one; the
exit status is 1 when anything failed or was skipped. Every command has a timeout, and no program
started here outlives the run.
"""
import argparse
import ctypes
import datetime
import glob
import json
import os
import platform
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time

GPU_PARTS = ["limits", "dump", "many", "driver", "process", "incremental", "prealloc", "alloc", "launch", "torch", "vmm",
             "frag", "peer"]
CPU_PARTS = ["allocator", "limits", "dump", "many"]
GIB = 1 << 30
MIB = 1 << 20
RESTORE_LOG = re.compile(r"restore: (\d+) allocations, (\d+) bytes from .* in ([0-9.]+) s")


class BenchError(Exception):
    pass


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def json_lines(text):
    """The JSON objects of a program's output, one per line; other lines are ignored."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def touch_memory(directory, total):
    """Writes `total` bytes of files into the tmpfs `directory` (16 at a time) and removes them. On a virtual
    machine the first use of each page of its memory costs the host's work as well (measured on the GPU
    machines: a full dump of 32 GiB into pages never used before took 2.5 times as long as into pages used and
    freed): a measurement that must not depend on what ran before it starts from used pages."""
    if total < 128 * MIB:  # too little room to matter (16 writers of 8 MiB)
        return
    threads = 16
    paths = [os.path.join(directory, f".warm-{k}") for k in range(threads)]

    piece = b"\x5a" * (8 * MIB)  # written, not fallocated: tmpfs leaves fallocated pages untouched until used

    def fill(path):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                for _ in range(total // threads // len(piece)):
                    os.write(fd, piece)
            finally:
                os.close(fd)
        except OSError as e:  # a warm-up that falls short is no error: the part itself checks for room
            log(f"  touching memory: {e}")

    workers = [threading.Thread(target=fill, args=(path,)) for path in paths]
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        for path in paths:
            if os.path.exists(path):
                os.remove(path)


def dir_bytes(path):
    """Bytes of the files under path."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


# Every process started here runs in a session of its own (so that a timeout can kill it with what
# it started); those still running when the run ends, however it ends, are killed.
LIVE = set()


def start(cmd, **kwargs):
    proc = subprocess.Popen(cmd, start_new_session=True, **kwargs)
    LIVE.add(proc)
    return proc


def kill_group(proc):
    """Kills a process started by start() and everything it started."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    LIVE.discard(proc)


def remove_images(directory, size_gib):
    """This size's images in directory (a dump's, a suspend's, a series' directory), with what a killed dump
    leaves (IMAGE.partial-*)."""
    for kind in ("image", "suspend", "series"):
        base = os.path.join(directory, f"{kind}-{size_gib}")
        for name in [base] + glob.glob(glob.escape(base) + ".partial-*"):
            shutil.rmtree(name, ignore_errors=True)


def kill_all():
    for proc in list(LIVE):
        if proc.poll() is None:
            log(f"killing {proc.pid} ({os.path.basename(str(proc.args[0]))}), still running at the end")
        kill_group(proc)


class FillProgram:
    """A fill program (bench/fill.cu or emu_fill.cpp) running in the background: waits for "ready",
    sends "check" and reads the verdict, and is ended (stdin closed, then killed) on leaving."""

    def __init__(self, bench, cmd, name, env=None):
        self.bench = bench
        self.lines = queue.Queue()
        self.stderr_path = bench.log_path(name + ".stderr")
        log(f"  start: {' '.join(cmd)}")
        with open(self.stderr_path, "w") as err:
            self.proc = start(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                              env=env or bench.env)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    @property
    def pid(self):
        return self.proc.pid

    def wait_line(self, prefix, timeout):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"no '{prefix}' from the fill program within {timeout:.0f} s{self._tail()}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait()
                raise BenchError(f"the fill program exited ({self.proc.returncode}) before '{prefix}'{self._tail()}")
            if line.startswith(prefix):
                return line

    def check(self, timeout):
        """Sends "check"; raises unless the program answers "check ok"."""
        try:
            self.proc.stdin.write("check\n")
            self.proc.stdin.flush()
        except OSError as e:
            raise BenchError(f"cannot talk to the fill program: {e}")
        line = self.wait_line("check", timeout)
        if line != "check ok":
            raise BenchError(f"the fill program's pattern is damaged: {line}")

    def _tail(self):
        try:
            with open(self.stderr_path, errors="replace") as f:
                text = f.read()[-1500:].strip()
        except OSError:
            text = ""
        return f"; its stderr ends: {text}" if text else ""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        # After a failure, waiting for the program to end by itself could take long: kill it at once.
        if exc_type is None and self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                log(f"  the fill program {self.pid} did not end when its stdin closed: killing it")
        kill_group(self.proc)  # also whatever it left behind
        return False


class Bench:
    def __init__(self, args):
        self.args = args
        self.build = os.path.abspath(args.build)
        self.bin = os.path.join(self.build, "bin")
        self.cuda_ckpt = os.path.join(self.bin, "cuda-ckpt")
        self.out = os.path.abspath(args.out)
        self.logs = os.path.join(self.out, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.results = open(os.path.join(self.out, "results.jsonl"), "a" if args.append else "w")
        self.log_seq = len(os.listdir(self.logs)) if args.append else 0  # appended runs keep earlier logs
        self.failures = 0
        self.mounted = []  # what this run mounted, unmounted at its end
        self.env = dict(os.environ, NCCL_NVLS_ENABLE="0")
        if args.cpu_only:
            emu = os.path.join(self.build, "lib", "emu")
            self.env["LD_LIBRARY_PATH"] = emu + (":" + self.env["LD_LIBRARY_PATH"] if self.env.get("LD_LIBRARY_PATH") else "")
            self.fill = os.path.join(self.bin, "vmmckpt_bench_emu_fill")
            self.sizes_gib = [m / 1024 for m in args.cpu_sizes_mib]
            self.places = [("tmpfs", args.tmpfs_dir)]
        else:
            self.fill = os.path.join(self.bin, "vmmckpt_bench_fill")
            self.sizes_gib = args.sizes
            huge = self.huge_tmpfs(args.huge_tmpfs_dir) if args.huge_tmpfs_dir else None
            self.places = [("tmpfs", args.tmpfs_dir)] + ([("tmpfs-huge", huge)] if huge else []) + \
                [("disk", args.disk_dir)]
        self.gpu_total = self._gpu_total_bytes()
        self.process_modes = [m for m in args.process_modes.split(",") if m]
        if any(m not in ("shim", "pre-copy", "native") for m in self.process_modes):
            raise SystemExit(f"--process-modes takes shim, pre-copy and native, not {args.process_modes}")

    def huge_tmpfs(self, path):
        """A tmpfs with transparent huge pages for images, as a user may mount one for the image directory
        (`mount -t tmpfs -o huge=always`): the one mounted at path, or one mounted there for this run."""
        try:
            with open("/proc/mounts") as f:
                mounts = [line.split() for line in f]
        except OSError:
            mounts = []
        for m in mounts:
            if len(m) >= 4 and m[1] == path:
                if m[2] == "tmpfs" and ("huge=always" in m[3] or "huge=within_size" in m[3]):
                    return path
                self.record({"bench": "dump", "where": "tmpfs-huge", "error": f"skipped: {path} is mounted, but not "
                             "as a tmpfs with huge pages"})
                return None
        if os.geteuid() != 0:
            self.record({"bench": "dump", "where": "tmpfs-huge",
                         "error": "skipped: mounting a tmpfs with huge pages needs root"})
            return None
        os.makedirs(path, exist_ok=True)
        size_kib = int(mem_available() * 0.6) // 1024
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"huge=always,size={size_kib}k,mode=0700",
                               "vmmckpt-bench-huge", path], capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            self.error("dump", f"mounting a tmpfs with huge pages failed: {proc.stderr.strip()[:300]}",
                       where="tmpfs-huge")
            return None
        self.mounted.append(path)
        return path

    # ---- recording and running ----

    def record(self, obj):
        self.results.write(json.dumps(obj) + "\n")
        self.results.flush()

    def error(self, bench, message, **tags):
        log(f"  FAILED {bench} {tags}: {message}")
        self.failures += 1
        self.record(dict({"bench": bench}, **tags, error=str(message)[:2000]))

    def log_path(self, name):
        self.log_seq += 1
        return os.path.join(self.logs, f"{self.log_seq:03d}-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}")

    def run(self, cmd, timeout, name, env=None, check=True):
        """Runs cmd to completion (killed with its children after timeout s); returns (proc, seconds)."""
        log(f"  run: {' '.join(shlex.quote(c) for c in cmd)}")
        t0 = time.monotonic()
        proc = start(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                     env=env or self.env)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            stdout, stderr = proc.communicate()
            self._save_log(name, cmd, "timeout", stdout, stderr)
            raise BenchError(f"{name} timed out after {timeout:.0f} s")
        except BaseException:  # stopped from outside: the command goes first, before any cleanup
            kill_group(proc)
            raise
        seconds = time.monotonic() - t0
        LIVE.discard(proc)
        proc.stdout_text, proc.stderr_text = stdout, stderr
        self._save_log(name, cmd, proc.returncode, stdout, stderr)
        if check and proc.returncode != 0:
            raise BenchError(f"{name} exited {proc.returncode}: {stderr.strip()[-1500:]}")
        return proc, seconds

    def _save_log(self, name, cmd, rc, stdout, stderr):
        with open(self.log_path(name + ".log"), "w") as f:
            f.write(f"$ {' '.join(shlex.quote(c) for c in cmd)}\nexit: {rc}\n--- stdout\n{stdout[-100000:]}\n"
                    f"--- stderr\n{stderr[-100000:]}\n")

    def _gpu_total_bytes(self):
        if self.args.cpu_only or not shutil.which("nvidia-smi"):
            return None
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits",
                                  "-i", "0"], capture_output=True, text=True, timeout=60).stdout
            return int(float(out.split()[0])) * MIB
        except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
            return None

    def fits_gpu(self, size):
        # The context and the program's own buffers need some room besides.
        return self.gpu_total is None or size + 2 * GIB <= self.gpu_total

    # ---- environment ----

    def write_env(self):
        env = {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "host": platform.node(),
            "kernel": platform.release(),
            "cpus": os.cpu_count(),
            "mem_total_gib": None,
            "commit": self._commit(),
            "mode": "cpu-only (emulated driver)" if self.args.cpu_only else "gpu",
            "args": {k: sorted(v) if isinstance(v, set) else v for k, v in vars(self.args).items()},
        }
        try:
            with open("/proc/meminfo") as f:
                env["mem_total_gib"] = round(int(f.readline().split()[1]) / (1 << 20), 1)
        except (OSError, ValueError, IndexError):
            pass
        if not self.args.cpu_only and shutil.which("nvidia-smi"):
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                      "--format=csv,noheader"], capture_output=True, text=True, timeout=60).stdout
                gpus = [line.split(", ") for line in out.strip().splitlines() if line.strip()]
                if gpus:
                    env["device"], env["driver"] = gpus[0][0], gpus[0][1]
                    env["gpu_memory"] = gpus[0][2] if len(gpus[0]) > 2 else None
                    env["gpus"] = len(gpus)
            except (OSError, subprocess.TimeoutExpired):
                pass
        env.setdefault("device", "emulated CUDA driver" if self.args.cpu_only else "unknown")
        env.setdefault("driver", "emulated" if self.args.cpu_only else "unknown")
        try:
            env["cuda_ckpt"] = subprocess.run([self.cuda_ckpt, "--version"], capture_output=True, text=True,
                                              timeout=30).stdout.strip()
        except OSError:
            pass
        with open(os.path.join(self.out, "env.json"), "w") as f:
            json.dump(env, f, indent=2)
        log(f"device: {env['device']}, driver {env['driver']}, commit {env['commit']}, {env['cpus']} CPUs")

    @staticmethod
    def _commit():
        # A copy of the tree (a GPU machine's) may carry a stale .git: an id given explicitly wins.
        if os.environ.get("VMMCKPT_COMMIT"):
            return os.environ["VMMCKPT_COMMIT"]
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        try:
            commit = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True, timeout=30)
            if commit.returncode == 0 and commit.stdout.strip():
                dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"],
                                       capture_output=True, text=True, timeout=30).stdout.strip()
                return commit.stdout.strip() + ("-dirty" if dirty else "")
        except (OSError, subprocess.TimeoutExpired):
            pass
        return os.environ.get("VMMCKPT_COMMIT", "unknown")

    # ---- parts ----

    def part_allocator(self):
        """The pool's placement alone (no driver): its own table, 'size pair (ns)'."""
        proc, _ = self.run([os.path.join(self.bin, "vmmckpt_bench_allocator")], 300, "allocator")
        for line in proc.stdout_text.splitlines():
            fields = line.split()
            if len(fields) == 2 and fields[0].isdigit():
                self.record({"bench": "allocator", "size": int(fields[0]), "pair_ns": float(fields[1])})
            elif line.startswith("{"):  # the fragmenting pattern on the pool logic alone
                self.record(json.loads(line))

    def part_limits(self):
        limits = os.path.join(self.bin, "vmmckpt_bench_limits")
        quick = self.args.quick
        if self.args.cpu_only:
            runs = [("tmpfs", [limits, "--dir", self.args.tmpfs_dir, "--bytes", str(GIB), "--threads", "1,2",
                               "--no-gpu"], 600)]
        else:
            tmpfs_bytes = 2 * GIB if quick else 8 * GIB
            threads = "1,8" if quick else "1,4,8,16"
            # Everything on the usual tmpfs; writing and reading alone on the other places.
            runs = [(where, [limits, "--dir", directory, "--bytes", str(tmpfs_bytes), "--threads", threads]
                     + ([] if where == "tmpfs" else ["--only", "write_files", "--no-gpu"]), 900)
                    for where, directory in self.places if where.startswith("tmpfs")]
            runs.append(("disk", [limits, "--dir", self.args.disk_dir, "--bytes", str(4 * GIB), "--threads", "1,8",
                                  "--only", "write_files", "--no-gpu"], 900))
        for where, cmd, timeout in runs:
            try:
                os.makedirs(cmd[cmd.index("--dir") + 1], exist_ok=True)
                proc, _ = self.run(cmd, timeout, "limits-" + where)
                for r in json_lines(proc.stdout_text):
                    self.record(dict(r, where=where))
            except (BenchError, OSError) as e:
                self.error("limits", e, where=where)
        if self.args.cpu_only:
            return
        # The PCIe limit at each size a dump moves (pinned copies of the whole size).
        for s in self.sizes_gib:
            size = int(s * GIB)
            if not self.fits_gpu(size) or size * 1.3 > mem_available():
                self.error("limits", "skipped: the size does not fit in GPU or host memory", name="pcie", size_gib=s)
                continue
            try:
                proc, _ = self.run([limits, "--bytes", str(size), "--threads", "1", "--only", "pcie"],
                                   300 + 10 * s, f"limits-pcie-{s}")
                for r in json_lines(proc.stdout_text):
                    self.record(dict(r, size_gib=s))
            except BenchError as e:
                self.error("limits", e, name="pcie", size_gib=s)

    def fill_cmd(self, size_gib, pointers, shim):
        # Pieces of 1 GiB on a GPU; 64 MiB on the emulated driver, so that its small images still hold several.
        piece_mib = 64 if self.args.cpu_only else 1024
        cmd = [self.fill, "--mib", str(int(round(size_gib * 1024))), "--piece-mib", str(piece_mib),
               "--pointers", pointers]
        return [self.cuda_ckpt, "run", "--"] + cmd if shim else cmd

    @staticmethod
    def ready_timeout(s):
        return 120 + 10 * s

    def part_dump(self):
        for s in self.sizes_gib:
            for where, directory in self.places:
                tags = {"mode": "shim", "where": where, "size_gib": s}
                try:
                    os.makedirs(directory, exist_ok=True)
                    self.dump_one(s, where, directory, tags)
                except (BenchError, OSError) as e:
                    self.error("dump", e, **tags)
                finally:
                    remove_images(directory, s)

    def dump_one(self, s, where, directory, tags):
        """One size in one place: dump a live program (which must not notice), restore the image into a
        new process, then suspend and resume a live program; never more than one image at a time."""
        size = int(s * GIB)
        if not self.fits_gpu(size):
            raise BenchError("skipped: the size does not fit in GPU memory")
        if free_bytes(directory) < size * 1.05 + 256 * MIB:
            raise BenchError(f"skipped: {directory} has {free_bytes(directory) / GIB:.1f} GiB free")
        pointers = os.path.join(self.out, f"pointers-{s}.txt")
        image = os.path.join(directory, f"image-{s}")
        suspended = os.path.join(directory, f"suspend-{s}")
        remove_images(directory, s)
        step_timeout = 180 + 20 * s
        check_timeout = 60 + 5 * s

        log(f"dump: {s} GiB into {where}")
        if where.startswith("tmpfs"):  # the image and the suspended one, one at a time, go into used pages
            touch_memory(directory, min(int(1.1 * size), free_bytes(directory) - GIB))
        with FillProgram(self, self.fill_cmd(s, pointers, shim=True), f"fill-{s}-{where}") as prog:
            prog.wait_line("ready", self.ready_timeout(s))
            proc, wall = self.run([self.cuda_ckpt, "dump", str(prog.pid), "-o", image, "--json"]
                                  + shlex.split(self.args.dump_args), step_timeout, f"dump-{s}-{where}")
            self.record_tool("dump", proc, tags, wall, dump_args=self.args.dump_args)
            prog.check(check_timeout)

        dropped = self.drop_caches() if where == "disk" else None
        proc, wall = self.run([self.cuda_ckpt, "restore", image, "--", self.fill, "--verify-pointers", pointers],
                              step_timeout, f"restore-{s}-{where}", env=dict(self.env, VMMCKPT_LOG_LEVEL="info"),
                              check=False)
        if proc.returncode != 0 or "check ok" not in proc.stdout_text:
            raise BenchError(f"restore: exit {proc.returncode}, {proc.stdout_text.strip()[-300:]} "
                             f"{proc.stderr_text.strip()[-1500:]}")
        m = RESTORE_LOG.search(proc.stderr_text)
        if not m:
            raise BenchError("restore: the shim's 'restore: N allocations, B bytes ... in T s' line is missing")
        restored, seconds = int(m.group(2)), float(m.group(3))
        self.record(dict(tags, bench="restore", allocations=int(m.group(1)), bytes=restored, seconds=seconds,
                         gb_per_s=restored / seconds / 1e9 if seconds > 0 else None, wall_s=wall,
                         cache_dropped=dropped))
        shutil.rmtree(image, ignore_errors=True)

        log(f"suspend/resume: {s} GiB, image in {where}")
        with FillProgram(self, self.fill_cmd(s, pointers, shim=True), f"fill-suspend-{s}-{where}") as prog:
            prog.wait_line("ready", self.ready_timeout(s))
            if where.startswith("tmpfs"):
                self.full_series(prog, s, directory, tags, step_timeout)
            proc, wall = self.run([self.cuda_ckpt, "suspend", str(prog.pid), "-o", suspended, "--json"],
                                  step_timeout, f"suspend-{s}-{where}")
            self.record_tool("suspend", proc, tags, wall)
            proc, wall = self.run([self.cuda_ckpt, "resume", str(prog.pid), "--json"], step_timeout,
                                  f"resume-{s}-{where}")
            self.record_tool("resume", proc, tags, wall)
            prog.check(check_timeout)

    def full_series(self, prog, s, directory, tags, timeout):
        """Two full dumps by one tool (`dump --every --full-every 0`): the second is a full dump without the
        set-up each command makes (its CUDA context, pinned staging and checksum kernel), as periodic
        checkpoints of a long job take them. The first image is removed once printed: one image at a time."""
        series_dir = os.path.join(directory, f"series-{s}")  # none yet: dump_one removed this size's images
        every = max(5.0, 0.35 * s)
        cmd = [self.cuda_ckpt, "dump", str(prog.pid), "-o", series_dir, "--every", str(every), "--count", "2",
               "--full-every", "0", "--json"]

        def on_image(k, r, line):
            if r.get("parent") is not None:
                raise BenchError(f"series image {k} is incremental, not full: {line[:300]}")
            if k == 0:
                shutil.rmtree(os.path.join(series_dir, "0000"), ignore_errors=True)
                return
            for key in ("image", "pid"):
                r.pop(key, None)
            self.record(dict(r, bench="dump_series", **tags))

        try:
            self.run_series(cmd, 2, 2 * every + timeout, on_image)
        except (BenchError, ValueError, subprocess.TimeoutExpired) as e:
            self.error("dump_series", e, **tags)
        finally:
            shutil.rmtree(series_dir, ignore_errors=True)

    def run_series(self, cmd, images, timeout, on_image):
        """Runs a `cuda-ckpt dump --every` series, handing each image's JSON line to on_image(k, parsed, line)
        as it is printed. A series that hangs is killed after timeout seconds (it ends the step, not the
        bench); one that prints fewer lines or exits with an error raises BenchError."""
        log("  run: " + " ".join(cmd))
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env)
        watchdog = threading.Timer(timeout, proc.kill)
        watchdog.start()
        try:
            for k in range(images):
                line = proc.stdout.readline()
                if not line:
                    raise BenchError(f"dump --every printed {k} of {images} images: {proc.stderr.read()[-800:]}")
                on_image(k, json.loads(line), line)
            if proc.wait(60) != 0:
                raise BenchError(f"dump --every exited {proc.returncode}: {proc.stderr.read()[-800:]}")
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def part_many(self):
        """Many small allocations against one allocation of the same bytes: the program's hold during a dump
        and a suspend, resume, restore into a new process, and verify; then verify of a million allocations."""
        directory = self.args.tmpfs_dir
        os.makedirs(directory, exist_ok=True)
        mib = 49  # 200 704 allocations of 256 bytes
        for shape, piece in (("one", mib * MIB), ("small", 256)):
            try:
                self.many_one(directory, mib, shape, piece)
            except (BenchError, OSError) as e:
                self.error("many", e, shape=shape)
            finally:
                for name in glob.glob(os.path.join(directory, "many-*")):
                    shutil.rmtree(name, ignore_errors=True)
        try:
            self.many_verify(directory, 245)  # 1 003 520 allocations of 256 bytes
        except (BenchError, OSError) as e:
            self.error("many", e, shape="verify")
        finally:
            for name in glob.glob(os.path.join(directory, "many-*")):
                shutil.rmtree(name, ignore_errors=True)

    def many_fill(self, mib, piece, pointers):
        return [self.cuda_ckpt, "run", "--", self.fill, "--mib", str(mib), "--piece-bytes", str(piece),
                "--pointers", pointers]

    def many_one(self, directory, mib, shape, piece):
        pointers = os.path.join(self.out, f"pointers-many-{shape}.txt")
        image = os.path.join(directory, f"many-{shape}")
        suspended = os.path.join(directory, f"many-{shape}-suspend")
        tags = {"shape": shape, "bytes_live": mib * MIB}
        log(f"many: {(mib * MIB) // piece} allocations of {piece} bytes")
        with FillProgram(self, self.many_fill(mib, piece, pointers), f"fill-many-{shape}") as prog:
            prog.wait_line("ready", 300)
            proc, wall = self.run([self.cuda_ckpt, "dump", str(prog.pid), "-o", image, "--json"], 600,
                                  f"many-dump-{shape}")
            self.record_tool("many_dump", proc, tags, wall)
            prog.check(300)
            proc, wall = self.run([self.cuda_ckpt, "suspend", str(prog.pid), "-o", suspended, "--json"], 600,
                                  f"many-suspend-{shape}")
            self.record_tool("many_suspend", proc, tags, wall)
            proc, wall = self.run([self.cuda_ckpt, "resume", str(prog.pid), "--json"], 600, f"many-resume-{shape}")
            self.record_tool("many_resume", proc, tags, wall)
            prog.check(300)
        proc, wall = self.run([self.cuda_ckpt, "verify", image], 600, f"many-verify-{shape}")
        self.record(dict(tags, bench="many_verify", seconds=wall))
        proc, wall = self.run([self.cuda_ckpt, "restore", "--no-verify", image, "--", self.fill, "--verify-pointers",
                               pointers], 600, f"many-restore-{shape}", env=dict(self.env, VMMCKPT_LOG_LEVEL="info"),
                              check=False)
        m = RESTORE_LOG.search(proc.stderr_text)
        if proc.returncode != 0 or not m:
            raise BenchError(f"restore: exit {proc.returncode}, {proc.stderr_text.strip()[-800:]}")
        self.record(dict(tags, bench="many_restore", seconds=float(m.group(3)), wall_s=wall))

    def many_verify(self, directory, mib):
        pointers = os.path.join(self.out, "pointers-many-verify.txt")
        image = os.path.join(directory, "many-verify")
        log(f"many: verify of {(mib * MIB) // 256} allocations")
        with FillProgram(self, self.many_fill(mib, 256, pointers), "fill-many-verify") as prog:
            prog.wait_line("ready", 600)
            self.run([self.cuda_ckpt, "dump", str(prog.pid), "-o", image], 600, "many-verify-dump")
        proc, wall = self.run(["/usr/bin/time", "-f", "max_rss_kb %M", self.cuda_ckpt, "verify", image], 600,
                              "many-verify-verify")
        rss = re.search(r"max_rss_kb (\d+)", proc.stderr_text)
        self.record({"bench": "many_verify", "shape": "small", "allocations": (mib * MIB) // 256,
                     "bytes_live": mib * MIB, "seconds": wall, "max_rss_kb": int(rss.group(1)) if rss else None})

    def record_tool(self, bench, proc, tags, wall, **extra):
        """Records what `cuda-ckpt dump|suspend|resume --json` printed (all of it: its fields grow)."""
        try:
            r = json.loads(proc.stdout_text)
            seconds, size = float(r["seconds"]), int(r["bytes"])
        except (ValueError, KeyError, TypeError) as e:
            raise BenchError(f"{bench}: cannot read its JSON ({e}): {proc.stdout_text[-500:]}")
        r.pop("image", None)
        r.pop("pid", None)
        r.setdefault("gb_per_s", size / seconds / 1e9 if seconds > 0 else None)
        self.record(dict({"bench": bench, **tags}, **r, wall_s=wall, **extra))
        return r

    def drop_caches(self):
        """So that a restore from disk reads the disk, not the page cache; needs root."""
        try:
            subprocess.run(["sync"], timeout=300)
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            return True
        except (OSError, subprocess.TimeoutExpired) as e:
            log(f"  cannot drop the page cache ({e}): the disk restore may read cached pages")
            return False

    def part_driver(self):
        """The driver's own checkpoint and restore of the same program, run natively."""
        for s in self.sizes_gib:
            size = int(s * GIB)
            tags = {"mode": "native", "where": "host-memory", "size_gib": s}
            try:
                if not self.fits_gpu(size) or size * 1.2 > mem_available():
                    raise BenchError("skipped: the size does not fit in GPU or host memory")
                log(f"driver checkpoint: {s} GiB")
                pointers = os.path.join(self.out, f"pointers-driver-{s}.txt")
                with FillProgram(self, self.fill_cmd(s, pointers, shim=False), f"fill-driver-{s}") as prog:
                    prog.wait_line("ready", self.ready_timeout(s))
                    proc, wall = self.run([os.path.join(self.bin, "vmmckpt_bench_driver_ckpt"), str(prog.pid)],
                                          300 + 30 * s, f"driver-ckpt-{s}")
                    for r in json_lines(proc.stdout_text):
                        r.update(tags, bytes=size, wall_s=wall,
                                 checkpoint_gb_per_s=size / r["checkpoint_s"] / 1e9 if r["checkpoint_s"] > 0 else None,
                                 restore_gb_per_s=size / r["restore_s"] / 1e9 if r["restore_s"] > 0 else None)
                        self.record(r)
                    prog.check(60 + 5 * s)
            except BenchError as e:
                self.error("driver_ckpt", e, **tags)

    def part_process(self):
        """Whole-process checkpoint and restore with CRIU, of the largest size, images in the tmpfs: ours
        (dump --process, restore DIR) against the driver's path with the same CRIU (lock + checkpoint +
        criu dump; criu restore + restore + unlock), one after the other in this run."""
        s = max(self.sizes_gib)
        size = int(s * GIB)
        criu = os.environ.get("VMMCKPT_CRIU") or shutil.which("criu")
        directory = self.places[0][1]
        try:
            os.makedirs(directory, exist_ok=True)
            if os.geteuid() != 0 or not criu:
                raise BenchError("skipped: needs root and CRIU 4 (VMMCKPT_CRIU; scripts/provision-criu.sh)")
            if not self.fits_gpu(size) or size * 2.3 > mem_available() or free_bytes(directory) < size * 1.1:
                raise BenchError("skipped: the size does not fit in GPU memory, host memory or the tmpfs")
            # Processes CRIU restores detached are reparented here when their parent goes: reaped by gone().
            ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
            # Ours twice: the first also pays for the tmpfs's first pages and the first pinned staging. Then
            # ours with --pre-copy. The program rewrites 1 % of its memory every 10 ms (--churn) in every round:
            # what changes between a pre-copy and the stop.
            for mode in self.process_modes:
                tags = {"mode": mode, "where": self.places[0][0], "size_gib": s}
                try:
                    self.process_round(s, mode, criu, directory, tags)
                except (BenchError, OSError) as e:
                    self.error("process", e, **tags)
                finally:
                    shutil.rmtree(os.path.join(directory, "process-image"), ignore_errors=True)
        except BenchError as e:
            self.error("process", e, size_gib=s)

    def part_incremental(self):
        """Incremental dumps (--parent) of the largest size into the tmpfs, block checksums computed on the
        GPU: a full dump; four with 1 % of every piece changed (flipped, then flipped back, so that the
        chain's fifth image holds the original pattern again); one with nothing changed. Then the restore
        of the chain of 5 against that of the full image, each into a new process that checks every byte."""
        s = max(self.sizes_gib)
        size = int(s * GIB)
        directory = self.places[0][1]
        tags = {"mode": "shim", "where": self.places[0][0], "size_gib": s}
        images = [os.path.join(directory, f"incremental-{k}") for k in range(6)]
        series_dir = os.path.join(directory, "incremental-series")
        try:
            os.makedirs(directory, exist_ok=True)
            for image in images + [series_dir]:
                shutil.rmtree(image, ignore_errors=True)
            if not self.fits_gpu(size) or free_bytes(directory) < size * 1.2:
                raise BenchError("skipped: the size does not fit in GPU memory or the tmpfs")
            log(f"incremental: {s} GiB into {self.places[0][0]}")
            # The part keeps two chains (commands, then the series) of a little over the size each.
            touch_memory(directory, min(int(2.2 * size), free_bytes(directory) - GIB))
            pointers = os.path.join(self.out, "pointers-incremental.txt")
            step = 180 + 20 * s
            with FillProgram(self, self.fill_cmd(s, pointers, shim=True), "fill-incremental") as prog:
                prog.wait_line("ready", self.ready_timeout(s))
                for k, image in enumerate(images):
                    if 1 <= k <= 4:
                        prog.proc.stdin.write("flip 1\n")
                        prog.proc.stdin.flush()
                        prog.wait_line("flipped", 120)
                    cmd = [self.cuda_ckpt, "dump", str(prog.pid), "-o", image, "--json"]
                    if k:
                        cmd += ["--parent", images[k - 1]]
                    proc, wall = self.run(cmd, step, f"incremental-dump-{k}")
                    changed = "full" if k == 0 else "nothing" if k == 5 else "1 %"
                    self.record_tool("incremental_dump", proc, dict(tags, image=k, changed=changed), wall)
                self.incremental_series(prog, s, tags, series_dir)
                prog.check(60 + 5 * s)
            for k in (0, 4):
                proc, wall = self.run([self.cuda_ckpt, "restore", "--no-verify", images[k], "--", self.fill,
                                       "--verify-pointers", pointers], step, f"incremental-restore-{k}")
                self.record(dict(bench="incremental_restore", chain=k + 1, bytes=size, seconds=wall, **tags))
        except (BenchError, OSError) as e:
            self.error("incremental", e, **tags)
        finally:
            for image in images + [series_dir]:
                shutil.rmtree(image, ignore_errors=True)

    def incremental_series(self, prog, s, tags, series_dir):
        """The same six dumps by one tool, `cuda-ckpt dump --every` (its CUDA context, pinned staging and
        checksum kernel made once): image 0 full, 1 to 4 after 1 % changed, 5 with nothing changed. The
        change is made as soon as an image's line is printed, well before the next one is due."""
        every = max(5.0, 0.35 * s)
        images, changes = 6, 4
        cmd = [self.cuda_ckpt, "dump", str(prog.pid), "-o", series_dir, "--every", str(every),
               "--count", str(images), "--json"]

        def on_image(k, r, line):
            changed = "full" if k == 0 else "nothing" if k == images - 1 else "1 %"
            # "nothing": the fill program's pieces unchanged (its few small bookkeeping bytes may be written)
            if (k == 0) != (r.get("parent") is None) or (changed == "nothing") != (r.get("bytes", 0) < (1 << 20)):
                raise BenchError(f"series image {k}: not what the bench made ({changed}): {line[:300]}")
            self.record(dict(r, bench="incremental_series", image=k, changed=changed, **tags))
            if k < changes:
                prog.proc.stdin.write("flip 1\n")
                prog.proc.stdin.flush()
                prog.wait_line("flipped", 120)

        try:
            self.run_series(cmd, images, every * images + 300, on_image)
        except (BenchError, ValueError, subprocess.TimeoutExpired) as e:
            self.error("incremental_series", e, **tags)

    def process_round(self, s, mode, criu, directory, tags):
        size = int(s * GIB)
        work = os.path.join(self.out, f"process-{mode}")
        os.makedirs(work, exist_ok=True)
        stop, out, pointers = (os.path.join(work, n) for n in ("stop", "out.txt", "pointers.txt"))
        for f in (stop, out):
            if os.path.exists(f):
                os.remove(f)
        image = os.path.join(directory, "process-image")
        cmd = [self.fill, "--mib", str(int(s * 1024)), "--piece-mib", "1024", "--pointers", pointers, "--until", stop,
               "--churn", "1"]
        if mode in ("shim", "pre-copy"):
            cmd = [self.cuda_ckpt, "run", "--"] + cmd
        log(f"process: {s} GiB, {mode}")
        with open(out, "w") as f:
            prog = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=self.env)
        pid = prog.pid

        def text():
            with open(out) as f:
                return f.read()

        def gone():
            while True:
                try:
                    if os.waitpid(-1, os.WNOHANG)[0] == 0:
                        break
                except ChildProcessError:
                    break
            try:
                os.kill(pid, 0)
                return False
            except ProcessLookupError:
                return True

        def wait(predicate, timeout, what):
            deadline = time.monotonic() + timeout
            while not predicate():
                if time.monotonic() > deadline:
                    raise BenchError(f"{what} within {timeout:.0f} s; its output: {text()[-800:]}")
                time.sleep(0.05)

        try:
            wait(lambda: "ready" in text(), self.ready_timeout(s), "no 'ready' from the fill program")
            step = 120 + 20 * s
            driver = os.path.join(self.bin, "vmmckpt_bench_driver_ckpt")
            if mode in ("shim", "pre-copy"):
                dump = [self.cuda_ckpt, "dump", str(pid), "--process", "-o", image, "--json"]
                proc, ckpt_wall = self.run(dump + (["--pre-copy"] if mode == "pre-copy" else []), step,
                                           f"process-dump-{mode}")
                dumped = json.loads(proc.stdout_text)
                wait(gone, 30, "the process did not end after dump --process")
                proc, restore_wall = self.run([self.cuda_ckpt, "restore", image, "--json"], step, "process-restore")
                restored = json.loads(proc.stdout_text)
                extra = {"stopped_s": dumped["stopped_seconds"], "dump_phases": dumped["phases"],
                         "restore_phases": restored["phases"], "held_bytes": dumped.get("held_bytes"),
                         "pre_copy_bytes": dumped.get("pre_copy_bytes"),
                         "pre_copy_held_ms": dumped.get("pre_copy_held_ms")}
            else:
                os.makedirs(image)
                t0 = time.monotonic()
                proc, _ = self.run([driver, str(pid), "checkpoint"], step, "process-driver-checkpoint")
                checkpoint = json_lines(proc.stdout_text)[0]
                self.run([criu, "dump", "-t", str(pid), "-D", image, "--shell-job"], step, "process-criu-dump")
                ckpt_wall = time.monotonic() - t0
                wait(gone, 30, "the process did not end after criu dump")
                t0 = time.monotonic()
                self.run([criu, "restore", "-D", image, "-d", "--shell-job"], step, "process-criu-restore")
                proc, _ = self.run([driver, str(pid), "restore"], step, "process-driver-restore")
                restore = json_lines(proc.stdout_text)[0]
                restore_wall = time.monotonic() - t0
                extra = {"stopped_s": ckpt_wall, "driver_lock_checkpoint_s": checkpoint["lock_s"] + checkpoint["checkpoint_s"],
                         "driver_restore_unlock_s": restore["restore_s"] + restore["unlock_s"]}
            open(stop, "w").close()
            wait(lambda: "check " in text(), 120 + 5 * s, "no check from the restored program")
            if "check ok" not in text():
                raise BenchError(f"the restored program's memory is wrong: {text()[-300:]}")
            self.record(dict(bench="process", bytes=size, checkpoint_s=ckpt_wall, restore_s=restore_wall,
                             image_bytes=dir_bytes(image), **extra, **tags))
        finally:
            if not gone():
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass

    def pinned(self, cmd):
        """cmd on two fixed cores, where taskset exists: launch-bound timings then vary far less with
        where the scheduler puts the launching thread, in both modes alike."""
        cpus = os.cpu_count() or 1
        if cpus < 4 or not shutil.which("taskset"):
            return cmd
        return ["taskset", "-c", f"{cpus - 2},{cpus - 1}"] + cmd

    def both_modes(self, bench, cmd, timeout, rounds, pin=False, env=None):
        """Runs cmd natively and under the shim (cuda-ckpt run sets LD_PRELOAD), alternating, `rounds`
        times each, so that a drift of the machine does not favour one mode. `env` adds variables."""
        for rnd in range(1, rounds + 1):
            for mode in ("native", "shim"):
                tags = {"mode": mode, "round": rnd}
                try:
                    full = [self.cuda_ckpt, "run", "--"] + cmd if mode == "shim" else cmd
                    if pin:
                        full = self.pinned(full)
                        tags["pinned"] = full[0] == "taskset"
                    proc, wall = self.run(full, timeout, f"{bench}-{mode}-{rnd}",
                                          env=dict(self.env, **env) if env else None)
                    found = json_lines(proc.stdout_text)
                    if not found:
                        raise BenchError("no result line in its output")
                    for r in found:
                        self.record(dict(r, wall_s=wall, **tags))
                except BenchError as e:
                    self.error(bench, e, **tags)

    def part_alloc(self):
        args = ["--scale", "0.1"] if self.args.quick else []
        self.both_modes("alloc", [os.path.join(self.bin, "vmmckpt_bench_alloc")] + args, 1800, 1)

    def part_launch(self):
        """End to end, many short batches per run (the best batch is the least disturbed one); then the
        shim's cost per launch within one process, where the machine's drift between runs cancels."""
        quick = self.args.quick
        args = ["--launches", "50000", "--reps", "2"] if quick else ["--launches", "200000", "--reps", "8"]
        self.both_modes("launch", [os.path.join(self.bin, "vmmckpt_bench_launch")] + args, 600,
                        1 if quick else 5, pin=True)
        args = ["--batches", "100"] if quick else []
        self.both_modes("launch_ab", [os.path.join(self.bin, "vmmckpt_bench_launch_ab")] + args, 600,
                        1 if quick else 2, pin=True)

    def part_frag(self):
        args = ["--live-gib", "2", "--steps", "5000"] if self.args.quick else []
        self.both_modes("frag", [os.path.join(self.bin, "vmmckpt_bench_frag")] + args, 1200, 1)

    def part_torch(self):
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_step.py")
        args = ["--warmup", "5", "--steps", "20"] if self.args.quick else ["--steps", "200"]
        self.both_modes("torch", [self.args.python, script] + args, 600, 1 if self.args.quick else 3, pin=True)

    def part_vmm(self):
        """Program-made VMM memory: cuMemCreate + cuMemMap + cuMemSetAccess per handle, and the PyTorch
        step of the torch part with expandable segments (which map VMM memory themselves)."""
        quick = self.args.quick
        # In-process A/B (the shim's entry points against the driver's own); the native run is the control.
        self.both_modes("vmm_calls", [os.path.join(self.bin, "vmmckpt_bench_vmm_calls")]
                        + (["--rounds", "10"] if quick else []), 600, 1 if quick else 3, pin=True)
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_step.py")
        args = (["--warmup", "5", "--steps", "20"] if quick else ["--steps", "200"]) + ["--bench-name", "torch_expandable"]
        self.both_modes("torch_expandable", [self.args.python, script] + args, 600, 1 if quick else 3, pin=True,
                        env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})

    def part_prealloc(self):
        """JAX with XLA's default preallocation (bench/prealloc_bench.py, JAX in --python): 1 GiB of arrays
        dumped, suspended and resumed in the tmpfs; 16 GiB dumped to the disk, beside `dd` of as many bytes; 32
        GiB dumped into the tmpfs (with --quick, the first only)."""
        probe = subprocess.run([self.args.python, "-c", "import jax"], capture_output=True, timeout=300)
        if probe.returncode != 0:
            self.error("prealloc", f"skipped: no JAX in {self.args.python}")
            return
        tmpfs = self.places[0][1]
        disk = next(where for name, where in self.places if name == "disk")
        for d in (tmpfs, disk):
            os.makedirs(d, exist_ok=True)
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prealloc_bench.py")
        cmd = [sys.executable, script, "--cuda-ckpt", f"vmmckpt={self.cuda_ckpt}", "--shm", tmpfs, "--disk", disk,
               "--python", self.args.python] + (["--case", "jax-1g-shm"] if self.args.quick else [])
        proc, _ = self.run(cmd, 1200, "prealloc", check=False)
        rows = json_lines(proc.stdout_text)
        for row in rows:
            if "error" in row or row.get("ok") is False:
                self.error("prealloc", row.get("error") or f"a check failed: {row}", case=row.get("case"))
            else:
                self.record(dict(row, bench="prealloc"))
        if proc.returncode != 0 and not rows:
            self.error("prealloc", f"bench/prealloc_bench.py exited with {proc.returncode}: {proc.stderr_text[-800:]}")

    def part_peer(self):
        """A copy of 1 GiB from GPU 0 to GPU 1 without and with peer access (bench/peer_copy.cpp), native and
        shim runs alternating. Needs two GPUs: on one, a row says it was skipped (not counted as a failure)."""
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
            gpus = sum(1 for line in out.splitlines() if line.startswith("GPU "))
        except (OSError, subprocess.TimeoutExpired):
            gpus = 0
        if gpus < 2:
            log(f"  peer: skipped: a copy between GPUs needs two, nvidia-smi lists {gpus}")
            self.record({"bench": "peer_copy", "error": f"skipped: a copy between GPUs needs two, this machine has {gpus}"})
            return
        args = ["--reps", "5"] if self.args.quick else ["--reps", "30"]
        self.both_modes("peer_copy", [os.path.join(self.bin, "vmmckpt_bench_peer_copy")] + args, 600,
                        1 if self.args.quick else 3)

    def main(self):
        try:
            return self._run_parts()
        finally:
            for path in self.mounted:
                subprocess.run(["umount", path], capture_output=True, timeout=120)

    def _run_parts(self):
        self.write_env()
        parts = CPU_PARTS if self.args.cpu_only else GPU_PARTS
        for part in parts:
            if part in self.args.skip:
                log(f"== {part}: skipped")
                continue
            log(f"== {part}")
            t0 = time.monotonic()
            try:
                getattr(self, "part_" + part)()
            except Exception as e:  # one part's surprise must not cost the others
                self.error(part, f"{type(e).__name__}: {e}")
            log(f"== {part}: {time.monotonic() - t0:.0f} s")
        self.results.close()
        log(f"results: {os.path.join(self.out, 'results.jsonl')}"
            + (f"; {self.failures} measurement(s) failed or were skipped" if self.failures else ""))
        return 1 if self.failures else 0


def number_list(text, kind=float):
    return [kind(x) for x in text.split(",") if x.strip()]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", required=True, help="build directory (bin/ and lib/ inside)")
    p.add_argument("--out", required=True, help="where results.jsonl, env.json and logs/ go")
    p.add_argument("--sizes", help="GiB of live allocations for dump/restore/driver (default 1,4,16,32)")
    p.add_argument("--cpu-sizes-mib", default="256,512", help="--cpu-only: MiB of live allocations")
    p.add_argument("--disk-dir", default="/var/tmp/vmmckpt-bench")
    p.add_argument("--tmpfs-dir", default="/dev/shm/vmmckpt-bench")
    p.add_argument("--huge-tmpfs-dir", default="/mnt/vmmckpt-bench-huge",
                   help="a tmpfs with huge pages, mounted here for the run when absent (needs root); '' for none")
    default_python = "/opt/torch/.venv/bin/python3"
    p.add_argument("--python", default=default_python if os.path.exists(default_python) else "python3",
                   help="python with PyTorch, for the torch part")
    p.add_argument("--skip", default="", help="comma list of parts to skip")
    p.add_argument("--quick", action="store_true", help="sizes 1,4 (unless --sizes) and fewer iterations")
    p.add_argument("--append", action="store_true",
                   help="add to OUT/results.jsonl instead of starting it afresh: a run in several parts")
    p.add_argument("--cpu-only", action="store_true", help="the parts that need no GPU, on the emulated driver")
    p.add_argument("--process-modes", default="shim,native,shim,pre-copy",
                   help="the process part's rounds, in order: shim (dump --process), pre-copy (with --pre-copy), "
                        "native (the driver's checkpoint and CRIU)")
    p.add_argument("--dump-args", default="", help="extra options for cuda-ckpt dump, e.g. '--streams 4'")
    args = p.parse_args()
    args.sizes = number_list(args.sizes or ("1,4" if args.quick else "1,4,16,32"))
    args.sizes = [int(s) if float(s).is_integer() else s for s in args.sizes]
    args.cpu_sizes_mib = number_list(args.cpu_sizes_mib, int)
    args.skip = set(number_list(args.skip, str))
    unknown = args.skip - set(GPU_PARTS) - set(CPU_PARTS)
    if unknown:
        p.error(f"unknown parts in --skip: {', '.join(sorted(unknown))}")
    for path in ("bin/cuda-ckpt", "lib/libvmmckpt.so"):
        if not os.path.exists(os.path.join(args.build, path)):
            p.error(f"{os.path.join(args.build, path)} is missing: build first (scripts/bench.sh does)")
    # A run stopped from outside still cleans up (the finally below).
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))
    try:
        status = Bench(args).main()
    finally:
        kill_all()
    sys.exit(status)


if __name__ == "__main__":
    main()
