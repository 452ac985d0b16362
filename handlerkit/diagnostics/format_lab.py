"""``Harness.compare_formats``: which model format gives this handler's answers, fastest, at what cost.

The handler's model (its eager ``nn.Module``) is exported to each format asked for with
:func:`handlerkit.formats.export_model` and loaded back with :func:`handlerkit.formats.load_model`
(the loaders ``hk.BaseHandler`` serves them with); ``compile`` is ``torch.compile`` with the
``pt2`` settings in force. Then, with each format's model swapped in as ``handler.model``:

1. the first call: the inference stage alone on the preprocess output of ``batch`` (time and
   peak memory above the start);
2. a whole run of ``batch`` through the handler's own ``handle``, so its preprocess feeds the
   model and its postprocess turns the model's output into answers, compared with eager's
   (the model output's max abs difference, and the answers within ``atol``/``rtol``);
3. the batch sizes the model accepts: 1, the batch's size and one more, each checked
   against the eager model on the same rows;
4. the steady state: every format's inference stage timed side by side, in an order that
   rotates from round to round, so a machine that slows down does not favour one format
   (:mod:`.noise`: a best only beyond the run's noise, and the conditions it ran under).

A format that does not export is reported with the exporter's error, the line of the model
that stopped it (:mod:`._format_export`) and a fix. The handler is left as found: its model is
put back, and the artifacts are written to a temporary directory (or ``directory``).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from handlerkit._compare import differences, same_output, shown
from handlerkit._progress import Bar
from handlerkit._render import Rendered, Table
from handlerkit._text import format_bytes, suggestion
from handlerkit.diagnostics._compile_gate import eager_model
from handlerkit.diagnostics._format_export import ExportFailure, make, quiet, save_dir, save_made
from handlerkit.diagnostics._view import HarnessView, model_handler
from handlerkit.diagnostics.noise import Conditions, Fastest, fastest
from handlerkit.diagnostics.runs import diagnostic_runs
from handlerkit.diagnostics.timing import TimingStats, summarize
from handlerkit.errors import HandlerkitError

__all__ = ["DEFAULT_FORMATS", "LAB_FORMATS", "FormatReport", "FormatRow", "compare_formats"]

LAB_FORMATS = ("eager", "torchscript", "onnx", "export", "aoti", "compile")
"""Every format the lab can try; ``aoti`` and ``compile`` compile C++ or Triton and take seconds to minutes."""
DEFAULT_FORMATS = ("eager", "torchscript", "onnx", "export")
"""The formats tried when none are named: each exports in a second or two."""


@dataclass
class FormatRow:
    """One format's row of a :class:`FormatReport`.

    Attributes:
        format: one of :data:`LAB_FORMATS`.
        exported: the model was exported (or compiled) and loaded back.
        how: how it was made, e.g. ``"torch.jit.script"``, ``"torch.jit.trace (script failed: ...)"``.
        dynamic_batch: the artifact was exported with a dynamic batch dimension (None: the
            format has no such setting).
        failure: why it did not export: the error, the model's line that stopped it, the fix.
        max_abs_diff: the largest absolute difference of the model's output from eager's.
        answers_agree: the handler's final answers are eager's, within the tolerance.
        difference: the first place where the answers differ.
        export_s / load_s: seconds to export (or wrap in ``torch.compile``) and to load back.
        first_call_ms: the first inference call (a compile happens here for ``compile``).
        peak_bytes: peak memory of the first call above its start (CPU RSS, or CUDA allocated).
        steady: the inference stage's steady-state timing.
        artifact_bytes: the exported file's size.
        batch_sizes: batch size → ``"ok"``, ``"wrong output"`` or ``"error: ..."``.
        error: a failure after exporting (loading or running), as ``Type: message``.
        log: what the exporter and the format's first calls printed, logged or warned (the lab
            keeps it here rather than let it reach the notebook cell or terminal).
    """

    format: str
    exported: bool = False
    how: str = ""
    dynamic_batch: bool | None = None
    failure: ExportFailure | None = None
    max_abs_diff: float | None = None
    answers_agree: bool | None = None
    difference: str | None = None
    export_s: float | None = None
    load_s: float | None = None
    first_call_ms: float | None = None
    peak_bytes: int | None = None
    steady: TimingStats | None = None
    artifact_bytes: int | None = None
    batch_sizes: dict[int, str] = field(default_factory=dict)
    error: str | None = None
    log: str = ""

    @property
    def agrees(self) -> bool:
        """Exported, ran, and gave eager's answers."""
        return self.exported and self.error is None and self.answers_agree is True

    @property
    def accepted_sizes(self) -> list[int]:
        """The batch sizes it ran with eager's outputs."""
        return [n for n, outcome in self.batch_sizes.items() if outcome == "ok"]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["steady"] = None if self.steady is None else self.steady.to_dict()
        data["batch_sizes"] = {str(n): outcome for n, outcome in self.batch_sizes.items()}
        data["agrees"] = self.agrees
        return data


