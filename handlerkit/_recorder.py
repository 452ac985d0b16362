"""Timing, memory and records of each stage call, however the stage is reached.

The harness reaches a stage in two ways: a single step (``h.preprocess(batch)``) calls it
directly, and a run calls the handler's ``handle`` as TorchServe's worker does, with the
handler's stage methods replaced, for the length of the call, by spies on the instance. Both
go through :meth:`Recorder.call`, which times the call, tracks its peak memory and notes where
its warnings, logs and metrics start and end; :meth:`Recorder.build` turns the calls into
:class:`~handlerkit.results.StageResult` s, one per stage, after the last call (so nothing but
clock reads and list lengths happen between two stages).

A ``handle`` may call a stage several times (micro-batching) and from other threads; each call
is one :class:`Lap`. Memory is tracked on the recording thread only (the peak is the process's).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from handlerkit.devices import needs_sync
from handlerkit.memory import MemoryTracker
from handlerkit.results import StageResult
from handlerkit.timer import Timer

__all__ = ["Lap", "Recorder", "SPIED"]

#: Handler methods a run watches, and the stage each one is.
SPIED = (
    ("preprocess", "preprocess"),
    ("inference", "inference"),
    ("postprocess", "postprocess"),
    ("explain_handle", "explain"),
    ("describe_handle", "describe"),
)


class Lap:
    """One call of one stage."""

    __slots__ = ("stage", "input", "output", "wall_ms", "device_ms", "memory", "marks", "error")

    def __init__(self, stage: str, value: Any) -> None:
        self.stage = stage
        self.input = value
        self.output: Any = None
        self.wall_ms = 0.0
        self.device_ms: float | None = None
        self.memory: MemoryTracker | None = None
        self.marks: tuple[int, int, int, int, int, int] = (0, 0, 0, 0, 0, 0)
        self.error: BaseException | None = None


class Recorder:
    """Records stage calls while a capture is open.

    Args:
        capture: the open :class:`~handlerkit._capture.Capture` (its lists are sliced per call).
        metrics: the context's metrics store when it can ``mark()``/``since()``, else None.
        device: the handler's device (a synchronising timer on accelerators).
        track_memory: track each call's peak memory.
    """

    __slots__ = ("capture", "metrics", "device", "sync", "track_memory", "laps", "_owner")

    def __init__(self, capture: Any, metrics: Any, device: Any, track_memory: bool) -> None:
        self.capture = capture
        self.metrics = metrics
        self.device = device
        self.sync = device is not None and needs_sync(device)
        self.track_memory = track_memory
        self.laps: list[Lap] = []
        self._owner = threading.get_ident()

    def call(self, stage: str, func: Callable[..., Any], value: Any, *args: Any, **kwargs: Any) -> Any:
        """``func(value, *args, **kwargs)`` as one call of ``stage``; re-raises what it raises."""
        lap = Lap(stage, value)
        self.laps.append(lap)
        warnings_seen, logs_seen, metrics = self.capture.warnings, self.capture.logs, self.metrics
        w0, l0, m0 = len(warnings_seen), len(logs_seen), metrics.mark() if metrics is not None else 0
        memory = None
        if self.track_memory and threading.get_ident() == self._owner:
            memory = MemoryTracker(device=self.device).__enter__()
        try:
            if not self.sync:
                t0 = time.perf_counter_ns()
                try:
                    lap.output = func(value, *args, **kwargs)
                except BaseException as exc:
                    lap.error = exc
                    raise
                finally:
                    lap.wall_ms = (time.perf_counter_ns() - t0) / 1e6
            else:
                timer = Timer(self.device).start()
                try:
                    lap.output = func(value, *args, **kwargs)
                except BaseException as exc:
                    lap.error = exc
                    raise
                finally:
                    lap.wall_ms = timer.stop(failed=lap.error is not None)
                    lap.device_ms = timer.device_ms
        finally:
            if memory is not None:
                memory.__exit__(None, None, None)
                lap.memory = memory
            lap.marks = (w0, l0, m0, len(warnings_seen), len(logs_seen), metrics.mark() if metrics is not None else 0)
        return lap.output

    @contextmanager
    def spying(self, handler: Any) -> Iterator[None]:
        """Route the handler's stage methods through :meth:`call` while the block runs.

        The spies are instance attributes (an attribute the instance already had is wrapped
        and put back), so ``handle`` — TorchServe's, a subclass's, or one set on the instance —
        runs unchanged and calls them as it always would.
        """
        if handler is None:
            yield
            return
        own = vars(handler) if hasattr(handler, "__dict__") else None
        if own is None:
            yield
            return
        saved: list[tuple[str, Any, bool]] = []
        for name, stage in SPIED:
            method = getattr(handler, name, None)
            if not callable(method):
                continue
            saved.append((name, own.get(name), name in own))
            own[name] = self._spy(stage, method)
        try:
            yield
        finally:
            for name, previous, had in saved:
                if had:
                    own[name] = previous
                else:
                    own.pop(name, None)

    def _spy(self, stage: str, method: Callable[..., Any]) -> Callable[..., Any]:
        call = self.call
        if stage == "describe":

            def describe_spy(*args: Any, **kwargs: Any) -> Any:
                return call(stage, lambda _none: method(*args, **kwargs), None)

            return describe_spy

        def spy(value: Any = None, *args: Any, **kwargs: Any) -> Any:
            return call(stage, method, value, *args, **kwargs)

        return spy

    def build(self, results: dict[str, StageResult]) -> list[StageResult]:
        """One StageResult per stage called, in first-call order, stored into ``results``."""
        grouped: dict[str, list[Lap]] = {}
        for lap in self.laps:
            grouped.setdefault(lap.stage, []).append(lap)
        warnings_seen, logs_seen, metrics = self.capture.warnings, self.capture.logs, self.metrics
        built = []
        for stage, laps in grouped.items():
            first = laps[0]
            if len(laps) == 1:
                result = StageResult(stage, first.input, first.output, first.wall_ms, first.device_ms)
            else:
                result = StageResult(
                    stage,
                    [lap.input for lap in laps],
                    [lap.output for lap in laps],
                    sum(lap.wall_ms for lap in laps),
                    None if first.device_ms is None else sum(lap.device_ms or 0.0 for lap in laps),
                    calls=len(laps),
                )
            for lap in laps:
                w0, l0, m0, w1, l1, m1 = lap.marks
                result.warnings.extend(warnings_seen[w0:w1])
                result.logs.extend(logs_seen[l0:l1])
                if metrics is not None:
                    result.metrics.extend(metrics.since(m0, m1))
            tracked = [lap.memory for lap in laps if lap.memory is not None]
            if tracked:
                result.cpu_peak_bytes = _peak(m.cpu_peak_bytes for m in tracked)
                result.cpu_peak_delta_bytes = _peak(m.cpu_peak_delta_bytes for m in tracked)
                result.cuda_peak_bytes = _peak(m.cuda_peak_bytes for m in tracked)
            results[stage] = result
            built.append(result)
        return built

    def failed(self, exc: BaseException) -> Lap | None:
        """The call that raised ``exc`` (or the exception it was raised from), if a stage did."""
        chain = set()
        current: BaseException | None = exc
        while current is not None and id(current) not in chain:
            chain.add(id(current))
            current = current.__cause__ or current.__context__
        for lap in reversed(self.laps):
            if lap.error is not None and id(lap.error) in chain:
                return lap
        return None


def _peak(values: Any) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None
