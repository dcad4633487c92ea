#!/usr/bin/env python3
"""Runs a GPU test program under the vmmckpt shim (and optionally natively) and checks that every
device pointer it reports lies in the shim's pool and that its results match the native run.

Usage: check_pool_run.py --shim build/lib/libvmmckpt.so [--compare-native] [--devices N] -- prog args...

The program prints, on stdout:
  ptr 0x<hex> <bytes> <api> [...]   one per device pointer it got
  result <name> <value...>          outputs that must be identical native vs shim
  case <name> <code> [values...]    edge-case return codes, identical native vs shim
  info ...                          free text, never compared
Exit codes: 0 pass, 1 fail, 2 usage error, 77 skipped (no GPU, or the program itself skipped)."""
import argparse
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import time

SKIP = 77
DEFAULT_POOL_BASE = 0x200000000000
DEFAULT_POOL_SIZE = 0x8000000000  # 512 GiB

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(0[xX][0-9a-fA-F]+|\d+)\s*([kKmMgGtT]?)(?:i?[bB])?\s*$")


def parse_size(text):
    """Parses the pool env syntax: hex (0x...) or decimal, optional K/M/G/T (binary) suffix."""
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(f"not a size: {text!r} (want 0x... or decimal with optional K/M/G/T)")
    number = int(m.group(1), 0) if m.group(1).lower().startswith("0x") else int(m.group(1), 10)
    return number * _SUFFIX[m.group(2).upper()]


def pool_layout(env):
    base = parse_size(env["VMMCKPT_POOL_BASE"]) if env.get("VMMCKPT_POOL_BASE") else DEFAULT_POOL_BASE
    size = parse_size(env["VMMCKPT_POOL_SIZE"]) if env.get("VMMCKPT_POOL_SIZE") else DEFAULT_POOL_SIZE
    return base, size


class Output:
    """The parsed stdout of one run."""

    def __init__(self):
        self.ptrs = []      # (addr, size, api, line_no)
        self.records = []   # (kind, name, value, line_no) for result and case lines
        self.errors = []    # malformed lines


def parse_output(text, info_patterns=()):
    out = Output()
    for line_no, raw in enumerate(text.splitlines(), 1):
        fields = raw.split()
        if not fields:
            continue
        kind = fields[0]
        if kind == "ptr":
            try:
                if len(fields) < 4 or not fields[1].lower().startswith("0x"):
                    raise ValueError
                addr, size = int(fields[1], 16), int(fields[2], 10)
                if size < 0:
                    raise ValueError
            except ValueError:
                out.errors.append(f"line {line_no}: malformed ptr line: {raw!r}")
                continue
            out.ptrs.append((addr, size, " ".join(fields[3:]), line_no))
        elif kind in ("result", "case"):
            if len(fields) < 3:
                out.errors.append(f"line {line_no}: malformed {kind} line: {raw!r}")
                continue
            name = fields[1]
            if any(fnmatch.fnmatchcase(name, pat) for pat in info_patterns):
                continue
            out.records.append((kind, name, " ".join(fields[2:]), line_no))
    return out


def pool_index(addr, size, base, pool_size, devices):
    """Device whose pool holds [addr, addr+size) entirely, or None."""
    last = addr + max(size, 1) - 1
    if addr < base:
        return None
    dev = (addr - base) // pool_size
    if dev >= devices:
        return None
    if last >= base + (dev + 1) * pool_size:
        return None
    return dev


def overlaps_pools(addr, size, base, pool_size, devices):
    end = addr + max(size, 1)
    return addr < base + devices * pool_size and end > base


def check_shim_ptrs(out, base, pool_size, devices):
    problems = []
    for addr, size, api, line_no in out.ptrs:
        if pool_index(addr, size, base, pool_size, devices) is None:
            problems.append(f"shim run: ptr 0x{addr:x} size {size} ({api}, stdout line {line_no}) "
                            f"is not inside a device pool [0x{base:x} + d*0x{pool_size:x}, "
                            f"d < {devices})")
    return problems


def check_native_ptrs(out, base, pool_size, devices):
    problems = []
    for addr, size, api, line_no in out.ptrs:
        if overlaps_pools(addr, size, base, pool_size, devices):
            problems.append(f"native run: ptr 0x{addr:x} size {size} ({api}, stdout line {line_no}) "
                            "lies in the pool range without the shim: the pool check proves nothing")
    return problems


