"""Timing, memory and records of each stage call, however the stage is reached.

The harness reaches a stage in two ways: a single step (``h.preprocess(batch)``) calls it
directly, and a run calls the handler's ``handle`` as TorchServe's worker does, and the
handler's stage methods report to the run's recorder (:mod:`handlerkit.recording.spy`). Both
ways end in :meth:`Recorder.call`, which times the call, tracks its peak memory and notes where
its warnings, logs and metrics start and end; :meth:`Recorder.build` turns the calls into
:class:`~handlerkit.recording.results.StageResult` s, one per stage, after the last call (so nothing but
clock reads and list lengths happen between two stages).

A ``handle`` may call a stage several times (micro-batching) and from other threads; each call
is one :class:`Lap`. Memory is tracked on the recording thread only (the peak is the process's).
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from handlerkit.recording.results import StageResult
from handlerkit.recording.spy import takes_context
from handlerkit.worker.devices import needs_sync
from handlerkit.worker.memory import MemoryTracker
from handlerkit.worker.timer import Timer

__all__ = ["Lap", "Recorder"]


class Lap:
    """One call of one stage."""

    __slots__ = ("device_ms", "error", "input", "marks", "memory", "output", "stage", "wall_ms")

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
        capture: the open :class:`~handlerkit.recording.capture.Capture` (its lists are sliced per call).
        metrics: the context's metrics store when it can ``mark()``/``since()``, else None.
        device: the handler's device (a synchronising timer on accelerators).
        track_memory: track each call's peak memory.
        source: the handler, recorded on each StageResult.
        sync: whether ``device`` needs a synchronising timer, when the caller knows already
            (:func:`~handlerkit.worker.devices.needs_sync` otherwise).
    """

    __slots__ = ("_owner", "capture", "device", "laps", "metrics", "source", "sync", "track_memory")

    def __init__(
        self, capture: Any, metrics: Any, device: Any, track_memory: bool, source: Any = None, sync: bool | None = None
    ) -> None:
        self.capture = capture
        self.source = source
        self.metrics = metrics
        self.device = device
        self.sync = (device is not None and needs_sync(device)) if sync is None else sync
        self.track_memory = track_memory
        self.laps: list[Lap] = []
        self._owner = threading.get_ident()

    def call(self, stage: str, func: Callable[..., Any], value: Any, *args: Any, **kwargs: Any) -> Any:
        """``func(value, *args, **kwargs)`` as one call of ``stage``; re-raises what it raises.

        A stage that is a coroutine function (an async handler's, as TorchServe's
        ``vllm_handler.py`` awaits them) returns a coroutine: the call then returns one that
        awaits it, and the lap records what the await gives (or raises) and how long it took,
        with the warnings, logs and metrics of that time."""
        lap = Lap(stage, value)
        self.laps.append(lap)
        if self.track_memory or self.sync:
            started = self._begin(lap)
        else:  # _begin's CPU path, inlined: this runs for every stage of every run
            capture, metrics = self.capture, self.metrics
            m0 = metrics.mark() if metrics is not None else 0
            started = len(capture.warnings), len(capture.logs), m0, None, time.perf_counter_ns()
        try:
            lap.output = output = func(value, *args, **kwargs)
        except BaseException as exc:
            lap.error = exc
            raise
        finally:
            self._end(lap, started)
        if inspect.iscoroutine(output):
            lap.output = self._awaited(lap, output)
            lap.output.__qualname__ = output.__qualname__  # what an "unawaited" message names
        return lap.output

    def step(self, stage: str, func: Callable[..., Any], value: Any, service: Any) -> Any:
        """:meth:`call` of a stage stepped by hand (``h.preprocess(batch)``) on ``service``'s handler.

        A stage that asks for the context too (TorchServe's ``vllm_handler.py``:
        ``preprocess(self, requests, context)``) gets ``service.context``, as its ``handle``
        passes it; a coroutine stage is awaited at once on ``service.worker_loop``, where an
        async handler's engine lives, so the step gives what ``handle`` would have awaited."""
        output = self.call(stage, func, value, *((service.context,) if takes_context(func) else ()))
        return service.worker_loop.run(output) if inspect.iscoroutine(output) else output

    async def _awaited(self, lap: Lap, coroutine: Coroutine[Any, Any, Any]) -> Any:
        started = self._begin(lap)  # the body runs on await: the lap's time and records are the await's
        try:
            lap.output = await coroutine
        except BaseException as exc:
            lap.error = exc
            raise
        finally:
            self._end(lap, started)
        return lap.output

    def _begin(self, lap: Lap) -> tuple[int, int, int, Timer | None, int]:
        """Where the records stand and the clocks read as a call begins (see :meth:`_end`)."""
        warnings_seen, logs_seen, metrics = self.capture.warnings, self.capture.logs, self.metrics
        w0, l0, m0 = len(warnings_seen), len(logs_seen), metrics.mark() if metrics is not None else 0
        if self.track_memory and threading.get_ident() == self._owner:
            lap.memory = MemoryTracker(device=self.device, end=False).__enter__()
        # On CPU two clock reads; an accelerator needs the synchronising Timer.
        timer = Timer(self.device).start() if self.sync else None
        return w0, l0, m0, timer, time.perf_counter_ns()

    def _end(self, lap: Lap, started: tuple[int, int, int, Timer | None, int]) -> None:
        w0, l0, m0, timer, t0 = started
        if timer is None:
            lap.wall_ms = (time.perf_counter_ns() - t0) / 1e6
        else:
            lap.wall_ms = timer.stop(failed=lap.error is not None)
            lap.device_ms = timer.device_ms
        if lap.memory is not None:
            lap.memory.__exit__(None, None, None)
        metrics = self.metrics
        lap.marks = (
            w0,
            l0,
            m0,
            len(self.capture.warnings),
            len(self.capture.logs),
            metrics.mark() if metrics is not None else 0,
        )

    def build(self, results: dict[str, StageResult]) -> list[StageResult]:
        """One StageResult per stage called, in first-call order, stored into ``results``."""
        grouped: dict[str, list[Lap]] = {}
        for lap in self.laps:
            grouped.setdefault(lap.stage, []).append(lap)
        warnings_seen, logs_seen, metrics = self.capture.warnings, self.capture.logs, self.metrics
        built = []
        for stage, laps in grouped.items():
            if len(laps) == 1:  # the usual case, kept to a few operations: it runs for every stage
                lap = laps[0]
                w0, l0, m0, w1, l1, m1 = lap.marks
                result = StageResult(
                    stage,
                    lap.input,
                    lap.output,
                    lap.wall_ms,
                    lap.device_ms,
                    logs=logs_seen[l0:l1],
                    warnings=warnings_seen[w0:w1],
                    metrics=metrics.since(m0, m1) if metrics is not None else [],
                    source=self.source,
                )
                tracked = [lap.memory] if lap.memory is not None else []
            else:
                first = laps[0]
                result = StageResult(
                    stage,
                    [lap.input for lap in laps],
                    [lap.output for lap in laps],
                    sum(lap.wall_ms for lap in laps),
                    None if first.device_ms is None else sum(lap.device_ms or 0.0 for lap in laps),
                    calls=len(laps),
                    source=self.source,
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

    def mark(self) -> tuple[int, int, int]:
        """Where the capture's warnings and logs and the metrics stand now (see :meth:`whole`)."""
        metrics = self.metrics
        return len(self.capture.warnings), len(self.capture.logs), metrics.mark() if metrics is not None else 0

    def whole(self, data: Any, output: Any, wall_ms: float, marks: tuple[int, int, int]) -> StageResult:
        """The single ``handle`` stage of a run in which handle called no stage method: all
        recorded since ``marks`` (:meth:`mark`)."""
        metrics = self.metrics
        return StageResult(
            "handle",
            data,
            output,
            wall_ms,
            warnings=self.capture.warnings[marks[0] :],
            logs=self.capture.logs[marks[1] :],
            metrics=metrics.since(marks[2]) if metrics is not None else [],
            source=self.source,
        )

    def failed(self, exc: BaseException) -> Lap | None:
        """The call that raised ``exc``, or else the one that raised what ``exc`` was raised
        from (its cause or context, nearest first), if a stage did."""
        seen: set[int] = set()
        current: BaseException | None = exc
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            for lap in reversed(self.laps):
                if lap.error is current:
                    return lap
            current = current.__cause__ or current.__context__
        return None


def _peak(values: Any) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None
