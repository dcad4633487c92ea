"""The running process pausing its own GPU memory, through the shim's C API (shim/include/vmmckpt/vmmckpt.h)."""

from __future__ import annotations

import ctypes
from contextlib import contextmanager
from typing import Iterator, Optional

from ._checks import require_bool
from .errors import (NotUnderShimError, PauseBusyError, PauseDriverError, PauseError, PauseMemoryError,
                     PauseStateError, VmmckptError)
from .results import PauseStats

_DISCARD = 1
_ERRORS = {1: PauseStateError, 2: PauseBusyError, 3: PauseMemoryError, 4: PauseDriverError}
_STATES = {0: "running", 1: "paused", 2: "suspended"}


class _Stats(ctypes.Structure):
    _fields_ = [("bytes_released", ctypes.c_uint64), ("bytes_copied", ctypes.c_uint64), ("seconds", ctypes.c_double)]


_api: Optional[ctypes.CDLL] = None


def _shim() -> Optional[ctypes.CDLL]:
    """The preloaded shim's functions, found in the process's global scope; None without the shim."""
    global _api
    if _api is None:
        process = ctypes.CDLL(None)
        try:
            process.vmmckpt_pause
        except AttributeError:
            return None
        for name in ("vmmckpt_pause", "vmmckpt_resume"):
            getattr(process, name).restype = ctypes.c_int
        process.vmmckpt_pause.argtypes = [ctypes.c_uint, ctypes.POINTER(_Stats)]
        process.vmmckpt_resume.argtypes = [ctypes.POINTER(_Stats)]
        process.vmmckpt_state.restype = ctypes.c_int
        process.vmmckpt_last_error.restype = ctypes.c_char_p
        if hasattr(process, "vmmckpt_name"):  # a shim older than API version 2 has none
            process.vmmckpt_name.restype = ctypes.c_int
            process.vmmckpt_name.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_char_p]
        _api = process
    return _api


def _required() -> ctypes.CDLL:
    api = _shim()
    if api is None:
        raise NotUnderShimError("this process does not run under libvmmckpt.so: start it with "
                                "`cuda-ckpt run -- python ...` (or LD_PRELOAD=libvmmckpt.so)")
    return api


def _checked(api: ctypes.CDLL, code: int, stats: _Stats) -> PauseStats:
    if code != 0:
        message = (api.vmmckpt_last_error() or b"").decode(errors="replace") or f"error {code}"
        raise _ERRORS.get(code, PauseError)(message, code)
    return PauseStats(stats.bytes_released, stats.bytes_copied, stats.seconds)


def under_shim() -> bool:
    """Whether this process runs under libvmmckpt.so."""
    return _shim() is not None


def state() -> str:
    """This process's state: "running", "paused" (by pause()) or "suspended" (by cuda-ckpt suspend)."""
    api = _required()
    return _STATES.get(api.vmmckpt_state(), "running")


def pause(keep: bool = True) -> PauseStats:
    """Gives this process's GPU memory back to the driver while every address stays reserved.

    keep=True copies the bytes to host memory first and resume() writes them back; keep=False drops them
    (after resume() the memory reads as zeros), the torch_memory_saver use. Until resume(), CUDA calls of
    every thread wait, so call nothing on the GPU in between. A failure (PauseError) changes nothing.
    keep must be a bool: anything else (None, "no", 0) raises TypeError before anything is paused.
    """
    require_bool("keep", keep)
    api = _required()
    stats = _Stats()
    return _checked(api, api.vmmckpt_pause(0 if keep else _DISCARD, ctypes.byref(stats)), stats)


def resume_self() -> PauseStats:
    """Brings back the memory pause() gave up, at the same addresses, and lets every thread go on."""
    api = _required()
    stats = _Stats()
    return _checked(api, api.vmmckpt_resume(ctypes.byref(stats)), stats)


@contextmanager
def paused(keep: bool = True) -> Iterator[PauseStats]:
    """``with vmmckpt.paused(): ...`` pauses for the block and resumes after it, also when it raises."""
    require_bool("keep", keep)
    stats = pause(keep)
    try:
        yield stats
    finally:
        resume_self()


def name(memory: object, label: str, size: Optional[int] = None) -> None:
    """Names a range of this program's GPU memory, so that `cuda-ckpt peek PID LABEL` (and vmmckpt.peek) reads it
    without its address: a tensor (anything with data_ptr(), numel() and element_size()), or an int address with
    `size`. Naming another range so replaces it; size 0 unnames it."""
    api = _required()
    if not hasattr(api, "vmmckpt_name"):
        raise NotUnderShimError("the loaded libvmmckpt.so is too old for vmmckpt.name (API version 2)")
    if isinstance(memory, int) and not isinstance(memory, bool):
        if size is None:
            raise TypeError("an address needs a size")
        addr = memory
    elif hasattr(memory, "data_ptr") and hasattr(memory, "numel") and hasattr(memory, "element_size"):
        addr = int(memory.data_ptr())  # type: ignore[attr-defined]
        if size is None:
            size = int(memory.numel()) * int(memory.element_size())  # type: ignore[attr-defined]
    else:
        raise TypeError(f"memory must be a tensor or an int address, not {type(memory).__name__}")
    if api.vmmckpt_name(ctypes.c_void_p(addr), ctypes.c_uint64(size), label.encode()) != 0:
        raise ValueError((api.vmmckpt_last_error() or b"").decode(errors="replace"))


__all__ = ["VmmckptError", "under_shim", "state", "pause", "resume_self", "paused", "name"]
