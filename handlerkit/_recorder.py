"""Timing, memory and records of each stage call, however the stage is reached.

The harness reaches a stage in two ways: a single step (``h.preprocess(batch)``) calls it
directly, and a run calls the handler's ``handle`` as TorchServe's worker does, and the
handler's stage methods report to the run's recorder through :class:`Spies`: pass-through
stand-ins put on the instance once, before ``__init__`` runs when the harness builds the
handler, so even an object that grabs ``handler.preprocess`` in ``__init__`` (TorchServe's
``MicroBatching`` hands it to its threads) calls through them. Both ways end in
:meth:`Recorder.call`, which times the call, tracks its peak memory and notes where its
warnings, logs and metrics start and end; :meth:`Recorder.build` turns the calls into
:class:`~handlerkit.results.StageResult` s, one per stage, after the last call (so nothing but
clock reads and list lengths happen between two stages).

A ``handle`` may call a stage several times (micro-batching) and from other threads; each call
is one :class:`Lap`. Memory is tracked on the recording thread only (the peak is the process's).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from handlerkit.devices import needs_sync
from handlerkit.memory import MemoryTracker
from handlerkit.results import StageResult
from handlerkit.timer import Timer

__all__ = ["Lap", "Recorder", "SPIED", "Spies"]

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
            memory = lap.memory = MemoryTracker(device=self.device).__enter__()
        # On CPU two clock reads; an accelerator needs the synchronising Timer.
        timer = Timer(self.device).start() if self.sync else None
        t0 = time.perf_counter_ns()
        try:
            lap.output = func(value, *args, **kwargs)
        except BaseException as exc:
            lap.error = exc
            raise
        finally:
            if timer is None:
                lap.wall_ms = (time.perf_counter_ns() - t0) / 1e6
            else:
                lap.wall_ms = timer.stop(failed=lap.error is not None)
                lap.device_ms = timer.device_ms
            if memory is not None:
                memory.__exit__(None, None, None)
            lap.marks = (w0, l0, m0, len(warnings_seen), len(logs_seen), metrics.mark() if metrics is not None else 0)
        return lap.output

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


_KEY = "_handlerkit_spies"  # where an instance keeps its Spies


class Spies:
    """Pass-through stand-ins for a handler's stage methods, put on the instance once.

    While :attr:`recorder` is None (no run going on) a spy only calls the method; during a
    run it hands the call to the recorder. A spy looks the method up on the instance's class
    at each call, so ``Harness.reload`` (which swaps the class) takes effect; a method the
    instance itself held before is kept and called instead.
    """

    __slots__ = ("recorder", "names")

    def __init__(self, handler: Any) -> None:
        self.recorder: Recorder | None = None
        self.names: list[str] = []
        own = vars(handler)
        for name, stage in SPIED:
            held = own.get(name)
            if held is None and not callable(getattr(type(handler), name, None)):
                continue
            own[name] = self._spy(handler, name, stage, held)
            self.names.append(name)

    def _spy(self, handler: Any, name: str, stage: str, held: Any) -> Callable[..., Any]:
        spies = self

        def method() -> Callable[..., Any]:
            return held if held is not None else getattr(type(handler), name).__get__(handler)

        if stage == "describe":

            def describe_spy(*args: Any, **kwargs: Any) -> Any:
                recorder = spies.recorder
                if recorder is None:
                    return method()(*args, **kwargs)
                return recorder.call(stage, lambda _none: method()(*args, **kwargs), None)

            return describe_spy

        def spy(*args: Any, **kwargs: Any) -> Any:
            recorder = spies.recorder
            if recorder is None or not args:
                return method()(*args, **kwargs)
            return recorder.call(stage, method(), *args, **kwargs)

        spy.__name__ = spy.__qualname__ = name
        return spy

    @staticmethod
    def install(handler: Any) -> Spies | None:
        """Spies on ``handler`` (None for an object without an instance dict); a handler that
        already has them (another harness on the same instance) keeps and shares them."""
        own = getattr(handler, "__dict__", None)
        if own is None:
            return None
        spies = own.get(_KEY)
        if not isinstance(spies, Spies):
            spies = own[_KEY] = Spies(handler)
        return spies
