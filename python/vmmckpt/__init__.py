"""vmmckpt from Python: checkpoint, suspend and restore CUDA processes, and pause a process's own GPU memory.

Other processes (cuda-ckpt underneath): ps, dump, suspend, resume(pid), restore, inspect, verify.
This process, when it runs under libvmmckpt.so: pause(), resume(), paused(), state(), under_shim().
docs/python.md has the details and examples.
"""

from __future__ import annotations

from typing import Optional, Union, overload

from . import _self, _tool
from ._self import name, pause, paused, region, sleep, state, under_shim
from ._tool import dump, inspect, peek, poke, ps, restore, suspend, tool_path, verify
from .errors import (CommandFailedError, CommandInterruptedError, CriuUnavailableError, DriverUnavailableError,
                     ImageDefectError, ImageError, NoControlServerError, NoSuchProcessError, NotUnderShimError,
                     NotUnderVmmckptError, PartialRefusedError, PauseBusyError, PauseDriverError, PauseError,
                     PauseMemoryError, PauseStateError, ProcessRefusedError, ProcessUnreachableError, RankFailedError,
                     ToolNotFoundError, UsageError, VmmckptError)
from .results import (DumpResult, ImageInfo, PauseStats, Process, ResumeResult, SuspendResult, VerifyResult)


@overload
def resume() -> PauseStats: ...
@overload
def resume(pid: int) -> ResumeResult: ...


def resume(pid: Optional[int] = None) -> Union[PauseStats, ResumeResult]:
    """resume(): this process's memory back after pause(). resume(pid): a process suspended by suspend(pid)."""
    if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int)):
        raise TypeError(f"pid must be an int or None, not {type(pid).__name__} {pid!r}")
    return _self.resume_self() if pid is None else _tool.resume_process(pid)


__all__ = [
    "pause", "resume", "paused", "state", "under_shim", "name", "region", "sleep",
    "ps", "dump", "peek", "poke", "suspend", "restore", "inspect", "verify", "tool_path",
    "PauseStats", "Process", "DumpResult", "SuspendResult", "ResumeResult", "VerifyResult", "ImageInfo",
    "VmmckptError", "ToolNotFoundError", "UsageError", "CommandFailedError", "PartialRefusedError",
    "ImageDefectError", "NotUnderShimError", "PauseError", "PauseStateError", "PauseBusyError",
    "PauseMemoryError", "PauseDriverError", "NoSuchProcessError", "NotUnderVmmckptError", "NoControlServerError",
    "ProcessRefusedError", "ProcessUnreachableError", "DriverUnavailableError", "CriuUnavailableError",
    "RankFailedError", "CommandInterruptedError", "ImageError",
]
