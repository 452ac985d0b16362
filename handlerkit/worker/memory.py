"""Peak memory of one block of code: host RSS and, on CUDA, the caching allocator's peak.

``tracemalloc`` does not see torch's allocations, so the host side measures the process's
resident set instead. The preferred method on Linux resets the kernel's high-water mark by
writing ``"5"`` to ``/proc/self/clear_refs`` and reads the mark back at the end: from
``getrusage`` (one syscall) where its ``ru_maxrss`` is exact for the block, else ``VmHWM`` from
``/proc/self/status`` (the kernel formats the whole file for it, ten times the cost). Either
way the kernel itself records the peak, so a tensor allocated and freed inside the
block is caught however briefly it lived. Where that write is refused, a thread samples
RSS about every millisecond (it can miss a peak shorter than that, and needs the GIL to be
released now and then, as torch ops and sleeps do). Elsewhere the method is
``"unavailable"`` and the CPU numbers are None.

Both the high-water mark and RSS belong to the whole process, so allocations made by other
threads during the block count too. Trackers nest: an inner tracker's reset of the
high-water mark (or of CUDA's peak statistics) first folds the peak so far into every
enclosing tracker, so the outer peak stays right.
"""

from __future__ import annotations

import os
import sys
import threading

try:
    import resource
except ImportError:  # not on Windows; the vmhwm method is Linux-only anyway
    resource = None  # type: ignore[assignment]
from types import TracebackType
from typing import Any

from handlerkit._text import format_bytes
from handlerkit.worker import devices as _device
from handlerkit.worker.devices import device_kind

__all__ = ["METHODS", "MemoryTracker", "cpu_method", "format_bytes", "rss_bytes"]

METHODS = ("vmhwm", "sampling", "unavailable", "disabled")
"""The values of :attr:`MemoryTracker.method`."""

_STATUS = "/proc/self/status"
_STATM = "/proc/self/statm"
_CLEAR_REFS = "/proc/self/clear_refs"
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_LINUX = sys.platform.startswith("linux")

_best_method: str | None = None
# An upper bound of getrusage's floor (see _maxrss): the smallest value getrusage has said, first
# when cpu_method() decided (before the handler loaded anything). The floor is fixed until exec,
# so a later value above the bound is the high-water mark itself.
_floor_at_most = float("inf")
_lock = threading.Lock()
_active: list[MemoryTracker] = []  # trackers inside their block, outermost first


# --- low-level readers (bytes I/O, measured here: 0.7 µs for the reset, 1.2 µs statm, 1 µs
# getrusage, 11 µs status, which the kernel formats afresh on every read) ---


# The /proc files stay open: each tracker reads them two or three times, and open + close
# cost as much as the read. The descriptors belong to the process that opened them
# (/proc/self is resolved at open), so a forked child opens its own.
_fds: dict[tuple[str, int], int] = {}
_fds_pid = os.getpid()


def _fd(path: str, flags: int) -> int:
    global _fds_pid
    if _fds_pid != os.getpid():
        _fds.clear()  # inherited descriptors still point at the parent's /proc entries
        _fds_pid = os.getpid()
    fd = _fds.get((path, flags))
    if fd is None:
        fd = _fds[(path, flags)] = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    return fd


def _read(path: str, size: int = 8192) -> bytes:
    # pread at offset 0 makes the kernel generate the file afresh.
    return os.pread(_fd(path, os.O_RDONLY), size, 0)


def _status_field(status: bytes, name: bytes) -> int:
    start = status.index(name) + len(name)
    end = status.index(b"\n", start)
    return int(status[start:end].split()[0]) * 1024  # reported in kB


def _reset_hwm() -> None:
    os.pwrite(_fd(_CLEAR_REFS, os.O_WRONLY), b"5", 0)


def _hwm_and_rss() -> tuple[int, int]:
    status = _read(_STATUS)
    return _status_field(status, b"VmHWM:"), _status_field(status, b"VmRSS:")


