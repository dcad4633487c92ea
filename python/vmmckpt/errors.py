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
