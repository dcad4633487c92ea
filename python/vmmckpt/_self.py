"""The running process pausing its own GPU memory, through the shim's C API (shim/include/vmmckpt/vmmckpt.h)."""

from __future__ import annotations

import ctypes
import sys
import threading
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Mapping, Optional

from ._checks import require_bool
from .errors import (NotUnderShimError, PauseBusyError, PauseDriverError, PauseError, PauseMemoryError,
                     PauseStateError, VmmckptError)
from .results import PauseStats

_DISCARD = 1
_ERRORS = {1: PauseStateError, 2: PauseBusyError, 3: PauseMemoryError, 4: PauseDriverError}
_STATES = {0: "running", 1: "paused", 2: "suspended"}


class _Stats(ctypes.Structure):
    _fields_ = [("bytes_released", ctypes.c_uint64), ("bytes_copied", ctypes.c_uint64), ("seconds", ctypes.c_double)]


class _TagPolicy(ctypes.Structure):
    _fields_ = [("tag", ctypes.c_char_p), ("flags", ctypes.c_uint)]


_POLICIES = {"keep": 0, "discard": _DISCARD}


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
        if hasattr(process, "vmmckpt_set_tag"):  # API version 3
            process.vmmckpt_set_tag.restype = ctypes.c_int
            process.vmmckpt_set_tag.argtypes = [ctypes.c_char_p]
            process.vmmckpt_pause_tagged.restype = ctypes.c_int
            process.vmmckpt_pause_tagged.argtypes = [ctypes.c_uint, ctypes.POINTER(_TagPolicy), ctypes.c_uint,
                                                     ctypes.POINTER(_Stats)]
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


def _tagged_api() -> ctypes.CDLL:
    api = _required()
    if not hasattr(api, "vmmckpt_set_tag"):
        raise NotUnderShimError("the loaded libvmmckpt.so is too old for tags (API version 3)")
    return api


def pause(keep: bool = True, tags: Optional[Mapping[str, str]] = None) -> PauseStats:
    """Gives this process's GPU memory back to the driver while every address stays reserved.

    keep=True copies the bytes to host memory first and resume() writes them back; keep=False drops them
    (after resume() the memory reads as zeros), the torch_memory_saver use. `tags` sets a policy per tag
    (region()): {"kv_cache": "discard", "weights": "keep"}; memory of other tags, and untagged memory, follows
    `keep`. Until resume(), CUDA calls of every thread wait, so call nothing on the GPU in between. A failure
    (PauseError) changes nothing. keep must be a bool: anything else (None, "no", 0) raises TypeError before
    anything is paused.
    """
    require_bool("keep", keep)
    policies: List[_TagPolicy] = []
    for tag, policy in (tags or {}).items():
        if not isinstance(tag, str) or not tag:
            raise TypeError(f"a tag must be a non-empty str, not {tag!r}")
        if policy not in _POLICIES:
            raise ValueError(f"the policy for tag {tag!r} must be \"keep\" or \"discard\", not {policy!r}")
        policies.append(_TagPolicy(tag.encode(), _POLICIES[policy]))
    stats = _Stats()
    flags = 0 if keep else _DISCARD
    if not policies:
        api = _required()
        return _checked(api, api.vmmckpt_pause(flags, ctypes.byref(stats)), stats)
    api = _tagged_api()
    array = (_TagPolicy * len(policies))(*policies)
    return _checked(api, api.vmmckpt_pause_tagged(flags, array, len(policies), ctypes.byref(stats)), stats)


def sleep(level: int = 1) -> PauseStats:
    """A sleep as vLLM's: level 1 keeps the memory tagged "weights" (and untagged memory) in host memory and
    drops the memory tagged "kv_cache"; level 2 drops both (the weights are then loaded again after resume()),
    keeping untagged memory. resume() wakes the process."""
    if level not in (1, 2):
        raise ValueError(f"level must be 1 or 2, not {level!r}")
    return pause(True, {"kv_cache": "discard", "weights": "keep" if level == 1 else "discard"})


_regions = threading.local()
_pools: Dict[str, Any] = {}


def _set_tag(api: ctypes.CDLL, tag: str) -> None:
    if api.vmmckpt_set_tag(tag.encode()) != 0:
        raise ValueError((api.vmmckpt_last_error() or b"").decode(errors="replace"))


@contextmanager
def region(tag: str) -> Iterator[None]:
    """``with vmmckpt.region("kv_cache"): ...``: the GPU memory this thread allocates in the block carries `tag`,
    for pause(tags=...) and sleep(). With PyTorch loaded, the block allocates from a memory pool of the tag's own
    (torch.cuda.MemPool), so that its tensors take fresh memory, tagged, and not blocks cached from before.
    Regions nest; the tag of the one around comes back after the block."""
    if not isinstance(tag, str) or not tag:
        raise TypeError(f"tag must be a non-empty str, not {tag!r}")
    api = _tagged_api()
    stack = getattr(_regions, "stack", None)
    if stack is None:
        stack = _regions.stack = []
    _set_tag(api, tag)
    stack.append(tag)
    torch = sys.modules.get("torch")
    pool_context = None
    if torch is not None and hasattr(torch.cuda, "MemPool") and torch.cuda.is_available():
        pool = _pools.get(tag)
        if pool is None:
            pool = _pools[tag] = torch.cuda.MemPool()
        pool_context = torch.cuda.use_mem_pool(pool)
        pool_context.__enter__()
    try:
        yield
    finally:
        if pool_context is not None:
            pool_context.__exit__(None, None, None)
        stack.pop()
        _set_tag(api, stack[-1] if stack else "")


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


__all__ = ["VmmckptError", "under_shim", "state", "pause", "resume_self", "paused", "name", "region", "sleep"]
