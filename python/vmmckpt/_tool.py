"""ps, dump, suspend, resume, restore, inspect and verify: cuda-ckpt run with --json, its answer typed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

from ._checks import require_bool, require_command, require_int, require_path, require_readable_directory
from .errors import (CAUSES, CommandFailedError, ImageDefectError, PartialRefusedError, ToolNotFoundError, UsageError,
                     VmmckptError)
from .results import DumpResult, ImageInfo, Process, ResumeResult, SuspendResult, VerifyResult

PathLike = Union[str, "os.PathLike[str]"]


def tool_path() -> str:
    """The cuda-ckpt this package runs: $VMMCKPT_CUDA_CKPT, else the one installed with the package, else PATH."""
    explicit = os.environ.get("VMMCKPT_CUDA_CKPT")
    if explicit:
        return explicit
    bundled = Path(__file__).resolve().parent / "bin" / "cuda-ckpt"
    if bundled.is_file() and os.access(bundled, os.X_OK):
        return str(bundled)
    found = shutil.which("cuda-ckpt")
    if found:
        return found
    raise ToolNotFoundError("cuda-ckpt not found: install vmmckpt with pip or cmake --install, put cuda-ckpt on "
                            "PATH, or set VMMCKPT_CUDA_CKPT")


def _tool_environment() -> Dict[str, str]:
    """This process's environment less the shim: a program under vmmckpt that calls these functions must
    not run cuda-ckpt under the shim too (the tool's own GPU memory would take the pool's addresses)."""
    env = dict(os.environ)
    kept = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if "libvmmckpt" not in Path(p).name]
    if kept:
        env["LD_PRELOAD"] = " ".join(kept)
    else:
        env.pop("LD_PRELOAD", None)
    return env


def _run(command: str, args: Sequence[str]) -> Any:
    """Runs `cuda-ckpt COMMAND ARGS --json` and returns its JSON answer; raises on failure."""
    argv = [tool_path(), command, *args, "--json"]
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False,
                              env=_tool_environment())
    except OSError as e:
        raise ToolNotFoundError(f"cannot run {argv[0]}: {e}") from e
    answer: Any = None
    if done.stdout.strip():
        try:
            answer = json.loads(done.stdout)
        except json.JSONDecodeError:
            answer = None
    if done.returncode == 0 and answer is not None:
        return answer
    message = ""
    if isinstance(answer, dict):
        message = str(answer.get("error") or answer.get("defect") or "")
    message = message or done.stderr.strip() or f"cuda-ckpt {command} exited with status {done.returncode}"
    if done.returncode == 2:
        raise UsageError(message, 2)
    if done.returncode == 3:
        raise PartialRefusedError(message, 3)
    if done.returncode == 0:
        raise VmmckptError(f"cuda-ckpt {command} printed no JSON: {done.stdout[:200]!r}", 0)
    cause = answer.get("cause") if isinstance(answer, dict) else None
    raise CAUSES.get(cause, CommandFailedError)(message, done.returncode)


def _options(**options: Any) -> List[str]:
    args: List[str] = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        args += [flag] if value is True else [flag, str(value)]
    return args


def ps(pid: Optional[int] = None) -> List[Process]:
    """The processes running under vmmckpt and the orphaned images of dead ones (this user's; every user's
    for root). With pid, that process only: CommandFailedError says why when it is not under vmmckpt."""
    require_int("pid", pid, optional=True)
    return [Process.from_json(p) for p in _run("ps", [] if pid is None else [str(int(pid))])]


def dump(pid: int, output: Optional[PathLike] = None, *, allow_partial: bool = False, deadline: Optional[int] = None,
         writers: Optional[int] = None, parent: Optional[PathLike] = None) -> DumpResult:
    """A consistent image of a running process's GPU memory, written to `output` (a new directory). With
    `parent`, an incremental image: blocks unchanged since that image are left to it."""
    require_int("pid", pid)
    require_path("output", output, optional=True)
    require_bool("allow_partial", allow_partial)
    require_int("deadline", deadline, optional=True)
    require_int("writers", writers, optional=True)
    require_path("parent", parent, optional=True)
    args = [str(int(pid))] + (["-o", os.fspath(output)] if output is not None else [])
    j = _run("dump", args + _options(allow_partial=allow_partial, deadline=deadline, writers=writers,
                                     parent=os.fspath(parent) if parent is not None else None))
    return DumpResult(image=j["image"], pid=int(j["pid"]), bytes=int(j["bytes"]), seconds=float(j["seconds"]),
                      hold_ms=float(j.get("hold_ms", 0)), partial=bool(j.get("lacking")), raw=j,
                      zero_bytes=int(j.get("zero_bytes", 0)))


def suspend(pid: int, output: Optional[PathLike] = None, *, verify: bool = False, allow_partial: bool = False,
            deadline: Optional[int] = None, parent: Optional[PathLike] = None) -> SuspendResult:
    """Saves a process's GPU memory and frees it; the process waits until resume(pid). With `parent`, blocks
    unchanged since that image (weights dumped earlier) are left to it."""
    require_int("pid", pid)
    require_path("output", output, optional=True)
    require_bool("verify", verify)
    require_bool("allow_partial", allow_partial)
    require_int("deadline", deadline, optional=True)
    require_path("parent", parent, optional=True)
    args = [str(int(pid))] + (["-o", os.fspath(output)] if output is not None else [])
    j = _run("suspend", args + _options(verify=verify, allow_partial=allow_partial, deadline=deadline,
                                        parent=os.fspath(parent) if parent is not None else None))
    return SuspendResult(image=j["image"], pid=int(j["pid"]), bytes=int(j.get("bytes", 0)),
                         freed_bytes=int(j.get("freed_bytes", 0)), seconds=float(j["seconds"]), raw=j,
                         zero_bytes=int(j.get("zero_bytes", 0)))


def resume_process(pid: int) -> ResumeResult:
    """Gives a suspended process its GPU memory back."""
    require_int("pid", pid)
    j = _run("resume", [str(int(pid))])
    return ResumeResult(pid=int(j["pid"]), bytes=int(j["bytes"]), seconds=float(j["seconds"]), image=str(j["image"]),
                        raw=j)


def inspect(image: PathLike) -> ImageInfo:
    """An image's manifest (its structure checked, its data not read)."""
    require_path("image", image)
    j: Dict[str, Any] = _run("inspect", [os.fspath(image)])
    allocations = sum(len(p.get("allocations", [])) for p in j.get("pools", []))
    return ImageInfo(path=os.fspath(image), image_id=str(j.get("image_id", "")), format=int(j.get("format", 0)),
                     data_bytes=int(j.get("data_bytes", 0)), allocation_count=allocations,
                     partial=bool(j.get("lacking")), raw=j)


