"""``compare_formats``: each format's model swapped into the handler, run, timed, compared with
eager's, and with ``save=`` saved once a fresh load of the saved dir serves (see the package)."""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from handlerkit._compare import differences, same_output, shown
from handlerkit._progress import Bar
from handlerkit._text import suggestion
from handlerkit.diagnostics._view import HarnessView, model_handler
from handlerkit.diagnostics.compile.gate import eager_model
from handlerkit.diagnostics.format_lab.export import make, quiet
from handlerkit.diagnostics.format_lab.report import FormatReport, FormatRow
from handlerkit.diagnostics.format_lab.saving import Case, save_dir, save_made
from handlerkit.diagnostics.format_lab.shapes import Probe, accepted, configured_dims, plan_dims, probes, run_alone
from handlerkit.diagnostics.noise import Conditions
from handlerkit.diagnostics.runs import diagnostic_runs
from handlerkit.diagnostics.timing import summarize
from handlerkit.errors import HandlerkitError
from handlerkit.formats import input_names

__all__ = ["DEFAULT_FORMATS", "LAB_FORMATS", "compare_formats"]

LAB_FORMATS = ("eager", "torchscript", "onnx", "export", "aoti", "compile")
"""Every format the lab can try; ``aoti`` and ``compile`` compile C++ or Triton and take seconds to minutes."""
DEFAULT_FORMATS = ("eager", "torchscript", "onnx", "export")
"""The formats tried when none are named: each exports in a second or two."""


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
    dynamic_shapes: Mapping[str | int, Sequence[int]] | None = None,
    progress: bool | None = None,
) -> FormatReport:
    """Run ``batch`` through the handler with its model in each format (see the module docstring).

    Args:
        formats: names from :data:`LAB_FORMATS` (default :data:`DEFAULT_FORMATS`); eager, the
            reference, is always the first row.
        repeat / warmup: steady-state inference calls timed, and discarded before, per format.
        atol / rtol: the tolerance of "the same answers".
        directory: where to write the artifacts (default: a temporary directory, removed after).
        save: a format to save into the handler's model dir when its answers agree and the
            saved dir, opened afresh, serves the batch's sizes through the handler
            (:func:`handlerkit.formats.saved.save_format`; tried even when not in ``formats``);
            ``onnx``, ``export`` and ``aoti`` warn that TorchServe's own BaseHandler does not serve them.
        replace: with ``save``, delete the files of earlier saves (never the original weights).
        dynamic_shapes: the model's input dimensions that vary besides the batch, exported
            dynamic: input name (``forward``'s parameter) or position -> dims, e.g.
            ``{"item_ids": [1], "mask": [1]}``; an input named here takes these in place of
            what the batch shows (``[]``: none). Default: the model config's
            ``handler: {dynamic_shapes: ...}``, else what the batch shows.
        progress: a progress bar (None: when someone is watching).

    Raises:
        ValueError: an unknown format, bad ``repeat`` / ``warmup``, or ``dynamic_shapes`` naming
            an input or dimension the model does not have.
        HandlerkitError: a function handler, a model that is no ``nn.Module``, or a handler
            whose ``handle`` does not call ``inference`` once per batch; with ``save``, a model
            opened from an archive, or a file in the model dir that saving would overwrite.
        ConfigError: the model config's ``handler.dynamic_shapes`` does not validate.
        StageError: the batch fails with the handler's own eager model.
    """
    names = _format_names(formats)
    if save is not None:
        names = _format_names([*names, save])
        model_dir = save_dir(view.context, view.name, save, replace)
    if repeat < 1 or warmup < 0:
        raise ValueError(f"repeat must be >= 1 and warmup >= 0: got repeat={repeat}, warmup={warmup}")
    handler = model_handler(view, "compare_formats")
    declared, source = (dynamic_shapes, "dynamic_shapes=") if dynamic_shapes is not None else configured_dims(view)
    report = FormatReport(view.name, len(batch), repeat=repeat, warmup=warmup, atol=atol, rtol=rtol)
    report.conditions = Conditions.measure()  # before the lab: the load the machine had without it
    with (
        diagnostic_runs(view),
        _workdir(directory) as workdir,
        Bar(len(names) * 3, f"formats of {view.name}", progress) as bar,
        warnings.catch_warnings(),
        _aoti_input_checks(),
    ):
        warnings.simplefilter("ignore")  # TorchScript's and the exporters' deprecation chatter
        own = handler.model
        eager = _eager_module(view, own)
        report.device = str(getattr(handler, "device", None) or "cpu")
        models: dict[str, Any] = {}
        try:
            with _swapped(handler, eager):
                reference = view.run(batch)
                alone = run_alone(view, batch)
            data, inputs = _model_inputs(view, reference)
            report.dims = dims = plan_dims(input_names(eager, len(inputs)), inputs, alone, declared, source)
            found = probes(dims, data, inputs, alone)
            report.rows.append(FormatRow("eager", exported=True, how=f"{type(eager).__name__} (the handler's model)"))
            models["eager"] = eager
            for fmt in names[1:]:
                bar.set_description(f"formats of {view.name}: exporting {fmt}")
                made = make(fmt, eager, inputs, workdir, handler, dims)
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
                        batch_ok = all(outcome == "ok" for outcome in row.batch_sizes.values())
                        taken = accepted(models[row.format], eager, dims, found, batch_ok, atol, rtol)
                        row.dims, row.fixed_dims = taken.dims, taken.refused
                    row.log = "".join(said)
                bar.update()
            bar.set_description(f"formats of {view.name}: steady state")
            _steady(report, models, handler, data, warmup, repeat)
            if save is not None:
                bar.set_description(f"formats of {view.name}: serving the saved {save}")
                cases = _cases(handler, eager, batch, reference, alone, found)
                report.saved, note, report.refused = save_made(
                    report.row(save), model_dir, workdir, view, replace, cases, dims, (atol, rtol)
                )
                report.notes.append(note)
            bar.update(len(names))
        finally:
            handler.model = own
    report.conditions.report(report.notes)  # before the save's warning, the lab's last word
    if report.saved is not None:
        report.saved.warn_if_not_torchserve()  # here: the lab ignores warnings while it runs
    if report.dims is not None and report.dims.dynamic:
        report.notes.append(
            f"input dimensions that vary besides the batch: {report.dims.describe()}; exported dynamic where the "
            "format has the setting, and tried with other sizes (* in 'the dimensions each takes')"
        )
    if report.dims is not None and report.dims.fixed():
        report.notes.append(
            f"{report.dims.source} keeps {', '.join(report.dims.fixed())} fixed, though the batch's requests vary them"
        )
    if any(row.log for row in report.rows):
        report.notes.append("what the exporters printed, logged or warned is kept in each row's .log")
    if report.rows and report.rows[0].first_call_ms is not None:
        report.notes.append("eager's first call is not fresh: the reference run called the model before it")
    return report


