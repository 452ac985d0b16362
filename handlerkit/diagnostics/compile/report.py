"""``Harness.compile_report``: did ``torch.compile`` apply, what it cost, where it breaks, when it recompiles.

One report, read from torch's structured records rather than its log text
(:mod:`handlerkit.diagnostics.compile.dynamo_events`):

1. the ``pt2`` settings in force (any schema) and whether compilation really applied, or why not;
2. the first call, which *is* the handler's first compiled call (a model is never compiled a
   second time to be reported on): its time, and the compile inside it split into Dynamo and
   the backend (Inductor's share too). A model that ran before the report has no compile left
   to watch: the report says the cost was not observed;
3. the graphs, the graph breaks deduplicated (reason, the user's file, line and source text,
   hint, graph-break code and its page) and the recompiles with their reasons, and which input
   dimensions are dynamic;
4. the steady-state median of the compiled model against the eager one (``_orig_mod``, swapped
   in for the timing and put back whatever happens) on the same batch, with its noise and
   conditions (:mod:`.noise`): a compiled model slower beyond that noise is a problem;
5. with ``batch_sizes``, the deploy-time recompile gate (:mod:`.gate`).

The report leaves torch as it found it: it never calls ``torch._dynamo.reset()`` or
``explain`` (both wipe every compiled cache), changes no ``torch._dynamo.config`` or logging
setting, and puts Dynamo's counters back after its extra runs. A compile that fails inside the
first call leaves the handler on its eager model, with the failure in the report.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from handlerkit._progress import Bar
from handlerkit._render import Rendered, Table
from handlerkit._stack import user_stacklevel
from handlerkit._text import format_number
from handlerkit.diagnostics._view import HarnessView, model_handler
from handlerkit.diagnostics.compile import facts
from handlerkit.diagnostics.compile.dynamo_events import (
    CompiledFrame,
    CountersKept,
    DynamoEvents,
    GraphBreak,
    Recompile,
    graph_breaks,
    recompiles,
    where,
)
from handlerkit.diagnostics.compile.facts import FELL_BACK, failure_fix, first_call_facts, read_settings, stage_ms
from handlerkit.diagnostics.compile.gate import GateResult, eager_model, gate_notes, gate_problems, run_gate
from handlerkit.diagnostics.compile.specialisations import Specialisation, specialisations
from handlerkit.diagnostics.noise import Conditions, Fastest, fastest
from handlerkit.diagnostics.runs import diagnostic_runs, ensure_initialized
from handlerkit.diagnostics.timing import TimingStats, summarize
from handlerkit.errors import HandlerkitError, HandlerkitWarning, StageError
from handlerkit.worker.contract import Problem

__all__ = ["CompileReport", "CompiledFrame", "GateResult", "GraphBreak", "Recompile", "compile_report"]

_LEGACY = " (legacy: write pt2: {compile: {enable: true, ...}})"


@dataclass(repr=False)
class CompileReport(Rendered):
    """What ``torch.compile`` did to a handler's model (``Harness.compile_report``).

    Attributes:
        handler / model / model_format: what was reported on (``model`` is the eager class).
        pt2_schema: ``"compile"``, ``"legacy-str"``, ``"legacy-dict"``, ``"export"`` or ``"none"``.
        pt2_settings: the ``torch.compile`` keyword arguments in force.
        requested / applied: whether the config asked for compilation, and whether the model
            really runs compiled after the first call.
        reason: why it is (or is not) compiled; ``error``: the compile error, if any.
        backend: the backend in force (torch's default is ``"inductor"``).
        batch_size: requests in the reported batch.
        first_call_ms: the first call of the model's stage (``timed_stage``), compile included.
        compile_observed: the first call compiled something (False when the compiled code was
            cached already: the model ran before the report).
        compile_s / dynamo_s / backend_s / inductor_s: the first call's compile time, split
            into Dynamo's own and the backend's (Inductor's share of it when Inductor ran).
        cold_compile_s / cache_load_s: the same compile split by graph: compiled cold, or
            loaded from Inductor's FX graph cache (each frame's cache states are in ``frames``).
        shipped_cache: what became of the model dir's shipped compile cache (``compile-cache.bin``,
            :class:`handlerkit.formats.compile_cache.CacheLoad` as a dict); None when it ships none.
        frames: every frame compiled during the report (:class:`CompiledFrame`).
        graph_breaks: deduplicated (:class:`GraphBreak`).
        recompiles: frames compiled again, with the failed guard (:class:`Recompile`).
        specialisations: dynamic dimensions pinned to one size, with the guard and the user's
            file:line that pinned them (:class:`Specialisation`).
        dynamic_inputs: input dimensions that are dynamic, and who made them so.
        timed_stage: ``"inference"``, or ``"handle"`` for a handler that runs no stages.
        steady_compiled / steady_eager: milliseconds of ``timed_stage`` per call, after warm-up
            (the inference stage is called alone on the first run's input).
        conditions: what the steady calls were timed under (threads, cores, load).
        gate: the recompile gate's verdict per batch size (empty unless ``batch_sizes`` given).
        problems: what needs fixing, each with its fix.
        notes: facts worth knowing next to the numbers.
    """

    handler: str
    model: str = ""
    model_format: str | None = None
    pt2_schema: str = "none"
    pt2_settings: dict[str, Any] = field(default_factory=dict)
    requested: bool = False
    applied: bool = False
    reason: str = ""
    error: str | None = None
    backend: str | None = None
    batch_size: int = 0
    first_call_ms: float | None = None
    compile_observed: bool = False
    compile_s: float | None = None
    dynamo_s: float | None = None
    backend_s: float | None = None
    inductor_s: float | None = None
    cold_compile_s: float | None = None
    cache_load_s: float | None = None
    shipped_cache: dict[str, Any] | None = None
    frames: list[CompiledFrame] = field(default_factory=list)
    graph_breaks: list[GraphBreak] = field(default_factory=list)
    recompiles: list[Recompile] = field(default_factory=list)
    specialisations: list[Specialisation] = field(default_factory=list)
    dynamic_inputs: list[str] = field(default_factory=list)
    timed_stage: str = "inference"
    steady_compiled: TimingStats | None = None
    steady_eager: TimingStats | None = None
    conditions: Conditions | None = None
    gate: list[GateResult] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No compile error, no error among the problems, and no batch size of the gate that
        recompiles: what ``handlerkit compile`` exits 0 on."""
        return (
            self.gate_ok is not False and self.error is None and not any(p.severity == "error" for p in self.problems)
        )

    @property
    def graphs(self) -> list[CompiledFrame]:
        """The compiled frames that captured an FX graph."""
        return [f for f in self.frames if f.graph_ops is not None]

    @property
    def speedup(self) -> float | None:
        """Eager median over compiled median (> 1: compiled is faster)."""
        if self.steady_compiled is None or self.steady_eager is None or self.steady_compiled.median <= 0:
            return None
        return self.steady_eager.median / self.steady_compiled.median

    @property
    def faster(self) -> Fastest | None:
        """Compiled or eager, whichever is faster beyond the steady calls' noise (both timed)."""
        if self.steady_compiled is None or self.steady_eager is None:
            return None
        return fastest({"compiled": self.steady_compiled, "eager": self.steady_eager})

    @property
    def recompiling_sizes(self) -> list[int]:
        return [g.batch_size for g in self.gate if g.recompiles]

    @property
    def gate_ok(self) -> bool | None:
        """True when no gated size recompiles or fails; None when the gate did not run."""
        if not self.gate:
            return None
        return all(g.outcome == "no recompile" for g in self.gate)

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-serialisable data (front ends and notebooks read this); ``graph_caches``
        lists each graph's cache outcomes, next to ``cold_compile_s`` / ``cache_load_s``."""
        faster, conditions = self.faster, self.conditions
        extra = {"speedup": self.speedup, "gate_ok": self.gate_ok, "graph_caches": facts.graph_caches(self.graphs)}
        timed = {"faster": faster and faster.to_dict(), "conditions": conditions and conditions.to_dict()}
        return {**asdict(self), **extra, **timed}

    # -- rendering --------------------------------------------------------------------------
    def _summary(self) -> str:
        head = f"compile report of {self.handler}"
        if not self.applied:
            return f"{head}: not compiled ({self.reason})" if self.reason else f"{head}: not compiled"
        parts = [f"compiled with {self.backend or 'inductor'}"]
        if self.first_call_ms is not None:
            split = ""
            if self.compile_observed and self.compile_s is not None:
                split = f" (compile {format_number(self.compile_s)} s"
                if self.dynamo_s is not None and self.backend_s is not None:
                    split += f": Dynamo {format_number(self.dynamo_s)} s, backend {format_number(self.backend_s)} s"
                split += ")"
            parts.append(f"first call {format_number(self.first_call_ms)} ms{split}")
        parts.append(
            f"{len(self.graphs)} graph(s), {len(self.graph_breaks)} graph break(s), {len(self.recompiles)} recompile(s)"
        )
        if self.speedup is not None and (faster := self.faster) is not None:
            said = {None: " (within noise)", "eager": " (slower: see the problems)"}.get(faster.best, "")
            parts.append(f"speedup {self.speedup:.2f}x over eager{said}")
        if self.gate:
            sizes = self.recompiling_sizes
            parts.append(f"gate: batch {', '.join(map(str, sizes))} recompile" if sizes else "gate: no recompile")
        return f"{head}: " + "; ".join(parts)

    def _tables(self) -> list[Table]:
        settings = [
            ["model", self.model + (f" ({self.model_format} model)" if self.model_format else "")],
            ["pt2 schema", self.pt2_schema + (_LEGACY if self.pt2_schema.startswith("legacy") else "")],
            ["torch.compile settings", ", ".join(f"{k}={v!r}" for k, v in self.pt2_settings.items()) or "-"],
            ["requested / applied", f"{self.requested} / {self.applied}"],
            ["why", self.reason],
        ]
        if self.error:
            settings.append(["error", self.error])
        if self.dynamic_inputs:
            settings.append(["dynamic inputs", "; ".join(self.dynamic_inputs)])
        if self.shipped_cache is not None:
            settings.append(["shipped compile cache", self.shipped_cache.get("reason", "")])
        cost: list[list[Any]] = []
        if self.first_call_ms is not None:
            cost.append(["first call ms", self.first_call_ms])
        if self.compile_observed:
            cost += [["compile s", self.compile_s], ["Dynamo s", self.dynamo_s], ["backend s", self.backend_s]]
            if self.inductor_s is not None:
                cost.append(["of which Inductor s", self.inductor_s])
            if self.cold_compile_s is not None:
                cost.append(["graphs compiled cold s", self.cold_compile_s])
            if self.cache_load_s is not None:
                cost.append(["graphs loaded from the FX graph cache s", self.cache_load_s])
        steady = [
            [name, s.n, s.median, f"{s.p25:.3g}-{s.p75:.3g}", s.p90]
            for name, s in (("compiled", self.steady_compiled), ("eager", self.steady_eager))
            if s is not None
        ]
        if self.speedup is not None:
            steady.append(["speedup (eager / compiled)", "", self.speedup, "", ""])
        return [
            Table(("", ""), settings, "pt2"),
            Table(("", ""), cost, "first call"),
            Table(
                ("", "n", "median ms", "p25-p75 ms", "p90 ms"),
                steady,
                f"steady state ({self.timed_stage}, batch {self.batch_size})",
            ),
            Table(
                (
                    "compile id",
                    "function",
                    "defined at",
                    "graph ops",
                    "compile s",
                    "FX graph cache",
                    "AOTAutograd cache",
                ),
                [
                    [
                        f.compile_id,
                        f.function,
                        where(f.file, f.line),
                        f.graph_ops,
                        f.compile_s,
                        f.fx_graph_cache,
                        f.aot_autograd_cache,
                    ]
                    for f in self.frames
                ],
                "compiled frames",
            ),
            Table(
                ("reason", "at", "source", "hint", "code", "docs", "seen"),
                [[b.reason, b.where, b.source, b.hint, b.code, b.doc_url, b.count] for b in self.graph_breaks],
                "graph breaks",
                wrap=_WRAP_MANY,
            ),
            Table(
                ("compile id", "function", "reason"),
                [[r.compile_id, r.function, r.reason] for r in self.recompiles],
                "recompiles",
                wrap=_WRAP,
            ),
            Table(
                ("dimension", "pinned to", "guard", "at", "code"),
                [[p.dimension, p.value, p.guard, p.where, p.code] for p in self.specialisations],
                "specialisations",
                wrap=_WRAP,
            ),
            Table(
                ("batch size", "outcome", "guard / error", "fix"),
                [[g.batch_size, g.outcome, g.reason, g.fix] for g in self.gate],
                "recompile gate",
                wrap=_WRAP,
            ),
            Table(
                ("severity", "check", "problem", "fix"),
                [[p.severity, p.check, p.message, p.fix] for p in self.problems],
                "problems",
                wrap=_WRAP,
            ),
        ]

    def _notes(self) -> list[str]:
        return list(self.notes)


# Guards, reasons and fixes run to hundreds of characters: their tables wrap them in plain text
# (the graph-break table has seven columns, so narrower).
_WRAP, _WRAP_MANY = 60, 36


# ---------------------------------------------------------------------------- running
def compile_report(
    view: HarnessView,
    batch: Any,
    *,
    batch_sizes: Sequence[int] | None = None,
    progress: bool | None = None,
    repeat: int = 10,
    warmup: int = 1,
) -> CompileReport:
    """Report on the handler's compiled model with ``batch`` (see the module docstring).

    Args:
        batch_sizes: replay the batch at these sizes under ``fail_on_recompile`` (the gate).
        progress: a progress bar (None: when someone is watching, see :mod:`handlerkit._progress`).
        repeat / warmup: steady-state calls timed, and discarded before, for each of the
            compiled and the eager model.

    Raises:
        HandlerkitError: a function handler, or a handler without ``model``.
        StageError: the batch fails, compiled and eager alike (the handler's own bug).
        ValueError: bad ``batch_sizes``, ``repeat`` or ``warmup``.
    """
    sizes = _sizes(batch_sizes)
    if repeat < 1 or warmup < 0:
        raise ValueError(f"repeat must be >= 1 and warmup >= 0: got repeat={repeat}, warmup={warmup}")
    handler = model_handler(view, "compile_report")
    report = CompileReport(handler=view.name, batch_size=len(batch))
    first = DynamoEvents()
    with first:
        ensure_initialized(view)  # a handler may warm up (and so compile) in initialize
    compiled_at_start = eager_model(_model(view, handler)) is not None
    read_settings(report, view, handler)
    counters = CountersKept()
    try:
        with diagnostic_runs(view), Bar(3 + len(sizes), "compile report: first call", progress) as bar:
            with first:
                run = _first_call(view, handler, batch, report)
            counters.keep()  # the first call's compile counts, as it would without the report
            bar.update()
            first_call_facts(report, run, first, handler, compiled_at_start)
            report.graph_breaks = graph_breaks(first.breaks)
            report.specialisations = specialisations(first.specialised)
            if not report.applied:
                if sizes:
                    report.notes.append("the model is not compiled: the recompile gate has nothing to check")
                return report
            report.conditions = Conditions.measure()  # before the steady calls: the load without them
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                later = _steady(report, view, batch, run, warmup, repeat, bar)
                report.graph_breaks = graph_breaks(first.breaks + later.breaks)
                report.specialisations = specialisations(first.specialised + later.specialised)
                report.problems.extend(facts.slower_than_eager(report, later))
                if sizes:
                    report.gate, stance = run_gate(view, batch, sizes, bar)
                    report.problems.extend(gate_problems(report.gate))
                    gate_notes(report, stance)
            report.conditions.report(report.notes)
    finally:
        counters.restore()
    if report.graph_breaks:
        report.notes.append(
            f"{len(report.graph_breaks)} graph break(s): the model runs as {max(len(report.graphs), 1)} graph(s) "
            "with Python in between; each hint says how to remove its break"
        )
    return report


def _sizes(batch_sizes: Sequence[int] | None) -> list[int]:
    if batch_sizes is None:
        return []
    sizes = list(batch_sizes)
    if not sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
        raise ValueError(f"batch_sizes must be positive integers, got {sizes}")
    return sizes


def _model(view: HarnessView, handler: Any) -> Any:
    model = getattr(handler, "model", None)
    if model is None:
        state = "missing" if not hasattr(handler, "model") else "None"
        raise HandlerkitError(
            f"{view.name} has no model after initialize (handler.model is {state}): compile_report looks "
            "for it there, where TorchServe's BaseHandler keeps it",
            fix="load the model in initialize and keep it in self.model",
        )
    return model


def _first_call(view: HarnessView, handler: Any, batch: Any, report: CompileReport) -> Any:
    """The first run. A compiled model that fails in it while its eager model runs the batch
    is left replaced by the eager model (as handlerkit's BaseHandler does for backend errors)."""
    try:
        return view.run(batch)
    except StageError as exc:
        compiled = getattr(handler, "model", None)
        eager = eager_model(compiled)
        if eager is None:
            raise  # not a compile problem: the handler's own
        original = exc.original or exc
        failed = view.results.get(exc.stage)
        handler.model = eager
        try:
            run = view.run(batch)
        except StageError:
            handler.model = compiled  # it fails eagerly too: not the compiler's doing
            raise
    text = str(original).splitlines()
    error = f"{type(original).__name__}: {text[0] if text else ''}"
    decision = getattr(getattr(handler, "decisions", None), "compile", None)
    if decision is not None and hasattr(decision, "fell_back_at_runtime"):
        decision.applied, decision.fell_back_at_runtime, decision.error, decision.reason = False, True, error, FELL_BACK
    report.error, report.reason = error, FELL_BACK
    warnings.warn(
        f"handlerkit: torch.compile failed at the model's first call ({error}); the handler now runs the eager model",
        HandlerkitWarning,
        stacklevel=user_stacklevel(),
    )
    report.problems.append(
        Problem("compile", f"compiling failed at the first call: {error}", failure_fix(report, original), "inference")
    )
    if failed is not None:
        ms = failed.wall_ms
        report.notes.append(f"the failed compiled call took {ms:.0f} ms; the times shown are the eager model's")
    return run


def _timer(view: HarnessView, handler: Any, batch: Any, run: Any, stage: str) -> Callable[[], float]:
    """One timed call of the model's stage. The inference stage is called alone on the first
    run's input (the model's time, without the requests' decoding around it); a handler that
    runs no stages, or calls inference several times a batch, is timed by whole runs."""
    result = run.stages.get(stage)
    alone = stage == "inference" and result is not None and result.calls == 1
    if alone and callable(getattr(handler, "inference", None)):
        from handlerkit.worker.timer import Timer

        data, device = result.input, getattr(handler, "device", None)

        def call() -> float:
            with Timer(device) as timer:
                handler.inference(data)
            return timer.device_or_wall_ms or 0.0  # set once the block has run

        return call
    return lambda: stage_ms(view.run(batch), stage)


def _timed(call: Callable[[], float], warmup: int, repeat: int) -> TimingStats:
    for _ in range(warmup):
        call()
    return summarize(call() for _ in range(repeat))


@contextmanager
def _swapped(handler: Any, model: Any) -> Iterator[None]:
    """``handler.model`` is ``model`` inside, and the compiled one again after, whatever happens."""
    compiled = handler.model
    handler.model = model
    try:
        yield
    finally:
        handler.model = compiled


def _steady(
    report: CompileReport, view: HarnessView, batch: Any, run: Any, warmup: int, repeat: int, bar: Bar
) -> DynamoEvents:
    """Time the compiled model, then the eager one; the compiles seen meanwhile are returned."""
    handler = view.handler
    call = _timer(view, handler, batch, run, report.timed_stage)
    bar.set_description("compile report: compiled calls")
    with DynamoEvents() as later:
        report.steady_compiled = _timed(call, warmup, repeat)
    if later.frames:
        report.frames += later.frames
        report.recompiles += recompiles(later.frames)
        report.notes.append(
            f"{len(later.frames)} frame(s) compiled after the first call, during the steady calls: the first call "
            "does not warm the model up fully"
        )
    bar.update()
    bar.set_description("compile report: eager calls")
    try:
        with _swapped(handler, eager_model(handler.model)):
            report.steady_eager = _timed(call, warmup, repeat)
    except StageError as exc:
        report.notes.append(f"the eager model failed where the compiled one ran: {exc.message.splitlines()[0]}")
    except Exception as exc:  # called alone, the stage raises the handler's own exception
        report.notes.append(f"the eager model failed where the compiled one ran: {type(exc).__name__}: {exc}")
    bar.update()
    return later