def verify(image: PathLike) -> VerifyResult:
    """Checks an image's structure and every checksum; raises ImageDefectError naming the defect.

    A path that does not exist raises FileNotFoundError, one this user cannot read PermissionError: neither
    is a verdict on an image."""
    require_path("image", image)
    require_readable_directory(image)
    try:
        j = _run("verify", [os.fspath(image)])
    except CommandFailedError as e:
        raise ImageDefectError(f"{os.fspath(image)}: {e.message}", e.message, e.exit_code) from None
    return VerifyResult(image=str(j["image"]), partial=bool(j.get("partial")), lacking=list(j.get("lacking", [])), raw=j)


def restore(image: PathLike, command: Sequence[str], *, replay: bool = False, device: Optional[int] = None,
            verify: bool = True, **popen: Any) -> "subprocess.Popen[Any]":
    """Starts `command` with the image's GPU memory back at its addresses; returns the running process.

    The image is checked first (every checksum unless verify=False): a bad image fails the process with
    exit status 1 before the command starts. Extra keyword arguments go to subprocess.Popen.
    """
    require_path("image", image)
    require_command("command", command)
    require_bool("replay", replay)
    require_int("device", device, optional=True)
    require_bool("verify", verify)
    if not command:
        raise UsageError("restore needs a command to start (the program that rebuilds its CPU state)", 2)
    argv = [tool_path(), "restore", os.fspath(image)] + _options(replay=replay, device=device)
    if not verify:
        argv.append("--no-verify")
    popen.setdefault("env", _tool_environment())
    return subprocess.Popen(argv + ["--", *command], **popen)


_ORDERS = ("live", "ordered", "quiesce")


def _target(addr: Union[int, str]) -> str:
    """An address (int) or a range name the program gave (str, NAME or NAME+OFFSET), as cuda-ckpt peek takes it."""
    if isinstance(addr, bool) or not isinstance(addr, (int, str)):
        raise TypeError(f"addr must be an int address or a str name, not {type(addr).__name__} {addr!r}")
    return hex(addr) if isinstance(addr, int) else addr


def peek(pid: int, addr: Union[int, str], size: Optional[int] = None, *, order: str = "live",
         via: Optional[str] = None, dtype: Any = None, shape: Optional[Sequence[int]] = None) -> Any:
    """The bytes of a running program's GPU memory (docs/peek.md): `size` bytes at `addr`, or at the range the
    program named `addr` (vmmckpt.name); size None reads all of a named range, or 256 bytes at an address.
    `order` is "live" (unordered with its kernels), "ordered" or "quiesce". With `dtype` (numpy present), a numpy
    array of that type, in `shape` when given."""
    require_int("pid", pid)
    require_int("size", size, optional=True)
    if order not in _ORDERS:
        raise ValueError(f"order must be one of {', '.join(_ORDERS)}, not {order!r}")
    with tempfile.TemporaryDirectory(prefix="vmmckpt-peek-") as scratch:
        out = os.path.join(scratch, "bytes")
        args = [str(int(pid)), _target(addr)] + ([str(int(size))] if size is not None else [])
        _run("peek", args + ["-o", out, "--" + order] + (["--via", via] if via else []))
        with open(out, "rb") as f:
            data = f.read()
    if dtype is None:
        return data
    import numpy  # only when asked for an array

    array = numpy.frombuffer(data, dtype=dtype)
    return array.reshape(shape) if shape is not None else array


def poke(pid: int, addr: Union[int, str], data: bytes, *, order: str = "quiesce") -> int:
    """Writes `data` into a running program's GPU memory at `addr` (an address, or a name as for peek), wholly
    inside one allocation vmmckpt owns; by default with the program held for the write. Returns the bytes written."""
    require_int("pid", pid)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data must be bytes, not {type(data).__name__}")
    if order not in _ORDERS:
        raise ValueError(f"order must be one of {', '.join(_ORDERS)}, not {order!r}")
    with tempfile.TemporaryDirectory(prefix="vmmckpt-poke-") as scratch:
        source = os.path.join(scratch, "bytes")
        with open(source, "wb") as f:
            f.write(bytes(data))
        j = _run("poke", [str(int(pid)), _target(addr), source, "--yes", "--" + order])
    return int(j["size"])
