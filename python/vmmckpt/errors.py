"""The exceptions of the vmmckpt package: one base class, one subclass per way a call can fail."""

from __future__ import annotations

from typing import Optional


class VmmckptError(Exception):
    """Every failure of this package. ``exit_code`` is cuda-ckpt's exit status where a command failed."""

    def __init__(self, message: str, exit_code: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class ToolNotFoundError(VmmckptError):
    """No cuda-ckpt executable: not in the package, not in $VMMCKPT_CUDA_CKPT, not on PATH."""


class UsageError(VmmckptError):
    """cuda-ckpt refused its arguments (exit status 2): a bug in the call."""


class CommandFailedError(VmmckptError):
    """cuda-ckpt could not do it (exit status 1): the process is gone, not under vmmckpt, the disk is full..."""


class NoSuchProcessError(CommandFailedError):
    """No process of that pid, or it has exited."""


class NotUnderVmmckptError(CommandFailedError):
    """The process was not started under vmmckpt (``cuda-ckpt run`` or LD_PRELOAD=libvmmckpt.so): nothing of
    vmmckpt's can reach it."""


class NoControlServerError(CommandFailedError):
    """The process runs under vmmckpt but has no control server yet (no CUDA call yet, or a fork() child)."""


class ProcessRefusedError(CommandFailedError):
    """The process refused the request (busy with another operation, paused, in the wrong state)."""


class ProcessUnreachableError(CommandFailedError):
    """The process did not answer in time, or its connection failed."""


class DriverUnavailableError(CommandFailedError):
    """No usable CUDA driver for the tool (dump, suspend and peek by map need one)."""


class CriuUnavailableError(CommandFailedError):
    """A whole-process checkpoint needs CRIU 4 that can run here (root, or its capabilities)."""


class RankFailedError(CommandFailedError):
    """A job's operation gave up because one of its ranks failed."""


class CommandInterruptedError(CommandFailedError):
    """The command was stopped by a signal; nothing was written and the program goes on."""


class ImageError(CommandFailedError):
    """An image is missing, unreadable or not what it should be."""


# The failed command's "cause" (cuda-ckpt --json) to the class raised for it.
CAUSES = {"no_process": NoSuchProcessError, "not_under_vmmckpt": NotUnderVmmckptError,
          "no_control_server": NoControlServerError, "refused": ProcessRefusedError,
          "unreachable": ProcessUnreachableError, "driver_unavailable": DriverUnavailableError,
          "criu_unavailable": CriuUnavailableError, "rank_failed": RankFailedError,
          "interrupted": CommandInterruptedError, "image": ImageError}


class PartialRefusedError(VmmckptError):
    """dump or suspend refused (exit status 3): the process has device memory vmmckpt does not own.
    Nothing was written and the process goes on; pass ``allow_partial=True`` to write a partial image."""


class ImageDefectError(VmmckptError):
    """verify found a defect in an image; ``defect`` says which."""

    def __init__(self, message: str, defect: str, exit_code: Optional[int] = 1) -> None:
        super().__init__(message, exit_code)
        self.defect = defect


class NotUnderShimError(VmmckptError):
    """pause() or resume() in a process that does not run under libvmmckpt.so (start it with
    ``cuda-ckpt run -- python ...`` or LD_PRELOAD=libvmmckpt.so)."""


class PauseError(VmmckptError):
    """pause() or resume() failed; ``code`` is the C API's result (shim/include/vmmckpt/vmmckpt.h).
    A failed pause changed nothing; a failed resume leaves the process paused, to be tried again."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class PauseStateError(PauseError):
    """Already paused, not paused, or suspended by cuda-ckpt."""


class PauseBusyError(PauseError):
    """cuda-ckpt is working on this process, or CUDA calls of other threads did not return in time."""


class PauseMemoryError(PauseError):
    """Not enough host memory for the copy (pause) or GPU memory to come back (resume)."""


class PauseDriverError(PauseError):
    """The CUDA driver failed or is missing."""
