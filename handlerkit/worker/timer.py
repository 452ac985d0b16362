"""A cheap, device-aware stopwatch: the one timer every part of handlerkit uses.

A GPU runs work asynchronously: a stage that launches kernels returns before they finish,
so a bare wall clock measures the launch, not the work. :class:`Timer` therefore
synchronises the stage's device before starting and after stopping the clock (CUDA, XPU,
MPS) and, on backends with timing events, also reads the device's own clock. On CPU it is
two ``time.perf_counter_ns()`` calls.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from handlerkit.worker.devices import device_kind, needs_sync, synchronize

__all__ = ["Timer", "percentile"]


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of sorted, non-empty ``ordered``: linear interpolation between
    closest ranks (numpy's default "linear" method), so p90 of ``[1, …, 10]`` is 9.1."""
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _timing_events(kind: str) -> tuple[Any, Any] | None:
    """A (start, end) pair of device timing events, or ``None`` where the backend has none."""
    import torch

    module = {"cuda": torch.cuda, "xpu": getattr(torch, "xpu", None), "mps": getattr(torch, "mps", None)}.get(kind)
    event_cls = getattr(module, "Event", None)
    if event_cls is None:
        return None
    try:
        return event_cls(enable_timing=True), event_cls(enable_timing=True)
    except (RuntimeError, TypeError):  # a backend build without timing events
        return None


class Timer:
    """Time one block of code, synchronising its device around the clock.

    Example:
        >>> with Timer() as t:
        ...     pass
        >>> t.device_ms is None
        True

    On an available CUDA / XPU / MPS device the order is: synchronise, start the wall clock,
    record a start event, run the block, record an end event, synchronise, stop the wall
    clock. ``wall_ms`` then includes the device work, and ``device_ms`` is the events'
    elapsed time (the device's own view, without host overhead before the first launch).
    Where the backend has no timing events, ``device_ms`` is the synchronised wall time.

    A device whose backend is not available (``"cuda"`` on a machine without a GPU) is
    timed like the CPU: no synchronisation, ``synchronized`` is False.

    If the block raises, the clock stops without the closing synchronisation (it could
    raise again and hide the original error): ``wall_ms`` is set, ``device_ms`` is None and
    ``synchronized`` is False. The exception propagates.

    Args:
        device: the stage's device; ``None`` (the default) means CPU.

    Attributes:
        device: the device given.
        kind: its type: ``"cpu"``, ``"cuda"``, ``"xpu"``, ``"mps"``…
        wall_ms: host wall time of the block, in milliseconds (None until it has run).
        device_ms: device time in milliseconds; None on CPU.
        device_or_wall_ms: ``device_ms`` when there is one, else ``wall_ms``.
        synchronized: whether the device was synchronised around the block.
    """

    __slots__ = ("_events", "_sync", "_t0", "device", "device_ms", "kind", "synchronized", "wall_ms")

    def __init__(self, device: Any = None) -> None:
        self.device = device
        self.kind = device_kind(device)
        # Decided once per Timer, so entering and leaving stay at a few calls.
        self._sync = needs_sync(device)
        self._events: tuple[Any, Any] | None = None
        self._t0 = 0
        self.wall_ms: float | None = None
        self.device_ms: float | None = None
        self.synchronized = False

    def start(self) -> Timer:
        """Start timing (what ``with`` does on entry); returns the timer."""
        self.wall_ms = self.device_ms = None
        self.synchronized = False
        if self._sync:
            synchronize(self.kind, self.device)
            self._events = _timing_events(self.kind)
            self._t0 = time.perf_counter_ns()
            if self._events is not None:
                self._events[0].record()
        else:
            self._t0 = time.perf_counter_ns()
        return self

    def stop(self, *, failed: bool = False) -> float:
        """Stop timing and return ``wall_ms``.

        Args:
            failed: the block raised; skip the closing synchronisation.
        """
        if not self._sync:
            self.wall_ms = (time.perf_counter_ns() - self._t0) / 1e6
            return self.wall_ms
        if failed:
            self.wall_ms = (time.perf_counter_ns() - self._t0) / 1e6
            self._events = None
            return self.wall_ms
        events = self._events
        if events is not None:
            events[1].record()
        synchronize(self.kind, self.device)
        self.wall_ms = (time.perf_counter_ns() - self._t0) / 1e6
        self.device_ms = float(events[0].elapsed_time(events[1])) if events is not None else self.wall_ms
        self._events = None
        self.synchronized = True
        return self.wall_ms

    @property
    def device_or_wall_ms(self) -> float | None:
        """The block's time as handlerkit reports it: ``device_ms`` where the device was timed,
        else ``wall_ms`` (CPU, or a block that raised)."""
        return self.device_ms if self.device_ms is not None else self.wall_ms

    def __enter__(self) -> Timer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop(failed=exc_type is not None)

    def __repr__(self) -> str:
        wall = "n/a" if self.wall_ms is None else f"{self.wall_ms:.3f} ms"
        dev = "" if self.device_ms is None else f", device={self.device_ms:.3f} ms"
        return f"Timer({self.kind}: wall={wall}{dev}, synchronized={self.synchronized})"
