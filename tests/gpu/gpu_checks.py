"""What the GPU check scripts share: their command line, skipping, reading images through cuda-ckpt, the verdict.

An image's bytes come from `cuda-ckpt cat` (every extent's checksum checked) and its allocation table from
`cuda-ckpt inspect --json`: no check decodes the image format itself. The busy writers' pattern is checked
by busy_pattern_check, built from tests/programs/contracts/busy_pattern.hpp: it is not written here again.
"""
import argparse
import json
import os
import subprocess
import threading

SKIP = 77


class CheckError(Exception):
    """A step of a check could not be done; the message says which and why."""


def argument_parser(doc, command=True):
    """The options every check takes: --cuda-ckpt, --emulated, and (with `command`) the program after --."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cuda-ckpt", required=True)
    ap.add_argument("--emulated", action="store_true",
                    help="run on the emulated driver (LD_LIBRARY_PATH): no GPU needed, none looked for")
    if command:
        ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- PROGRAM [ARGS...]")
    return ap


def command(args):
    """The program's command line: what follows --."""
    return args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd


def skip_reason(args, torch=False):
    """Why this check cannot run here, or None."""
    if not args.emulated and not os.path.exists("/dev/nvidia0"):
        return "no GPU (/dev/nvidia0 does not exist)"
    if torch:
        try:
            import torch as _  # noqa: F401
        except ImportError:
            return "PyTorch is not installed"
    return None


def gpu_count():
    """How many GPUs nvidia-smi lists (0 where it cannot run)."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU ")) if out.returncode == 0 else 0


def failure(result):
    """What a failed cuda-ckpt command said (a subprocess.run result): with --json the reply's "error" on stdout,
    otherwise its stderr."""
    try:
        return json.loads(result.stdout)["error"]
    except (ValueError, KeyError, TypeError):
        return result.stderr.strip() or result.stdout.strip()


def finish(proc, timeout):
    """The rest of a started process's stdout and stderr (text; "" for one not piped) once it has exited;
    subprocess.TimeoutExpired after `timeout` seconds. Popen.communicate(timeout=...) reads the pipes' file
    descriptors directly and so loses what a loop over proc.stdout had already buffered (a rank's line was lost
    so); this reads through the same file objects."""
    parts = {}

    def drain(name, f):
        parts[name] = f.read() if f is not None else ""

    readers = [threading.Thread(target=drain, args=(name, f), daemon=True)
               for name, f in (("out", proc.stdout), ("err", proc.stderr))]
    for r in readers:
        r.start()
    proc.wait(timeout=timeout)
    for r in readers:
        r.join(timeout=60)
    return parts.get("out", ""), parts.get("err", "")


def skipped(reason):
    print(f"SKIPPED: {reason}")
    return SKIP


def verdict(problems, passed):
    """Prints FAIL with every problem, or PASS with `passed`; returns the exit code."""
    if problems:
        print("FAIL: " + "; ".join(problems))
        return 1
    print("PASS: " + passed)
    return 0


def allocations(cuda_ckpt, image):
    """The image's allocations as (address, size), from `cuda-ckpt inspect --json`."""
    r = subprocess.run([cuda_ckpt, "inspect", "--json", image], capture_output=True, text=True)
    if r.returncode != 0:
        raise CheckError(f"inspect {image} failed: {r.stderr.strip()}")
    return [(int(a["addr"], 16), a["size"]) for pool in json.loads(r.stdout)["pools"] for a in pool["allocations"]]


def image_bytes(cuda_ckpt, image, addr, size):
    """The image's bytes for [addr, addr + size), every extent checked, from `cuda-ckpt cat`."""
    r = subprocess.run([cuda_ckpt, "cat", image, hex(addr), str(size)], capture_output=True)
    if r.returncode != 0:
        raise CheckError(f"cat {hex(addr)} + {size} failed: {r.stderr.decode(errors='replace').strip()}")
    return r.stdout


def busy_problem(cuda_ckpt, pattern_check, image, buffer_size):
    """What is wrong with the busy writer's buffers (those of `buffer_size`) in an image, or None: each is
    piped from `cuda-ckpt cat` into busy_pattern_check."""
    buffers = [addr for addr, size in allocations(cuda_ckpt, image) if size == buffer_size]
    if not buffers:
        return "no buffers of the expected size in the image"
    for addr in buffers:
        cat = subprocess.Popen([cuda_ckpt, "cat", image, hex(addr), str(buffer_size)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
        check = subprocess.run([pattern_check, f"buffer {hex(addr)}"], stdin=cat.stdout, capture_output=True,
                               text=True)
        cat.stdout.close()
        cat_err = cat.stderr.read().decode(errors="replace").strip()
        cat.stderr.close()
        if cat.wait() != 0:
            return f"cat of buffer {hex(addr)} failed: {cat_err}"
        if check.returncode != 0:
            return (check.stdout.strip() or check.stderr.strip()) or f"busy_pattern_check exited {check.returncode}"
    return None