def compare_records(native, shim, limit=40):
    """Compares result/case lines by name, in order of appearance."""
    problems = []

    def keyed(records):
        table, order = {}, []
        for kind, name, value, _ in records:
            key = (kind, name)
            if key not in table:
                table[key] = []
                order.append(key)
            table[key].append(value)
        return table, order

    nat, nat_order = keyed(native)
    shm, shm_order = keyed(shim)
    for key in nat_order:
        kind, name = key
        if key not in shm:
            problems.append(f"{kind} {name}: native printed {nat[key][0]!r}, shim printed nothing")
        elif nat[key] != shm[key]:
            for i, (a, b) in enumerate(zip(nat[key], shm[key])):
                if a != b:
                    which = f"#{i + 1} " if len(nat[key]) > 1 else ""
                    problems.append(f"{kind} {name} {which}differs: native {a!r} vs shim {b!r}")
            if len(nat[key]) != len(shm[key]):
                problems.append(f"{kind} {name}: native printed it {len(nat[key])} times, "
                                f"shim {len(shm[key])} times")
    for key in shm_order:
        if key not in nat:
            problems.append(f"{key[0]} {key[1]}: shim printed {shm[key][0]!r}, native printed nothing")
    if len(problems) > limit:
        problems = problems[:limit] + [f"... and {len(problems) - limit} more differences"]
    return problems


def compare_ptr_shapes(native, shim):
    """A deterministic program asks for the same sizes in the same order in both runs. Pitched
    allocations are the exception: the pitch (and so the size printed) is the allocator's choice."""
    def shape(size, api):
        return (None if "Pitch" in api else size, api)
    nat = [shape(size, api) for _, size, api, _ in native.ptrs]
    shm = [shape(size, api) for _, size, api, _ in shim.ptrs]
    if nat == shm:
        return []
    if len(nat) != len(shm):
        return [f"native printed {len(nat)} ptr lines, shim {len(shm)}"]
    for i, (a, b) in enumerate(zip(nat, shm)):
        if a != b:
            return [f"ptr line #{i + 1}: native size/api {a} vs shim {b}"]
    return []


def compare_addresses(first, second):
    a = [addr for addr, _, _, _ in first.ptrs]
    b = [addr for addr, _, _, _ in second.ptrs]
    if a == b:
        return []
    if len(a) != len(b):
        return [f"placement not deterministic: {len(a)} vs {len(b)} ptr lines in two shim runs"]
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return [f"placement not deterministic: ptr line #{i + 1} at 0x{x:x} in the first shim "
                    f"run, 0x{y:x} in the second"]
    return []


def gpu_present():
    """Returns (True, '') or (False, reason)."""
    if os.environ.get("VMMCKPT_ASSUME_GPU") == "1":
        return True, ""
    if not os.path.exists("/dev/nvidia0"):
        return False, "no GPU: /dev/nvidia0 does not exist"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False, "no GPU: nvidia-smi not found"
    try:
        res = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"no GPU: nvidia-smi -L failed: {exc}"
    if res.returncode != 0 or "GPU" not in res.stdout:
        return False, f"no GPU: nvidia-smi -L exited {res.returncode}: {res.stderr.strip()[:200]}"
    return True, ""


class Run:
    def __init__(self, label, rc, stdout, stderr, seconds):
        self.label, self.rc, self.stdout, self.stderr, self.seconds = label, rc, stdout, stderr, seconds


def run_program(label, cmd, env, timeout, log_dir):
    start = time.monotonic()
    try:
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                             errors="replace")
        run = Run(label, res.returncode, res.stdout, res.stderr, time.monotonic() - start)
    except subprocess.TimeoutExpired as exc:
        def text(b):
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
        run = Run(label, "timeout", text(exc.stdout), text(exc.stderr), time.monotonic() - start)
    except OSError as exc:
        run = Run(label, "exec-failed", "", str(exc), time.monotonic() - start)
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
        for stream in ("stdout", "stderr"):
            with open(os.path.join(log_dir, f"{label}.{stream}"), "w") as f:
                f.write(getattr(run, stream))
    return run


def tail(text, lines=25):
    kept = text.rstrip("\n").splitlines()[-lines:]
    return "\n".join("    | " + l for l in kept) if kept else "    | (empty)"


def parse_args(argv):
    if "--" not in argv:
        print("check_pool_run.py: missing '--' before the program", file=sys.stderr)
        sys.exit(2)
    split = argv.index("--")
    opts, prog = argv[:split], argv[split + 1:]
    p = argparse.ArgumentParser(prog="check_pool_run.py", description=__doc__.splitlines()[0])
    p.add_argument("--shim", required=True, help="path to libvmmckpt.so")
    p.add_argument("--compare-native", action="store_true",
                   help="also run natively: no ptr in the pool there, result/case lines equal")
    p.add_argument("--devices", type=int, default=1, help="number of device pools ptrs may fall in")
    p.add_argument("--check-deterministic", action="store_true",
                   help="run under the shim twice and require identical addresses")
    p.add_argument("--via-cuda-ckpt", metavar="PATH",
                   help="start the shim run as 'PATH run -- prog...' instead of setting LD_PRELOAD")
    p.add_argument("--info", action="append", default=[], metavar="GLOB",
                   help="treat result/case names matching GLOB as informational (repeatable)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for every run (repeatable)")
    p.add_argument("--timeout", type=float, default=240, help="seconds per run")
    p.add_argument("--log-dir", help="keep each run's stdout/stderr here")
    p.add_argument("--name", help="name in the summary line (default: the program's basename)")
    p.add_argument("--no-gpu-check", action="store_true",
                   help="do not skip when no GPU is visible (e.g. for an emulated driver)")
    args = p.parse_args(opts)
    if not prog:
        p.error("no program given after '--'")
    if args.devices < 1:
        p.error("--devices must be >= 1")
    return args, prog


