"""Timing, memory and records of each stage call, however the stage is reached.

The harness reaches a stage in two ways: a single step (``h.preprocess(batch)``) calls it
directly, and a run calls the handler's ``handle`` as TorchServe's worker does, and the
handler's stage methods report to the run's recorder: the handler's class is swapped for a
subclass of it (same name, module and layout; :func:`spied_class`) whose stage methods call the
class's own and, while a run is going on, tell its recorder. The harness builds a handler from
that subclass, so even an object that grabs ``handler.preprocess`` in ``__init__``
(TorchServe's ``MicroBatching`` hands it to its threads) calls through them. Both ways end in
:meth:`Recorder.call`, which times the call, tracks its peak memory and notes where its
warnings, logs and metrics start and end; :meth:`Recorder.build` turns the calls into
:class:`~handlerkit.results.StageResult` s, one per stage, after the last call (so nothing but
clock reads and list lengths happen between two stages).

A ``handle`` may call a stage several times (micro-batching) and from other threads; each call
is one :class:`Lap`. Memory is tracked on the recording thread only (the peak is the process's).
"""

from __future__ import annotations

import copyreg
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from handlerkit.devices import needs_sync
from handlerkit.errors import HandlerkitError
from handlerkit.memory import MemoryTracker
from handlerkit.results import StageResult
from handlerkit.timer import Timer

__all__ = ["Lap", "Recorder", "SPIED", "own_class", "spied_class", "spy_on", "start", "stop"]

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
        source: the handler, recorded on each StageResult.
    """

    __slots__ = ("capture", "metrics", "device", "sync", "track_memory", "laps", "source", "_owner")

    def __init__(self, capture: Any, metrics: Any, device: Any, track_memory: bool, source: Any = None) -> None:
        self.capture = capture
        self.source = source
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


_SPIED_CLASSES: weakref.WeakKeyDictionary[type, type] = weakref.WeakKeyDictionary()
_RUNNING: dict[int, Recorder] = {}  # id(handler) -> the recorder of the run going on
_MARK = "__handlerkit_spied__"


def _spy(name: str, stage: str, owner: list[type]) -> Callable[..., Any]:
    """A stage method that calls the class's own and, during a run, tells the run's recorder."""

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        method = getattr(super(owner[0], self), name)  # staticmethods, classmethods... bound as usual
        recorder = _RUNNING.get(id(self))
        if recorder is None:
            return method(*args, **kwargs)
        if stage == "describe" or not args:  # no positional input: record the first keyword's value
            value = args[0] if args else next(iter(kwargs.values()), None)
            return recorder.call(stage, lambda _value: method(*args, **kwargs), value)
        return recorder.call(stage, method, *args, **kwargs)

    spy.__name__ = spy.__qualname__ = name
    return spy


def spied_class(cls: type) -> type | None:
    """``cls`` with its stage methods reporting to the run going on (a subclass with the same
    name, module and layout, made once per class); None when ``cls`` cannot be subclassed so."""
    if vars(cls).get(_MARK):
        return cls
    cached = _SPIED_CLASSES.get(cls)
    if cached is not None:
        return cached
    owner: list[type] = []
    namespace: dict[str, Any] = {
        "__slots__": (),
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
        _MARK: True,
        "__reduce_ex__": _reduce_as(cls, owner),
    }
    for name, stage in SPIED:
        if callable(getattr(cls, name, None)):
            namespace[name] = _spy(name, stage, owner)
    try:
        spied = type(cls)(cls.__name__, (cls,), namespace)
    except TypeError:  # a metaclass or __init_subclass__ that will not have it
        return None
    owner.append(spied)
    _SPIED_CLASSES[cls] = spied
    return spied


def _reduce_as(cls: type, owner: list[type]) -> Callable[..., Any]:
    """Copies and pickles of a spied handler are of its own class (pass-through anyway)."""

    def __reduce_ex__(self: Any, protocol: Any) -> Any:
        reduced = super(owner[0], self).__reduce_ex__(protocol)
        if not isinstance(reduced, tuple) or len(reduced) < 2:
            return reduced
        args = tuple(cls if arg is owner[0] else arg for arg in reduced[1])
        if reduced[0] is copyreg.__newobj__:  # pickle insists on the object's own class there
            return (_new_object, args, *reduced[2:])
        return (reduced[0], args, *reduced[2:])

    return __reduce_ex__


def _new_object(cls: type, *args: Any) -> Any:
    """``cls.__new__(cls, *args)``: how a copy or pickle of a spied handler is rebuilt."""
    return cls.__new__(cls, *args)


def spy_on(handler: Any) -> bool:
    """Give an existing handler the spied class of its class; False where that cannot be done
    (then runs report one ``handle`` stage)."""
    cls = type(handler)
    spied = spied_class(cls)
    if spied is None:
        return False
    if spied is not cls:
        try:
            handler.__class__ = spied
        except TypeError:
            return False
    return True


def own_class(handler: Any) -> type:
    """The handler's class as its author wrote it (not the spied subclass)."""
    cls = type(handler)
    return cls.__mro__[1] if vars(cls).get(_MARK) else cls


def start(handler: Any, recorder: Recorder) -> None:
    """Route ``handler``'s stage calls to ``recorder`` until :func:`stop`."""
    key = id(handler)
    if _RUNNING.setdefault(key, recorder) is not recorder:
        raise HandlerkitError(
            f"{type(handler).__name__} is in the middle of another run (another thread or harness "
            "uses the same handler instance)",
            fix="run one batch at a time on a handler instance, or give each harness its own instance",
        )


def stop(handler: Any) -> None:
    _RUNNING.pop(id(handler), None)