def _maxrss() -> int:
    """``getrusage``'s ``ru_maxrss`` in bytes: the kernel's ``max(floor, VmHWM)``, one syscall
    (about 1 µs, against 11 µs for generating ``/proc/self/status``). The floor is the high-water
    mark of the memory the process had before its ``exec`` (a big parent's, for a child it
    spawned): fixed for the process's life, and unknown, so the value is VmHWM only where it is
    above a known bound of the floor (:func:`_hwm`)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _hwm() -> int:
    """The high-water mark since the last reset: getrusage's value when it is above the floor's
    bound, else (the floor may be what it says) VmHWM from /proc/self/status."""
    global _floor_at_most
    if resource is not None:
        value = _maxrss()
        if value > _floor_at_most:
            return value
        _floor_at_most = value  # every value is at least the floor: a tighter bound
    return _hwm_and_rss()[0]


def rss_bytes() -> int | None:
    """The process's resident set size in bytes, or None where it cannot be read.

    Linux reads ``/proc/self/statm``; other systems use ``psutil`` when it is installed.
    """
    if _LINUX:
        try:
            return int(_read(_STATM, 256).split()[1]) * _PAGE_SIZE
        except (OSError, IndexError, ValueError):
            return None
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.Process().memory_info().rss)


def _vmhwm_works() -> bool:
    if not _LINUX:
        return False
    try:
        _hwm_and_rss()
        _reset_hwm()  # needs write access to clear_refs; resets the process's HWM once
        _hwm()  # learns the floor's bound while the process is small
    except (OSError, ValueError):
        return False
    return True


def cpu_method() -> str:
    """The best CPU method on this machine: ``"vmhwm"``, ``"sampling"`` or ``"unavailable"``.

    Decided once per process (the first call may reset the process's high-water mark).
    """
    global _best_method
    if _best_method is None:
        if _vmhwm_works():
            _best_method = "vmhwm"
        elif rss_bytes() is not None:
            _best_method = "sampling"
        else:
            _best_method = "unavailable"
    return _best_method


class _Sampler(threading.Thread):
    """Polls RSS until stopped and keeps the largest value seen."""

    def __init__(self, interval_s: float, initial: int) -> None:
        super().__init__(name="handlerkit-rss-sampler", daemon=True)
        self.interval_s = interval_s
        self.peak = initial
        self._done = threading.Event()

    def run(self) -> None:
        while True:
            rss = rss_bytes()
            if rss is not None and rss > self.peak:
                self.peak = rss
            if self._done.wait(self.interval_s):
                return

    def finish(self) -> int:
        self._done.set()
        self.join()
        return self.peak


class MemoryTracker:
    """Peak memory while a block runs.

    Example:
        >>> with MemoryTracker() as m:
        ...     buffer = bytearray(50 * 2**20)
        ...     del buffer
        >>> m.method in ("vmhwm", "sampling", "unavailable")
        True

    Args:
        device: the stage's device; CUDA peaks are measured when its type is ``"cuda"`` and
            CUDA is available. ``None`` means CPU.
        enabled: False makes the tracker a no-op (``method == "disabled"``, every number None).
        method: force a CPU method (``"vmhwm"``, ``"sampling"`` or ``"unavailable"``);
            default: the best one here (:func:`cpu_method`).
        interval_s: sampling period of the ``"sampling"`` method.
        end: read the RSS at the end (``cpu_end_bytes``); the peak does not need it, and the
            harness, which tracks every stage, saves the read.

    Attributes:
        method: how the CPU peak was measured, one of :data:`METHODS`.
        cpu_start_bytes / cpu_end_bytes: RSS when the block started / ended.
        cpu_peak_bytes: the largest RSS while it ran.
        cuda_start_bytes / cuda_end_bytes / cuda_peak_bytes: ``torch.cuda.memory_allocated``
            at start / end and ``max_memory_allocated`` over the block; None unless CUDA.

    Raises:
        ValueError: an unknown ``method``, or one this machine cannot provide.
    """

    __slots__ = (
        "_cpu_seen",
        "_cuda",
        "_cuda_seen",
        "_sampler",
        "_track_end",
        "cpu_end_bytes",
        "cpu_peak_bytes",
        "cpu_start_bytes",
        "cuda_end_bytes",
        "cuda_peak_bytes",
        "cuda_start_bytes",
        "device",
        "enabled",
        "interval_s",
        "kind",
        "method",
    )

    def __init__(
        self,
        device: Any = None,
        enabled: bool = True,
        *,
        method: str | None = None,
        interval_s: float = 0.001,
        end: bool = True,
    ) -> None:
        self.device = device
        self.enabled = enabled
        self.interval_s = interval_s
        self.cpu_start_bytes: int | None = None
        self.cpu_peak_bytes: int | None = None
        self.cpu_end_bytes: int | None = None
        self.cuda_start_bytes: int | None = None
        self.cuda_peak_bytes: int | None = None
        self.cuda_end_bytes: int | None = None
        self._sampler: _Sampler | None = None
        self._cpu_seen = 0
        self._cuda_seen = 0
        self._track_end = end
        if not enabled:
            self.kind = "cpu"
            self.method = "disabled"
            self._cuda = False
            return
        self.kind = device_kind(device)
        self._cuda = self.kind == "cuda" and _device.cuda_available()
        if method is None:
            self.method = cpu_method()
        elif method == "vmhwm" and cpu_method() != "vmhwm":
            raise ValueError("method='vmhwm' needs write access to /proc/self/clear_refs (Linux): use 'sampling'")
        elif method == "sampling" and rss_bytes() is None:
            raise ValueError("method='sampling' needs the process RSS: on this system install psutil")
        elif method not in ("vmhwm", "sampling", "unavailable"):
            raise ValueError(f"method must be 'vmhwm', 'sampling' or 'unavailable': got {method!r}")
        else:
            self.method = method

    @property
    def cpu_peak_delta_bytes(self) -> int | None:
        """Peak RSS above the RSS at the start of the block."""
        if self.cpu_peak_bytes is None or self.cpu_start_bytes is None:
            return None
        return self.cpu_peak_bytes - self.cpu_start_bytes

    @property
    def cuda_peak_delta_bytes(self) -> int | None:
        """Peak CUDA allocation above the allocation at the start of the block."""
        if self.cuda_peak_bytes is None or self.cuda_start_bytes is None:
            return None
        return self.cuda_peak_bytes - self.cuda_start_bytes

    def __enter__(self) -> MemoryTracker:
        if not self.enabled:
            return self
        self.cpu_start_bytes = self.cpu_peak_bytes = self.cpu_end_bytes = None
        self.cuda_start_bytes = self.cuda_peak_bytes = self.cuda_end_bytes = None
        with _lock:
            if self._cuda:
                import torch

                # Resetting the peak statistics would erase the peaks enclosing trackers
                # have yet to read: hand them the peak so far first.
                for outer in _active:
                    if outer._cuda:
                        outer._cuda_seen = max(outer._cuda_seen, torch.cuda.max_memory_allocated(outer.device))
                torch.cuda.reset_peak_memory_stats(self.device)
                self.cuda_start_bytes = self._cuda_seen = torch.cuda.memory_allocated(self.device)
            if self.method == "vmhwm":
                if any(outer.method == "vmhwm" for outer in _active):
                    hwm = _hwm()
                    for outer in _active:
                        if outer.method == "vmhwm":
                            outer._cpu_seen = max(outer._cpu_seen, hwm)
                _reset_hwm()
                # Right after the reset the high-water mark equals RSS; statm is the cheaper read.
                self.cpu_start_bytes = start = rss_bytes()
                self._cpu_seen = start or 0
            elif self.method == "sampling":
                start = rss_bytes()
                self.cpu_start_bytes = start
                self._sampler = _Sampler(self.interval_s, start or 0)
                self._sampler.start()
            _active.append(self)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self.enabled:
            return
        with _lock:
            if self.method == "vmhwm":
                hwm = _hwm()  # at least the RSS now: the kernel's mark is max(mark, RSS)
                self.cpu_end_bytes = rss_bytes() if self._track_end else None
                self.cpu_peak_bytes = max(hwm, self._cpu_seen)
            elif self.method == "sampling" and self._sampler is not None:
                end = rss_bytes()
                peak = self._sampler.finish()
                self._sampler = None
                self.cpu_end_bytes = end
                self.cpu_peak_bytes = max(peak, end or 0)
            if self._cuda:
                import torch

                self.cuda_peak_bytes = max(torch.cuda.max_memory_allocated(self.device), self._cuda_seen)
                self.cuda_end_bytes = torch.cuda.memory_allocated(self.device)
            if self in _active:
                _active.remove(self)

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-serialisable data."""
        return {
            "method": self.method,
            "device": self.kind,
            "cpu_start_bytes": self.cpu_start_bytes,
            "cpu_peak_bytes": self.cpu_peak_bytes,
            "cpu_end_bytes": self.cpu_end_bytes,
            "cpu_peak_delta_bytes": self.cpu_peak_delta_bytes,
            "cuda_start_bytes": self.cuda_start_bytes,
            "cuda_peak_bytes": self.cuda_peak_bytes,
            "cuda_end_bytes": self.cuda_end_bytes,
            "cuda_peak_delta_bytes": self.cuda_peak_delta_bytes,
        }

    def __repr__(self) -> str:
        parts = [f"method={self.method!r}"]
        if self.cpu_peak_bytes is not None:
            parts.append(f"cpu_peak={format_bytes(self.cpu_peak_bytes)}")
            parts.append(f"cpu_peak_delta={format_bytes(self.cpu_peak_delta_bytes)}")
        if self.cuda_peak_bytes is not None:
            parts.append(f"cuda_peak={format_bytes(self.cuda_peak_bytes)}")
            parts.append(f"cuda_peak_delta={format_bytes(self.cuda_peak_delta_bytes)}")
        return f"MemoryTracker({', '.join(parts)})"