def _cases(handler: Any, eager: Any, batch: Any, reference: Any, alone: list, found: list[Probe]) -> list[Case]:
    """What the saved dir must answer as eager did: the batch, each request alone whose sizes
    differ, and the batch made longer (through the handler's inference)."""
    import torch

    runs = dict(alone)
    singles = batch.split() if found else []
    cases = [Case("the batch", reference.output, batch=batch)]
    for probe in found:
        if probe.request is not None:
            single = singles[probe.request]
            cases.append(Case(probe.label, runs[probe.request].output, batch=single, changed=probe.changed))
            continue
        try:
            with _swapped(handler, eager), torch.inference_mode():
                expected = handler.inference(probe.data)
        except Exception:  # the handler's own code does not take these sizes: nothing to ask of the saved dir
            continue
        cases.append(Case(probe.label, expected, data=probe.data, changed=probe.changed))
    return cases


@contextlib.contextmanager
def _aoti_input_checks() -> Iterator[None]:
    """``AOTI_RUNTIME_CHECK_INPUTS=1`` while the lab runs: an AOTInductor model reads it at its
    first call, and unchecked it runs sizes it was not compiled for on memory it does not own,
    where the lab tries other sizes on purpose. Put back after, for the process's own models."""
    before = os.environ.get("AOTI_RUNTIME_CHECK_INPUTS")
    os.environ["AOTI_RUNTIME_CHECK_INPUTS"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["AOTI_RUNTIME_CHECK_INPUTS"]
        else:
            os.environ["AOTI_RUNTIME_CHECK_INPUTS"] = before


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
    from handlerkit.worker.memory import MemoryTracker
    from handlerkit.worker.timer import Timer

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
    from handlerkit.worker.timer import Timer

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