@dataclass(repr=False)
class FormatReport(Rendered):
    """The handler's model in every format asked for, side by side (``Harness.compare_formats``).

    Attributes:
        handler: the harness's name.
        batch_size: requests in the batch.
        device: where the models ran.
        rows: one :class:`FormatRow` per format, eager first.
        repeat / warmup: steady-state calls timed, and discarded before, per format.
        atol / rtol: the tolerance the answers are compared with.
        notes: facts worth reading next to the numbers (the conditions' among them).
        saved: the format saved into the model dir (``save=``), or None.
        conditions: what the steady state was timed under (threads, cores, load).
    """

    handler: str
    batch_size: int
    device: str = "cpu"
    rows: list[FormatRow] = field(default_factory=list)
    repeat: int = 0
    warmup: int = 0
    atol: float = 1e-4
    rtol: float = 1e-4
    notes: list[str] = field(default_factory=list)
    saved: Any = None
    conditions: Conditions | None = None

    @property
    def ok(self) -> bool:
        """Every format asked for exported, ran and gave eager's answers."""
        return bool(self.rows) and all(row.agrees for row in self.rows)

    @property
    def verdict(self) -> Fastest:
        """The fastest format that agrees, and whether its lead is beyond the run's noise."""
        return fastest({row.format: row.steady for row in self.rows if row.agrees and row.steady is not None})

    @property
    def best(self) -> FormatRow | None:
        """The fastest format that agrees with eager, when its lead is beyond the noise (:attr:`verdict`)."""
        return None if (best := self.verdict.best) is None else self.row(best)

    def row(self, fmt: str) -> FormatRow:
        """The row of format ``fmt``."""
        for row in self.rows:
            if row.format == fmt:
                return row
        raise KeyError(f"no {fmt!r} row: the report has {[r.format for r in self.rows]}")

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-serialisable data (what ``--json`` prints)."""
        best = self.best
        return {
            "handler": self.handler,
            "batch_size": self.batch_size,
            "device": self.device,
            "repeat": self.repeat,
            "warmup": self.warmup,
            "atol": self.atol,
            "rtol": self.rtol,
            "ok": self.ok,
            "best": None if best is None else best.format,
            "verdict": self.verdict.reason,
            "rows": [row.to_dict() for row in self.rows],
            "notes": list(self.notes),
            "saved": None if self.saved is None else self.saved.to_dict(),
            "conditions": None if self.conditions is None else self.conditions.to_dict(),
        }

    def _summary(self) -> str:
        best = self.best
        failed = [r.format for r in self.rows if not r.exported]
        differ = [r.format for r in self.rows if r.exported and not r.agrees]
        verdict = self.verdict.reason if self.verdict.fastest else "no format agrees with eager"
        parts = [f"best: {best.format}" if best is not None else verdict]  # or "no clear winner (within noise: ...)"
        if failed:
            parts.append(f"not exported: {', '.join(failed)}")
        if differ:
            parts.append(f"answers differ or fail: {', '.join(differ)}")
        return f"formats of {self.handler} (batch {self.batch_size}, {self.device}): " + "; ".join(parts)

    def _tables(self) -> list[Table]:
        eager = next((r for r in self.rows if r.format == "eager" and r.steady is not None), None)
        rows = []
        for r in self.rows:
            ratio = (
                eager.steady.median / r.steady.median
                if eager is not None and eager.steady is not None and r.steady is not None and r.steady.median > 0
                else None
            )
            rows.append(
                [
                    r.format,
                    "yes" if r.exported else "no",
                    _agreement(r),
                    None if r.max_abs_diff is None else f"{r.max_abs_diff:.2g}",
                    r.export_s,
                    r.first_call_ms,
                    None if r.steady is None else r.steady.median,
                    None if r.steady is None else f"{r.steady.p25:.3g}-{r.steady.p75:.3g}",
                    ratio,
                    format_bytes(r.peak_bytes) if r.peak_bytes is not None else None,
                    format_bytes(r.artifact_bytes) if r.artifact_bytes is not None else None,
                    ", ".join(map(str, r.accepted_sizes)) if r.batch_sizes else None,
                ]
            )
        headers = ("format", "exported", "answers", "max abs diff", "export s", "first call ms", "median ms",
                   "p25-p75 ms", "speedup", "peak memory", "size", "batch sizes")  # fmt: skip
        how = [[r.format, r.how, _dynamic(r)] for r in self.rows if r.exported]
        failures = [
            [r.format, r.failure.error, r.failure.where, r.failure.source, r.failure.fix]
            for r in self.rows
            if r.failure is not None
        ]
        errors = [[r.format, r.error or r.difference] for r in self.rows if r.error or r.difference]
        return [
            Table(headers, rows),
            Table(("format", "how", "batch dimension"), how, "how each was made", wrap=60),
            Table(("format", "error", "at", "source", "fix"), failures, "not exported", wrap=48),
            Table(("format", "what went wrong"), errors, "differences and errors", wrap=80),
        ]

    def _notes(self) -> list[str]:
        return list(self.notes)


def _agreement(row: FormatRow) -> str:
    if not row.exported:
        return "-"
    if row.error is not None:
        return "error"
    return "agree" if row.answers_agree else "DIFFER"


def _dynamic(row: FormatRow) -> str:
    if row.dynamic_batch is None:
        return "no setting (sizes tried)"
    return "dynamic" if row.dynamic_batch else "fixed (dynamic failed)"


# ---------------------------------------------------------------------------- running
def compare_formats(
    view: HarnessView,
    batch: Any,
    *,
    formats: Sequence[str] | None = None,
    repeat: int = 20,
    warmup: int = 2,
    atol: float = 1e-4,
    rtol: float = 1e-4,
    directory: str | os.PathLike[str] | None = None,
    save: str | None = None,
    replace: bool = False,
    progress: bool | None = None,
) -> FormatReport:
    """Run ``batch`` through the handler with its model in each format (see the module docstring).

    Args:
        formats: names from :data:`LAB_FORMATS` (default :data:`DEFAULT_FORMATS`); eager, the
            reference, is always the first row.
        repeat / warmup: steady-state inference calls timed, and discarded before, per format.
        atol / rtol: the tolerance of "the same answers".
        directory: where to write the artifacts (default: a temporary directory, removed after).
        save: a format to save into the handler's model dir when its answers agree
            (:func:`handlerkit.served_format.save_format`; tried even when not in ``formats``);
            ``onnx``, ``export`` and ``aoti`` warn that TorchServe's own BaseHandler does not serve them.
        replace: with ``save``, delete the files of earlier saves (never the original weights).
        progress: a progress bar (None: when someone is watching).

    Raises:
        ValueError: an unknown format, or bad ``repeat`` / ``warmup``.
        HandlerkitError: a function handler, a model that is no ``nn.Module``, or a handler
            whose ``handle`` does not call ``inference`` once per batch; with ``save``, a model
            opened from an archive, or a file in the model dir that saving would overwrite.
        StageError: the batch fails with the handler's own eager model.
    """
    names = _format_names(formats)
    if save is not None:
        names = _format_names([*names, save])
        model_dir = save_dir(view.context, view.name, save, replace)
    if repeat < 1 or warmup < 0:
        raise ValueError(f"repeat must be >= 1 and warmup >= 0: got repeat={repeat}, warmup={warmup}")
    handler = model_handler(view, "compare_formats")
    report = FormatReport(view.name, len(batch), repeat=repeat, warmup=warmup, atol=atol, rtol=rtol)
    report.conditions = Conditions.measure()  # before the lab: the load the machine had without it
    with (
        diagnostic_runs(view),
        _workdir(directory) as workdir,
        Bar(len(names) * 3, f"formats of {view.name}", progress) as bar,
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")  # TorchScript's and the exporters' deprecation chatter
        own = handler.model
        eager = _eager_module(view, own)
        report.device = str(getattr(handler, "device", None) or "cpu")
        models: dict[str, Any] = {}
        try:
            with _swapped(handler, eager):
                reference = view.run(batch)
            data, inputs = _model_inputs(view, reference)
            report.rows.append(FormatRow("eager", exported=True, how=f"{type(eager).__name__} (the handler's model)"))
            models["eager"] = eager
            for fmt in names[1:]:
                bar.set_description(f"formats of {view.name}: exporting {fmt}")
                made = make(fmt, eager, inputs, workdir, handler)
                report.rows.append(FormatRow(fmt, **made.facts()))
                if made.model is not None:
                    models[fmt] = made.model
                bar.update()
            for row in report.rows:
                if row.format in models:
                    bar.set_description(f"formats of {view.name}: first call of {row.format}")
                    said = [row.log]
                    with quiet(said):
                        _first_calls(row, models[row.format], view, batch, data, reference, atol, rtol)
                        _batch_sizes(row, models[row.format], eager, inputs, len(batch), atol, rtol)
                    row.log = "".join(said)
                bar.update()
            bar.set_description(f"formats of {view.name}: steady state")
            _steady(report, models, handler, data, warmup, repeat)
            if save is not None:
                report.saved, note = save_made(report.row(save), model_dir, workdir, handler, replace)
                report.notes.append(note)
            bar.update(len(names))
        finally:
            handler.model = own
    report.conditions.report(report.notes)  # before the save's warning, the lab's last word
    if report.saved is not None:
        report.saved.warn_if_not_torchserve()  # here: the lab ignores warnings while it runs
    if any(row.log for row in report.rows):
        report.notes.append("what the exporters printed, logged or warned is kept in each row's .log")
    if report.rows and report.rows[0].first_call_ms is not None:
        report.notes.append("eager's first call is not fresh: the reference run called the model before it")
    return report


def _format_names(formats: Sequence[str] | None) -> list[str]:
    asked = list(DEFAULT_FORMATS if formats is None else ([formats] if isinstance(formats, str) else formats))
    for name in asked:
        if name not in LAB_FORMATS:
            raise ValueError(f"unknown format {name!r}{suggestion(name, LAB_FORMATS)}; expected some of {LAB_FORMATS}")
    return ["eager", *dict.fromkeys(n for n in asked if n != "eager")]


@contextlib.contextmanager
def _workdir(directory: str | os.PathLike[str] | None) -> Iterator[str]:
    if directory is not None:
        os.makedirs(directory, exist_ok=True)
        yield os.fspath(directory)
        return
    with tempfile.TemporaryDirectory(prefix="handlerkit-formats-") as tmp:
        yield tmp


@contextlib.contextmanager
def _swapped(handler: Any, model: Any) -> Iterator[None]:
    """``handler.model`` is ``model`` inside, and what it was after."""
    before, handler.model = handler.model, model
    try:
        yield
    finally:
        handler.model = before


def _eager_module(view: HarnessView, model: Any) -> Any:
    import torch

    eager = eager_model(model) or model
    if not isinstance(eager, torch.nn.Module):
        raise HandlerkitError(
            f"{view.name}'s model is a {type(eager).__name__}, not a torch.nn.Module: compare_formats exports "
            "the eager model to each format",
            fix="serve the eager model (a modelFile and its state_dict) while comparing formats",
        )
    return eager


def _model_inputs(view: HarnessView, run: Any) -> tuple[Any, tuple]:
    """What the inference stage received, and the model's input tensors in it."""
    import torch

    stage = run.stages.get("inference")
    if stage is None or stage.calls != 1:
        seen = "no inference stage" if stage is None else f"inference called {stage.calls} times"
        raise HandlerkitError(
            f"{view.name}'s handle ran {seen} for the batch: compare_formats feeds every format the input of "
            "the one inference call",
            fix="let handle call preprocess, inference and postprocess once per batch (as BaseHandler.handle does)",
        )
    inputs = stage.input if isinstance(stage.input, tuple) else (stage.input,)
    if not inputs or not all(isinstance(x, torch.Tensor) for x in inputs):
        raise HandlerkitError(
            f"{view.name}'s inference receives {type(stage.input).__name__}, not tensors: the exporters need "
            "tensors batch first",
            fix="return a tensor (or a tuple of tensors) from preprocess",
        )
    return stage.input, inputs


