"""A profiler per stage (``Harness.profile``): the top operators of each stage under ``torch.profiler``.

Stages become labelled ranges without touching the recorder's hot path: for the one profiled
run, each stage method the handler has (``preprocess``, ``inference``, ``postprocess``) is
shadowed by an *instance* attribute that calls the method it shadows inside
``record_function("handlerkit::<stage>")``. ``handle`` finds it first (``self.preprocess``
looks in the instance before the class), and the class's method (the recorder's spy) runs
inside the range as usual. The attributes are removed afterwards, also when a stage raises.
The whole run is one more range, ``handlerkit::handle``: a function handler, or a ``handle``
that calls no stage method through ``self``, has only that one.

Each operator event goes to the innermost stage range above it in the profiler's event tree
(``cpu_parent``); an operator on another thread (a pool inside preprocess) goes to the stage
whose range was open when it started, else to ``handle``. Per stage, operators are summed by
name (and input shapes with ``record_shapes``): self and total CPU time, calls and, when the
profile records CUDA, the self device time of the kernels each operator launched (torch
attaches a kernel to the CPU operator that launched it, so a kernel that finishes after its
stage returned still counts for that stage).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from handlerkit._progress import Bar
from handlerkit._render import Rendered, Table
from handlerkit.diagnostics._view import HarnessView
from handlerkit.diagnostics.noise import Conditions
from handlerkit.diagnostics.runs import diagnostic_runs, ensure_initialized
from handlerkit.errors import HandlerkitError
from handlerkit.worker import devices
from handlerkit.worker.contract import HANDLER_STAGES

__all__ = [
    "RANGE_PREFIX",
    "OpStats",
    "ProfileReport",
    "StageTotals",
    "aggregate",
    "profile_stages",
    "profiler_activities",
]

RANGE_PREFIX = "handlerkit::"
"""Prefix of the labelled ranges: ``handlerkit::preprocess`` … ``handlerkit::handle``."""
HANDLE = "handle"
_MISSING = object()


# --- plain results ---------------------------------------------------------------------------


@dataclass(frozen=True)
class OpStats:
    """One operator of one stage, summed over its calls; times in microseconds.

    ``cpu_total_us`` counts an operator nested in another of the same name (and shapes) once.
    ``shapes`` is set with ``record_shapes`` (one entry per input, ``()`` for a scalar or a
    non-tensor argument); ``self_device_us`` when the profile recorded CUDA.
    """

    name: str
    self_cpu_us: float
    cpu_total_us: float
    calls: int
    shapes: tuple[tuple[int, ...], ...] | None = None
    self_device_us: float | None = None


@dataclass(frozen=True)
class StageTotals:
    """A stage's ranges in the profiled run.

    Attributes:
        calls: how many times the stage ran (its ranges).
        cpu_us: host time inside its ranges (for ``handle``: the whole run).
        self_cpu_us: the self CPU time of its operators (for ``handle``: those outside the stages).
        self_device_us: their self device time, when recorded.
        operators: distinct operators (rows) before the top-N cut.
    """

    calls: int
    cpu_us: float
    self_cpu_us: float
    self_device_us: float | None
    operators: int


@dataclass(repr=False)
class ProfileReport(Rendered):
    """The top operators of each stage in one profiled run, as ``Harness.profile`` returns it.

    Renders an overview (one row per stage) and one table per stage, in a terminal and in
    Jupyter. Rows are sorted by self device time when the profile recorded CUDA, else by self
    CPU time.

    Attributes:
        stages: stage → its top operators (:class:`OpStats`), in stage order; ``handle``
            (last) holds what ran outside the stages, or everything when there are none.
        totals: stage → :class:`StageTotals`.
        name: the handler's name.
        batch_size: requests in the profiled batch.
        device: the handler's device.
        activities: what torch.profiler recorded: ``["CPU"]`` or ``["CPU", "CUDA"]``.
        top: operators kept per stage.
        record_shapes: whether input shapes were recorded (and group the rows).
        warmup: unprofiled runs before the profiled one.
        trace: the Chrome/Perfetto trace written, if any.
        notes: facts worth reading next to the numbers (the conditions' among them).
        conditions: what the profiled run was timed under (threads, cores, load).
    """

    stages: dict[str, list[OpStats]]
    totals: dict[str, StageTotals] = field(default_factory=dict)
    name: str = ""
    batch_size: int = 1
    device: str = "cpu"
    activities: list[str] = field(default_factory=lambda: ["CPU"])
    top: int = 10
    record_shapes: bool = False
    warmup: int = 1
    trace: str | None = None
    notes: list[str] = field(default_factory=list)
    conditions: Conditions | None = None

    @property
    def device_time(self) -> bool:
        """Whether device (CUDA) time was recorded."""
        return "CUDA" in self.activities

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-serialisable data."""
        data = asdict(self)
        data["device_time"] = self.device_time
        data["conditions"] = None if self.conditions is None else self.conditions.to_dict()
        return data

    def _summary(self) -> str:
        return (
            f"profile of {self.name}: batch_size={self.batch_size}, device={self.device}, "
            f"activities={'+'.join(self.activities)}, warmup={self.warmup}, top {self.top} operators per stage"
        )

    def _tables(self) -> list[Table]:
        ms = 1e-3
        headers = ["stage", "calls", "CPU ms", "ops self CPU ms"] + (["ops self device ms"] if self.device_time else [])
        overview = []
        split = len(self.totals) > 1  # stages inside handle: its row is the whole run
        for stage, t in self.totals.items():
            label = f"{stage} (whole run)" if stage == HANDLE and split else stage
            row: list[Any] = [label, t.calls, t.cpu_us * ms, t.self_cpu_us * ms]
            if self.device_time:
                row.append(None if t.self_device_us is None else t.self_device_us * ms)
            overview.append(row)
        title = "stages (handle's operators are those outside the stages)" if split else "stages"
        tables = [Table(headers, overview, title=title)]
        op_headers = ["operator", "self CPU µs", "CPU total µs", "calls"]
        op_headers += ["input shapes"] if self.record_shapes else []
        op_headers += ["self device µs"] if self.device_time else []
        for stage, rows in self.stages.items():
            body = []
            for r in rows:
                cells: list[Any] = [r.name, r.self_cpu_us, r.cpu_total_us, r.calls]
                if self.record_shapes:
                    cells.append(format_shapes(r.shapes))
                if self.device_time:
                    cells.append(r.self_device_us)
                body.append(cells)
            total = self.totals.get(stage)
            of = f" of {total.operators}" if total is not None else ""
            where = f"{stage} (outside the stages)" if stage == HANDLE and len(self.totals) > 1 else stage
            tables.append(Table(op_headers, body, title=f"{where}: top {len(rows)}{of} operators"))
        return tables

    def _notes(self) -> list[str]:
        notes = list(self.notes)
        if self.trace is not None:
            notes.append(f"trace written to {self.trace}: open it in https://ui.perfetto.dev or chrome://tracing")
        return notes


def format_shapes(shapes: tuple[tuple[int, ...], ...] | None) -> str:
    """``((1, 3, 224, 224), (), (16, 3, 3, 3))`` → ``"1x3x224x224, 16x3x3x3"`` (scalars and
    non-tensor arguments left out)."""
    if not shapes:
        return ""
    return ", ".join("x".join(str(d) for d in s) for s in shapes if s)


# --- from events to rows -----------------------------------------------------------------------


def _on_cpu(evt: Any) -> bool:
    # Device-side events (kernels) are counted through the CPU operator that launched them.
    return str(getattr(evt, "device_type", "CPU")).rsplit(".", 1)[-1] == "CPU"


def _range_stage(evt: Any) -> str | None:
    name = evt.name
    return name[len(RANGE_PREFIX) :] if name.startswith(RANGE_PREFIX) else None


def _self_device_us(evt: Any) -> float:
    value = getattr(evt, "self_device_time_total", None)
    if value is None:  # torch < 2.4 spelled it for CUDA only
        value = getattr(evt, "self_cuda_time_total", 0.0)
    return float(value or 0.0)


def _contains(evt: Any, t: float) -> bool:
    return evt.time_range.start <= t <= evt.time_range.end


def aggregate(
    events: Iterable[Any], *, top: int, record_shapes: bool = False, device_time: bool = False
) -> tuple[dict[str, list[OpStats]], dict[str, StageTotals]]:
    """Group profiler events by the stage range they ran in and sum each stage's operators.

    ``events`` are torch's ``FunctionEvent`` s (``prof.events()``); only the fields read here
    are needed (``name``, ``cpu_parent``, ``time_range``, ``self_cpu_time_total``,
    ``cpu_time_total``, ``input_shapes``, ``device_type``, ``self_device_time_total``), so a
    test can pass stand-ins. Operators outside every ``handlerkit::`` range are left out.

    Returns:
        ``(stages, totals)``: stage → top ``top`` :class:`OpStats`, and stage → :class:`StageTotals`,
        both in stage order (``preprocess``, ``inference``, ``postprocess``, others, ``handle``).
    """
    cpu = [e for e in events if _on_cpu(e) and not getattr(e, "is_async", False)]
    ranges = [(e, s) for e in cpu if (s := _range_stage(e)) is not None]
    inner = [(e, s) for e, s in ranges if s != HANDLE]
    outer = [e for e, s in ranges if s == HANDLE]

    def key_of(evt: Any) -> tuple[str, Any]:
        shapes = tuple(tuple(s) for s in (evt.input_shapes or ())) if record_shapes else None
        return evt.name, shapes

    def open_at(t: float) -> str | None:
        """The stage whose range (on any thread) was open at ``t``, innermost first."""
        best = None
        for e, s in inner:
            if _contains(e, t) and (best is None or e.time_range.start > best[0].time_range.start):
                best = (e, s)
        if best is not None:
            return best[1]
        return HANDLE if any(_contains(e, t) for e in outer) else None

    sums: dict[str, dict[tuple[str, Any], list[float]]] = {}
    for evt in cpu:
        if _range_stage(evt) is not None:
            continue
        key = key_of(evt)
        stage, repeated, parent = None, False, evt.cpu_parent
        while parent is not None:
            stage = _range_stage(parent)
            if stage is not None:
                break
            repeated = repeated or key_of(parent) == key
            parent = parent.cpu_parent
        if stage is None:
            stage = open_at(evt.time_range.start)
            if stage is None:
                continue
        acc = sums.setdefault(stage, {}).setdefault(key, [0.0, 0.0, 0, 0.0])
        acc[0] += evt.self_cpu_time_total
        acc[1] += 0.0 if repeated else evt.cpu_time_total
        acc[2] += 1
        acc[3] += _self_device_us(evt) if device_time else 0.0

    order = {s: i for i, s in enumerate(HANDLER_STAGES)}
    names = {s for _, s in ranges} | set(sums)
    ordered = sorted(names, key=lambda s: (s == HANDLE, order.get(s, len(order)), s))
    stages: dict[str, list[OpStats]] = {}
    totals: dict[str, StageTotals] = {}
    for stage in ordered:
        rows = [
            OpStats(name, s[0], s[1], int(s[2]), shapes, s[3] if device_time else None)
            for (name, shapes), s in sums.get(stage, {}).items()
        ]
        if device_time:
            rows.sort(key=lambda r: (-(r.self_device_us or 0.0), -r.self_cpu_us, r.name))
        else:
            rows.sort(key=lambda r: (-r.self_cpu_us, r.name))
        spans = [e for e, s in ranges if s == stage]
        totals[stage] = StageTotals(
            calls=len(spans),
            cpu_us=float(sum(e.cpu_time_total for e in spans)),
            self_cpu_us=float(sum(r.self_cpu_us for r in rows)),
            self_device_us=float(sum(r.self_device_us or 0.0 for r in rows)) if device_time else None,
            operators=len(rows),
        )
        if stage != HANDLE or rows or not inner:  # no empty "outside the stages" table
            stages[stage] = rows[:top]
    return stages, totals


# --- the profiled run ----------------------------------------------------------------------------


def profiler_activities(device: Any) -> list[str]:
    """What to record for a handler on ``device``: ``["CPU"]``, plus ``"CUDA"`` when the device
    is a CUDA one and :func:`handlerkit.worker.devices.cuda_available` says CUDA is there."""
    kinds = ["CPU"]
    if devices.device_kind(device) == "cuda" and devices.cuda_available():
        kinds.append("CUDA")
    return kinds


def _labelled(stage: str, target: Callable[..., Any], record_function: Callable[[str], Any]) -> Callable[..., Any]:
    label = RANGE_PREFIX + stage

    def labelled(*args: Any, **kwargs: Any) -> Any:
        with record_function(label):
            return target(*args, **kwargs)

    labelled.__name__ = labelled.__qualname__ = getattr(target, "__name__", stage)
    labelled.__wrapped__ = target  # type: ignore[attr-defined]
    return labelled


@contextlib.contextmanager
def _stage_ranges(handler: Any, record_function: Callable[[str], Any]) -> Iterator[list[str]]:
    """Shadow each stage method of ``handler`` with one that runs it inside its labelled range;
    yields the stages labelled, and leaves the instance's ``__dict__`` as it was afterwards.

    Written to the instance's ``__dict__`` directly (no user ``__setattr__`` runs); a stage the
    class defines as a data descriptor (a property) or a handler without a ``__dict__`` is
    left unlabelled: its operators then count for ``handle``."""
    own: dict[str, Any] | None = None
    if handler is not None:
        with contextlib.suppress(TypeError):
            own = vars(handler)
    installed: dict[str, Any] = {}
    try:
        for stage in HANDLER_STAGES if own is not None else ():
            assert own is not None  # for the type checker: the loop runs only then
            target = getattr(handler, stage, None)
            static = inspect.getattr_static(type(handler), stage, None)
            if not callable(target) or hasattr(type(static), "__set__"):
                continue
            installed[stage] = own.get(stage, _MISSING)
            own[stage] = _labelled(stage, target, record_function)
        yield list(installed)
    finally:
        for stage, previous in installed.items():
            if previous is _MISSING:
                own.pop(stage, None)  # type: ignore[union-attr]
            else:
                own[stage] = previous  # type: ignore[index]


@contextlib.contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """Silence what native code writes to file descriptor 2 around the profiler's start and stop.

    Kineto prints ``profiler_start``/``profiler_stop`` lines there (and, on a CUDA build without
    a GPU, ``gpuGetDeviceCount failed``); Jupyter forwards them into the cell's stderr, where
    nbval compares them. Errors still arrive as Python exceptions. The handler's own run is
    never inside this block."""
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 (pythonw): nothing to silence
        yield
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, 2)
        finally:
            os.close(null)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _trace_path(trace: str | os.PathLike[str] | None) -> str | None:
    if trace is None:
        return None
    path = os.fspath(trace)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise HandlerkitError(
            f"cannot write the trace to {path}: the folder {folder} does not exist",
            fix="create the folder first, or give a path in an existing one",
        )
    return path