def main(argv):
    args, prog = parse_args(argv)
    name = args.name or os.path.basename(prog[0])
    if not args.name and name.startswith("python") and len(prog) > 1:
        name = os.path.basename(prog[1])  # "python3 torch_train.py": name the script

    if not args.no_gpu_check:
        ok, reason = gpu_present()
        if not ok:
            print(f"SKIP {name}: {reason}")
            return SKIP

    shim = os.path.abspath(args.shim)
    if not os.path.isfile(shim):
        print(f"FAIL {name}: shim not found at {shim} (build the shim target first)")
        return 1
    if args.via_cuda_ckpt and not os.path.isfile(args.via_cuda_ckpt):
        print(f"FAIL {name}: cuda-ckpt not found at {args.via_cuda_ckpt}")
        return 1

    base_env = dict(os.environ)
    base_env.pop("LD_PRELOAD", None)  # the native run must really be native
    base_env["NCCL_NVLS_ENABLE"] = "0"
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"check_pool_run.py: --env wants KEY=VALUE, got {item!r}", file=sys.stderr)
            return 2
        base_env[key] = value
    try:
        pool_base, pool_size = pool_layout(base_env)
    except ValueError as exc:
        print(f"FAIL {name}: bad pool environment: {exc}")
        return 1

    shim_env = dict(base_env)
    if args.via_cuda_ckpt:
        shim_cmd = [os.path.abspath(args.via_cuda_ckpt), "run", "--"] + prog
    else:
        shim_env["LD_PRELOAD"] = shim
        shim_cmd = list(prog)

    runs = [run_program("shim", shim_cmd, shim_env, args.timeout, args.log_dir)]
    if args.check_deterministic:
        runs.append(run_program("shim2", shim_cmd, shim_env, args.timeout, args.log_dir))
    if args.compare_native:
        runs.append(run_program("native", list(prog), base_env, args.timeout, args.log_dir))
    by_label = {r.label: r for r in runs}

    skipped = [r for r in runs if r.rc == SKIP]
    if skipped and all(r.rc in (SKIP, 0) for r in runs):
        reason = skipped[0].stderr.strip().splitlines()[-1:] or ["program exited 77"]
        print(f"SKIP {name}: the program skipped in the {skipped[0].label} run: {reason[0]}")
        return SKIP

    problems = []
    for r in runs:
        if r.rc != 0:
            problems.append(f"{r.label} run exited {r.rc} after {r.seconds:.1f}s; stderr tail:\n"
                            f"{tail(r.stderr)}")

    parsed = {}
    for r in runs:
        parsed[r.label] = parse_output(r.stdout, args.info)
        problems += [f"{r.label} run: {e}" for e in parsed[r.label].errors]
    shim_out = parsed["shim"]
    if not shim_out.ptrs:
        problems.append("shim run printed no ptr lines")
    problems += check_shim_ptrs(shim_out, pool_base, pool_size, args.devices)[:20]

    if "shim2" in parsed:
        problems += [f"shim2 run: {p}" for p in
                     check_shim_ptrs(parsed["shim2"], pool_base, pool_size, args.devices)[:5]]
        problems += compare_addresses(shim_out, parsed["shim2"])
        problems += [f"shim runs: {p}" for p in compare_records(shim_out.records,
                                                                 parsed["shim2"].records)]

    if "native" in parsed:
        nat_out = parsed["native"]
        if not nat_out.ptrs:
            problems.append("native run printed no ptr lines")
        problems += check_native_ptrs(nat_out, pool_base, pool_size, args.devices)[:10]
        problems += compare_ptr_shapes(nat_out, shim_out)
        problems += compare_records(nat_out.records, shim_out.records)

    n_results = sum(1 for k, *_ in shim_out.records if k == "result")
    n_cases = sum(1 for k, *_ in shim_out.records if k == "case")
    in_pool = len(shim_out.ptrs) - len(check_shim_ptrs(shim_out, pool_base, pool_size, args.devices))
    times = " ".join(f"{r.label}={r.seconds:.1f}s" for r in runs)
    counts = (f"ptrs={len(shim_out.ptrs)} in_pool={in_pool} results={n_results} cases={n_cases} "
              f"native={'compared' if 'native' in by_label else 'not-run'} "
              f"deterministic={'checked' if 'shim2' in by_label else 'not-checked'} {times}")
    if problems:
        for p in problems:
            print(f"  - {p}")
        print(f"FAIL {name}: {len(problems)} problem(s); {counts}")
        return 1
    print(f"PASS {name}: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
