"""Typed results of the vmmckpt package. Each keeps cuda-ckpt's whole JSON answer in ``raw`` too."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


@dataclass(frozen=True)
class PauseStats:
    """What pause() or resume() of this process did."""

    bytes_released: int  # pause: GPU memory given back; resume: GPU memory made again
    bytes_copied: int  # to host memory (pause) or back to the GPU (resume)
    seconds: float


@dataclass(frozen=True)
class Process:
    """A process running under vmmckpt, or an orphaned image of one that died, as ``cuda-ckpt ps`` lists it."""

    pid: int
    state: str  # running, dumping, suspending, suspended, resuming, paused, not responding, orphaned, ... (ps --help)
    uid: int  # the owner
    command: List[str]
    devices: List[int]
    live_bytes: int  # device memory vmmckpt holds for it
    reserved_bytes: int  # physical memory behind that
    not_owned_bytes: int  # device memory no image would hold
    image: Optional[str]  # a suspended process's image, or an orphaned one
    image_bytes: Optional[int]  # an orphaned image's size
    remove_with: Optional[str]  # the command that removes an orphaned image
    problem: Optional[str]  # why a process did not answer
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @staticmethod
    def from_json(j: Dict[str, Any]) -> "Process":
        pools = j.get("pools", [])
        return Process(
            pid=int(j["pid"]),
            state=str(j.get("status") or j.get("state") or "unknown"),
            uid=int(j.get("uid", -1)),
            command=list(j.get("command", [])),
            devices=sorted({int(d["ordinal"]) for d in j.get("devices", [])}),
            live_bytes=sum(int(p.get("live_bytes", 0)) for p in pools),
            reserved_bytes=sum(int(p.get("backed_bytes", 0)) for p in pools),
            not_owned_bytes=sum(int(m.get("bytes", 0)) for m in j.get("not_owned", [])),
            image=j.get("image") or None,
            image_bytes=j.get("image_bytes"),
            remove_with=j.get("remove_with"),
            problem=j.get("problem"),
            raw=j,
        )


@dataclass(frozen=True)
class _ImageWritten:
    """What a dump and a suspend both report: the image, the process and the bytes written."""

    image: str
    pid: int
    bytes: int


@dataclass(frozen=True)
class DumpResult(_ImageWritten):
    """A dump: the image written and what it took."""

    seconds: float
    hold_ms: float  # how long the program was held
    partial: bool  # the image lacks memory vmmckpt did not own (allow_partial)
    raw: Dict[str, Any] = field(repr=False, compare=False)
    zero_bytes: int = 0  # bytes of blocks of zeros: recorded in the image, not written (image format 6)


@dataclass(frozen=True)
class SuspendResult(_ImageWritten):
    """A suspend: the image the process depends on until resume, and the memory freed."""

    freed_bytes: int
    seconds: float
    raw: Dict[str, Any] = field(repr=False, compare=False)
    zero_bytes: int = 0  # as DumpResult's


@dataclass(frozen=True)
class ResumeResult:
    """A resume of a suspended process."""

    pid: int
    bytes: int
    seconds: float
    image: str
    raw: Dict[str, Any] = field(repr=False, compare=False)


@dataclass(frozen=True)
class VerifyResult:
    """An image that verify found good."""

    image: str
    partial: bool
    lacking: List[Dict[str, Any]]
    raw: Dict[str, Any] = field(repr=False, compare=False)


@dataclass(frozen=True)
class ImageInfo:
    """An image's manifest, as inspect prints it: the figures most callers need, and the rest in ``raw``."""

    path: str
    image_id: str
    format: int
    data_bytes: int
    allocation_count: int
    partial: bool
    raw: Dict[str, Any] = field(repr=False, compare=False)