def _first_calls(
    row: FormatRow, model: Any, view: HarnessView, batch: Any, data: Any, reference: Any, atol: float, rtol: float
) -> None:
    """The first inference call (time, peak memory), then the whole batch's answers against eager's."""
    from handlerkit.memory import MemoryTracker
    from handlerkit.timer import Timer

    handler = view.handler
    device = getattr(handler, "device", None)
    try:
        with _swapped(handler, model):
            with MemoryTracker(device, end=False) as memory, Timer(device) as timer:
                handler.inference(data)
            run = view.run(batch)
    except Exception as exc:
        row.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return
    row.first_call_ms = timer.device_or_wall_ms
    row.peak_bytes = memory.cuda_peak_delta_bytes if memory.cuda_peak_bytes is not None else memory.cpu_peak_delta_bytes
    row.max_abs_diff = _max_abs_diff(reference.stages["inference"].output, run.stages["inference"].output)
    report = next(differences(reference.output, run.output, atol, rtol), None)
    row.answers_agree = report is None
    if report is not None:
        row.difference = (
            f"answers differ at {report.path or 'the output'} ({report.kind}): eager {shown(report.expected)}, "
            f"{row.format} {shown(report.actual)}"
        )


def _max_abs_diff(expected: Any, actual: Any) -> float | None:
    """The largest absolute difference over the outputs' tensors (inf when shapes differ)."""
    from handlerkit.summaries import iter_tensors

    pairs = [t for _, t in iter_tensors(expected)]
    actual_tensors = [t for _, t in iter_tensors(actual)]
    if not pairs or len(pairs) != len(actual_tensors):
        return None
    worst = 0.0
    for e, a in zip(pairs, actual_tensors):
        if e.shape != a.shape:
            return float("inf")
        if e.numel():
            worst = max(worst, float((e.detach().float().cpu() - a.detach().float().cpu()).abs().max()))
    return worst