def _refuse_a_second_profiler(torch: Any) -> None:
    enabled = getattr(torch.autograd, "_profiler_enabled", None)
    if callable(enabled) and enabled():
        raise HandlerkitError(
            "a torch profiler is already running: h.profile runs its own, and torch cannot run two at once",
            fix="call h.profile outside the other profiler's block",
        )
    if os.environ.get("ENABLE_TORCH_PROFILER"):
        raise HandlerkitError(
            "ENABLE_TORCH_PROFILER is set, so TorchServe's handle (and handlerkit's BaseHandler) would start "
            "a second torch profiler inside h.profile's",
            fix="unset it while profiling: os.environ.pop('ENABLE_TORCH_PROFILER')",
        )


def profile_stages(
    view: HarnessView,
    batch: Any,
    *,
    top: int = 10,
    record_shapes: bool = False,
    trace: str | os.PathLike[str] | None = None,
    progress: bool | None = None,
    warmup: int = 1,
) -> ProfileReport:
    """One run of ``batch`` through ``handle`` under ``torch.profiler``, after ``warmup`` unprofiled runs.

    The runs are :func:`~handlerkit.diagnostics.runs.diagnostic_runs` (initialized first,
    memory tracking off, the harness put back after). A stage that raises
    raises its :class:`~handlerkit.errors.StageError` here too (the handler is left as it
    was), since a profile of a failing run would describe the error path, not the handler.

    Args:
        top: operators kept per stage.
        record_shapes: record input shapes; rows are then per operator *and* shapes.
        trace: a path for a Chrome/Perfetto trace (``prof.export_chrome_trace``).
        progress: a progress bar over the runs (None lets the environment decide).
        warmup: unprofiled runs first, so one-off costs (lazy init, compilation) stay out.

    Raises:
        ValueError: ``top < 1`` or ``warmup < 0``.
        HandlerkitError: a profiler is already running, or the trace's folder does not exist.
    """
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"top must be a positive integer: got {top!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an integer >= 0: got {warmup!r}")
    trace_path = _trace_path(trace)
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    _refuse_a_second_profiler(torch)
    ensure_initialized(view)
    handler = view.handler
    device = getattr(handler, "device", None) if handler is not None else None
    activities = profiler_activities(device)
    conditions = Conditions.measure()  # before the runs: the load the machine had without them
    with Bar(warmup + 1, f"profiling {view.name}", progress) as bar, diagnostic_runs(view), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(warmup):
            view.run(batch)
            bar.update()
        prof = profile(activities=[getattr(ProfilerActivity, a) for a in activities], record_shapes=record_shapes)
        with _stage_ranges(handler, record_function) as labelled:
            with _native_stderr_silenced():
                prof.start()
            try:
                with record_function(RANGE_PREFIX + HANDLE):
                    view.run(batch)
            finally:
                with _native_stderr_silenced():
                    prof.stop()
        bar.update()
        with _native_stderr_silenced():
            events = prof.events()
            if trace_path is not None:
                prof.export_chrome_trace(trace_path)
    stages, totals = aggregate(events, top=top, record_shapes=record_shapes, device_time="CUDA" in activities)
    notes: list[str] = []
    conditions.report(notes)
    if labelled and not any(s in totals for s in labelled):
        notes.append(
            f"handle called none of {', '.join(labelled)} through the handler (a handle of its own, or stage "
            "methods taken before the run, as MicroBatching does): every operator counts for handle"
        )
    elif handler is not None and not labelled and any(callable(getattr(handler, s, None)) for s in HANDLER_STAGES):
        notes.append(
            "the handler's stage methods could not be labelled (no instance __dict__): every operator counts for handle"
        )
    return ProfileReport(
        stages,
        totals,
        name=view.name,
        batch_size=len(batch),
        device=str(device or "cpu"),
        activities=activities,
        top=top,
        record_shapes=record_shapes,
        warmup=warmup,
        trace=trace_path,
        notes=notes,
        conditions=conditions,
    )
