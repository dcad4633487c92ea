#!/usr/bin/env python3
"""Whole-process checkpoints on a GPU: dump --process, the process ends, restore DIR, it goes on.

  process_check.py --cuda-ckpt build/bin/cuda-ckpt --list-program build/tests/programs/gpu_linked_list
                   [--torch-python PYTHON --torch-script tests/programs/gpu/torch_train.py]

1. gpu_linked_list serve: kernels built a linked list in device memory; every tick a kernel walks it and
   the CPU counter ticks. Dumped whole, it ends; restored, its ticks go on from the dump's and every walk
   is right.
2. torch_train.py: a deterministic training run paused after step K is dumped whole, ends, is restored and
   finishes: its losses from step K on must be bitwise those of an uninterrupted run.
With --pre-copy, each dump is `dump --process --pre-copy`: the GPU memory dumped first while the program runs,
the stop writing only what changed since (checked: no more than the pre-copy wrote).
With --criu-plugin DIR, the same checkpoints are made by plain `criu dump` and `criu restore` with the CRIU
plugin in DIR (criu --libdir), as a container runtime runs them, instead of cuda-ckpt's own commands.
Prints the dump and restore times and PASS/FAIL. Exits 77 when there is no GPU or no CRIU (VMMCKPT_CRIU,
or criu on PATH; scripts/provision-criu.sh), or when not root (CRIU needs it). Standard library only.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import gpu_checks


def wait_for(predicate, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def lines(path):
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def last_tick(log):
    ticks = [int(l.split()[1]) for l in lines(log) if l.startswith("tick ")]
    return ticks[-1] if ticks else 0


def gone(pid):
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
        return False
    except ProcessLookupError:
        return True


def start_detached(cuda_ckpt, argv, out):
    """The program under vmmckpt in a session of its own, stdio on files (CRIU takes them along)."""
    with open(out, "w") as f:
        p = subprocess.Popen([cuda_ckpt, "run", "--"] + argv, stdin=subprocess.DEVNULL, stdout=f,
                             stderr=subprocess.STDOUT, start_new_session=True)
    return p


def tool(cuda_ckpt, *args, timeout=600):
    start = time.monotonic()
    r = subprocess.run([cuda_ckpt, *args], capture_output=True, text=True, timeout=timeout)
    return r, time.monotonic() - start


def libcuda_path():
    """Where this machine's libcuda.so.1 is: CRIU starts through a loader of its own (scripts/provision-criu.sh)
    that does not look where LD_LIBRARY_PATH says, so the plugin is told (VMMCKPT_LIBCUDA)."""
    import ctypes
    ctypes.CDLL("libcuda.so.1")
    for line in lines("/proc/self/maps"):
        if line.endswith("libcuda.so.1") or "/libcuda.so." in line:
            return line.split()[-1]
    return "libcuda.so.1"


def criu_round(plugin_dir, pid, image, problems, what):
    """Plain criu dump (the process ends) and criu restore with the plugin; True when both succeeded."""
    criu = os.environ.get("VMMCKPT_CRIU") or shutil.which("criu")
    os.environ.setdefault("VMMCKPT_LIBCUDA", libcuda_path())
    os.makedirs(image)
    common = ["--shell-job", "--libdir", plugin_dir, "-v4"]
    start = time.monotonic()
    r = subprocess.run([criu, "dump", "-t", str(pid), "-D", image, "-o", "dump.log"] + common, capture_output=True,
                       text=True, timeout=600)
    dump_s = time.monotonic() - start
    if r.returncode != 0 or not wait_for(lambda: gone(pid), 15):
        problems.append(f"{what}: criu dump with the plugin failed ({r.returncode}): "
                        + " | ".join(l for l in lines(os.path.join(image, "dump.log")) if "vmmckpt" in l or "Error" in l))
        return False
    start = time.monotonic()
    r = subprocess.run([criu, "restore", "-D", image, "-d", "-o", "restore.log"] + common, capture_output=True,
                       text=True, timeout=600)
    restore_s = time.monotonic() - start
    if r.returncode != 0:
        problems.append(f"{what}: criu restore with the plugin failed ({r.returncode}): "
                        + " | ".join(l for l in lines(os.path.join(image, "restore.log")) if "vmmckpt" in l or "Error" in l))
        return False
    print(f"{what}: criu dump with the plugin {dump_s:.3f} s; criu restore {restore_s:.3f} s (the GPU memory then "
          "comes back as the process goes on)")
    return True


def whole_process_round(cuda_ckpt, pid, image, problems, what, plugin_dir=None, pre_copy=False):
    """dump --process (the process ends), then restore; returns (dump json, restore json) or None. With
    `plugin_dir`, plain criu with the plugin does both; returns True or None."""
    if plugin_dir:
        return True if criu_round(plugin_dir, pid, image, problems, what) else None
    r, dump_s = tool(cuda_ckpt, "dump", str(pid), "--process", "-o", image, "--json",
                     *(["--pre-copy"] if pre_copy else []))
    if r.returncode != 0:
        problems.append(f"{what}: dump --process failed: {r.stderr.strip() or r.stdout.strip()}")
        return None
    dumped = json.loads(r.stdout)
    if pre_copy:
        print(f"{what}: pre-copied {dumped['pre_copy_bytes'] / 2**20:.1f} MiB while it ran (held at most "
              f"{dumped['pre_copy_held_ms']:.1f} ms); the stop wrote {dumped['held_bytes'] / 2**20:.1f} MiB")
        if not dumped["pre_copied"] or dumped["held_bytes"] > dumped["pre_copy_bytes"]:
            problems.append(f"{what}: --pre-copy did not leave the stop only what changed: {r.stdout.strip()}")
    if not wait_for(lambda: gone(pid), 15):
        problems.append(f"{what}: the process did not end after dump --process")
        return None
    r, restore_s = tool(cuda_ckpt, "restore", image, "--json")
    if r.returncode != 0:
        problems.append(f"{what}: restore failed: {r.stderr.strip() or r.stdout.strip()}")
        return None
    restored = json.loads(r.stdout)
    print(f"{what}: dump --process {dump_s:.3f} s (stopped {dumped['stopped_seconds']:.3f} s, "
          f"{dumped['gpu_bytes'] / 2**20:.1f} MiB GPU; phases {dumped['phases']}); "
          f"restore {restore_s:.3f} s (phases {restored['phases']})")
    if restored["pid"] != pid:
        problems.append(f"{what}: restored pid {restored['pid']}, not {pid}")
    return dumped, restored


def linked_list_check(args, work, problems):
    path = os.path.join(work, "list")
    log = path + ".log"
    p = start_detached(args.cuda_ckpt, [args.list_program, "serve", path], os.path.join(work, "list.out"))
    if not wait_for(lambda: last_tick(log) >= 3, 60):
        problems.append("linked list: no ticks: " + " | ".join(lines(os.path.join(work, "list.out"))[-5:]))
        p.kill()
        return
    if whole_process_round(args.cuda_ckpt, p.pid, os.path.join(work, "list-image"), problems, "linked list",
                           args.criu_plugin, args.pre_copy) is None:
        p.kill()
        return
    at = last_tick(log)
    if not wait_for(lambda: last_tick(log) >= at + 10, 60):
        problems.append(f"linked list: no ticks after the restore (last {last_tick(log)}); "
                        + " | ".join(lines(os.path.join(work, "list.out"))[-5:]))
    open(path + ".stop", "w").close()
    if not wait_for(lambda: any(l.startswith("stopped at") for l in lines(log)), 30):
        problems.append("linked list: did not stop")
    if not wait_for(lambda: gone(p.pid), 15):
        os.kill(p.pid, 9)
    out = lines(os.path.join(work, "list.out"))
    if any("bad" in l.lower() or "node" in l.lower() for l in out):
        problems.append("linked list: " + " | ".join(out[-5:]))
    ticks = [int(l.split()[1]) for l in lines(log) if l.startswith("tick ")]
    jumps = [(a, b) for a, b in zip(ticks, ticks[1:]) if b > a + 1]
    if jumps:
        problems.append(f"linked list: ticks jumped {jumps[:3]}")
    print(f"linked list: {len(ticks)} ticks, the walk right every time; CPU counter went on from {at}")


def losses(out):
    return [l for l in lines(out) if l.startswith("result loss_")]


def torch_check(args, work, problems):
    steps, pause = 40, 19
    env_script = [args.torch_python, "-u", args.torch_script, "--steps", str(steps)]
    ref_out = os.path.join(work, "torch-ref.out")
    with open(ref_out, "w") as f:
        r = subprocess.run([args.cuda_ckpt, "run", "--"] + env_script, stdout=f, stderr=subprocess.STDOUT,
                           timeout=300)
    if r.returncode == 77:
        print("torch: SKIPPED (" + " ".join(lines(ref_out)[-1:]) + ")")
        return
    reference = losses(ref_out)
    if r.returncode != 0 or len(reference) != steps:
        problems.append("torch: the uninterrupted run failed: " + " | ".join(lines(ref_out)[-5:]))
        return
    gate = os.path.join(work, "gate")
    out = os.path.join(work, "torch.out")
    p = start_detached(args.cuda_ckpt, env_script + ["--pause-at", str(pause), gate], out)
    if not wait_for(lambda: "paused" in lines(out), 180):
        problems.append("torch: never paused: " + " | ".join(lines(out)[-5:]))
        p.kill()
        return
    if whole_process_round(args.cuda_ckpt, p.pid, os.path.join(work, "torch-image"), problems, "torch",
                           args.criu_plugin, args.pre_copy) is None:
        p.kill()
        return
    open(gate, "w").close()
    if not wait_for(lambda: gone(p.pid), 240):
        problems.append("torch: the restored run did not finish")
        os.kill(p.pid, 9)
        return
    got = losses(out)
    if got != reference:
        first = next((i for i, (a, b) in enumerate(zip(got, reference)) if a != b), min(len(got), len(reference)))
        problems.append(f"torch: losses differ from the uninterrupted run's at line {first} "
                        f"({got[first:first + 1]} vs {reference[first:first + 1]}; {len(got)} of {steps})")
    else:
        print(f"torch: losses 0..{steps - 1} bitwise those of the uninterrupted run (checkpointed after step {pause})")


def main():
    ap = gpu_checks.argument_parser(__doc__, command=False)
    ap.add_argument("--list-program", required=True)
    ap.add_argument("--torch-python", default=None)
    ap.add_argument("--torch-script", default=None)
    ap.add_argument("--criu-plugin", default=None, help="checkpoint with plain criu and the plugin in this directory")
    ap.add_argument("--pre-copy", action="store_true", help="dump --process --pre-copy")
    args = ap.parse_args()
    if (reason := gpu_checks.skip_reason(args)):
        return gpu_checks.skipped(reason)
    if os.geteuid() != 0:
        return gpu_checks.skipped("CRIU dumps and restores processes as root only")
    if not os.environ.get("VMMCKPT_CRIU") and not shutil.which("criu"):
        return gpu_checks.skipped("no CRIU 4 (VMMCKPT_CRIU or criu on PATH; scripts/provision-criu.sh)")
    problems = []
    work = tempfile.mkdtemp(prefix="vmmckpt-process-")
    try:
        linked_list_check(args, work, problems)
        if args.torch_python and args.torch_script:
            torch_check(args, work, problems)
    finally:
        if not problems:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"(files kept in {work})")
    how = "plain criu dump and restore with the plugin" if args.criu_plugin else \
        "whole-process dump with pre-copy and restore" if args.pre_copy else "whole-process dump and restore"
    return gpu_checks.verdict(problems, how + " on the GPU")


if __name__ == "__main__":
    sys.exit(main())