def _batch_sizes(row: FormatRow, model: Any, eager: Any, inputs: tuple, n: int, atol: float, rtol: float) -> None:
    """Run 1, ``n`` and ``n + 1`` rows (the batch's rows cycled) through the model and eager."""
    import torch

    for size in sorted({1, n, n + 1}):
        index = torch.tensor([i % n for i in range(size)])
        rows = tuple(x[index.to(x.device)] for x in inputs)
        try:
            with torch.inference_mode():
                expected, actual = eager(*rows), model(*rows)
        except Exception as exc:
            text = str(exc).strip().splitlines()
            row.batch_sizes[size] = f"error: {type(exc).__name__}: {text[0] if text else ''}"
            continue
        row.batch_sizes[size] = "ok" if same_output(actual, expected, atol, rtol) else "wrong output"


def _steady(report: FormatReport, models: dict[str, Any], handler: Any, data: Any, warmup: int, repeat: int) -> None:
    """Every format's inference call timed side by side, the order rotating each round."""
    from handlerkit.timer import Timer

    device = getattr(handler, "device", None)
    ready = [row for row in report.rows if row.format in models and row.error is None]

    def call(row: FormatRow) -> float:
        with _swapped(handler, models[row.format]), Timer(device) as timer:
            handler.inference(data)
        return timer.device_or_wall_ms or 0.0

    for _ in range(warmup):
        for row in ready:
            call(row)
    samples: dict[str, list[float]] = {row.format: [] for row in ready}
    for round_ in range(repeat):
        shift = round_ % len(ready) if ready else 0
        for row in ready[shift:] + ready[:shift]:
            samples[row.format].append(call(row))
    for row in ready:
        row.steady = summarize(samples[row.format])
