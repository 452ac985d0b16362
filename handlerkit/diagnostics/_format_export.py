"""A format made from the eager model for the format lab: exported and loaded back, or why not.

:func:`make` exports with :func:`handlerkit.formats.export_model` (TorchScript by script,
falling back to trace; ONNX, ``torch.export`` and AOTInductor with a dynamic batch dimension,
falling back to a fixed one) and loads the file with :func:`handlerkit.formats.load_model`;
``compile`` wraps the model in ``torch.compile`` with the handler's ``pt2`` options.

:func:`save_made` saves a format that gave eager's answers into the handler's model dir
(:func:`handlerkit.served_format.save_format`), the lab's ``save=``.

Why a model did not export: the exporter's error, the model's line that stopped it, and a fix.

The exporters report the user's line in different places: ``torch.export`` (and the ONNX
exporter built on it) in the message, as ``File "model.py", line 11, in forward`` under "The
following call raised this error"; ``torch.jit.script`` in its own message, the same way;
``torch.jit.trace`` and plain Python errors in the traceback. The line shown is the last one
in the model's own source files (its class's and its submodules'), or failing that the last
one outside torch and handlerkit.

The exporters talk: a failing ``torch.export`` logs FX graph dumps and "Unable to find user
code" lines through torch's loggers, TorchScript and the ONNX exporter warn, and native code
writes to file descriptor 2, which Jupyter forwards into the cell. :func:`quiet` keeps all of it
on the row (``FormatRow.log``) instead: the report is what the lab has to say.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import linecache
import logging
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from handlerkit.diagnostics._format_shapes import Dims

__all__ = [
    "Case",
    "ExportFailure",
    "Made",
    "Refusal",
    "artifact_path",
    "compile_options",
    "explain_failure",
    "make",
    "quiet",
    "save_dir",
    "save_made",
    "serve_check",
]

_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EXPORTERS = {
    "torchscript": "torch.jit.script / torch.jit.trace",
    "onnx": "torch.onnx.export",
    "export": "torch.export.export",
    "aoti": "torch.export.export + AOTInductor",
    "compile": "torch.compile",
}
_FILES = {"torchscript": "model.pt", "onnx": "model.onnx", "export": "model.pt2", "aoti": "model.pt2"}


@dataclass
class ExportFailure:
    """A format that did not export.

    Attributes:
        error: the exporter's error, ``Type: first line`` of the innermost cause.
        where: ``file:line`` of the model's line that stopped it, when found.
        source: that line's code.
        fix: what to change.
    """

    error: str
    where: str | None
    source: str | None
    fix: str


@dataclass
class Made:
    """What :func:`make` gave: the model (None when it failed) and the facts for the report's row."""

    model: Any = None
    how: str = ""
    dynamic_batch: bool | None = None
    dynamic_dims: list[str] | None = None
    failure: ExportFailure | None = None
    error: str | None = None
    export_s: float | None = None
    load_s: float | None = None
    artifact_bytes: int | None = None
    exported: bool = field(default=False)
    log: str = ""

    def facts(self) -> dict[str, Any]:
        """Every field but the model."""
        return {k: v for k, v in vars(self).items() if k != "model"}


def explain_failure(fmt: str, exc: BaseException, model: Any) -> ExportFailure:
    """What went wrong exporting ``model`` to ``fmt``, where in the model, and the fix."""
    chain = _chain(exc)
    root = chain[-1]
    text = _ANSI.sub("", str(root)).strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    error = f"{type(root).__name__}: {first}" if first else type(root).__name__
    place = _model_line(chain, _model_files(model))
    where = source = None
    if place is not None:
        where = f"{os.path.basename(place[0])}:{place[1]}"
        source = linecache.getline(place[0], place[1]).strip() or None
    return ExportFailure(error, where, source, _fix(fmt, chain, where))


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes, outermost first."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _model_files(model: Any) -> set[str]:
    """The source files of the model's classes and its submodules' (torch's own left out)."""
    modules = model.modules() if hasattr(model, "modules") else [model]
    files = set()
    for module in modules:
        cls = type(module)
        if cls.__module__.startswith("torch."):
            continue
        try:
            path = inspect.getsourcefile(cls)
        except (TypeError, OSError):
            continue
        if path:
            files.add(os.path.realpath(path))
    return files


def _model_line(chain: list[BaseException], model_files: set[str]) -> tuple[str, int] | None:
    """The last ``(file, line)`` in the model's files named by the chain's messages or tracebacks."""
    places: list[tuple[str, int]] = []
    for exc in chain:
        places += [(m.group(1), int(m.group(2))) for m in _FILE_LINE.finditer(_ANSI.sub("", str(exc)))]
        places += [(f.filename, f.lineno or 0) for f in traceback.extract_tb(exc.__traceback__)]
    own = [p for p in places if os.path.realpath(p[0]) in model_files]
    if own:
        return own[-1]
    outside = [p for p in places if not _library(p[0])]
    return outside[-1] if outside else None


def _library(path: str) -> bool:
    parts = os.path.normpath(path).split(os.sep)
    return "torch" in parts or "handlerkit" in parts or "site-packages" in parts or path.startswith("<")


def _fix(fmt: str, chain: list[BaseException], where: str | None) -> str:
    names = {type(e).__name__ for e in chain}
    text = " ".join(str(e) for e in chain)
    at = f" at {where}" if where else ""
    if isinstance(chain[-1], ImportError):
        return str(chain[-1]).split("\n")[0]  # handlerkit's own ImportError names the pip command
    if "GuardOnDataDependentSymNode" in names or "data-dependent" in text:
        return (
            f"the model branches on a tensor's value{at}: compute both sides and pick with torch.where, or "
            "use torch.cond, so the exporter sees one graph; or serve a format that exported"
        )
    if fmt == "torchscript":
        return (
            f"TorchScript cannot script or trace the model{at}: give forward tensor inputs and outputs and "
            "TorchScript-typed Python, or serve a format that exported"
        )
    return f"change the model{at} so that {_EXPORTERS[fmt]} can follow it, or serve a format that exported"


@contextlib.contextmanager
def quiet(log: list[str]) -> Iterator[None]:
    """Keep what the code inside prints, logs, warns or writes to file descriptors 1 and 2 in ``log``.

    Python's ``sys.stdout``/``sys.stderr``, the logging handlers that write to them (torch's
    loggers hold the stream they were made with, so redirecting ``sys.stderr`` alone misses
    them), warnings, and the descriptors native code writes to. Each block appends one string."""
    console = {id(stream) for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__) if stream}
    text = io.StringIO()
    handlers = [
        handler
        for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
        if isinstance(logger, logging.Logger)
        for handler in logger.handlers
        if isinstance(handler, logging.StreamHandler) and id(handler.stream) in console
    ]
    with contextlib.ExitStack() as stack:
        native = stack.enter_context(tempfile.TemporaryFile(mode="w+b"))
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        saved_fds = []
        for fd in (1, 2):
            with contextlib.suppress(OSError):  # no such descriptor (pythonw): nothing to keep
                saved_fds.append((fd, os.dup(fd)))
                os.dup2(native.fileno(), fd)
        previous = [(handler, handler.setStream(text)) for handler in dict.fromkeys(handlers)]
        caught = stack.enter_context(warnings.catch_warnings(record=True))
        warnings.simplefilter("always")
        try:
            with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
                yield
        finally:
            for handler, stream in previous:
                handler.setStream(stream)
            for fd, saved in saved_fds:
                os.dup2(saved, fd)
                os.close(saved)
            native.seek(0)
            said = native.read().decode("utf-8", "replace") + text.getvalue()
            said += "".join(dict.fromkeys(f"{w.category.__name__}: {w.message}\n" for w in caught))
            if said.strip():
                log.append(said)


def artifact_path(fmt: str, workdir: str) -> str:
    """Where :func:`make` writes format ``fmt``'s file in ``workdir``."""
    return os.path.join(workdir, f"{fmt}-{_FILES[fmt]}")


def compile_options(handler: Any) -> dict[str, Any]:
    """``torch.compile``'s keyword arguments from the handler's ``pt2`` settings (none when it asks for no compile)."""
    decision = getattr(getattr(handler, "decisions", None), "compile", None)
    return dict(getattr(decision, "options", None) or {}) if getattr(decision, "requested", False) else {}


def make(fmt: str, eager: Any, inputs: tuple, workdir: str, handler: Any, dims: Dims | None = None) -> Made:
    """Export ``eager`` to ``fmt`` (example ``inputs``, files in ``workdir``; ``dims``: the input
    dimensions to make dynamic besides the batch) and load it onto the handler's device; what the
    exporter printed, logged or warned is kept in ``log``."""
    log: list[str] = []
    with quiet(log):
        made = _make(fmt, eager, inputs, workdir, handler, dims)
    made.log = "".join(log)
    return made


def _make(fmt: str, eager: Any, inputs: tuple, workdir: str, handler: Any, dims: Dims | None) -> Made:
    import torch

    from handlerkit.formats import load_model

    row = Made()
    device = getattr(handler, "device", None) or torch.device("cpu")
    start = time.perf_counter()
    try:
        if fmt == "compile":
            options = compile_options(handler)
            model = torch.compile(eager, **options)
            row.how = "torch.compile(" + ", ".join(f"{k}={v!r}" for k, v in options.items()) + ")"
            row.export_s, row.exported = time.perf_counter() - start, True
            row.model = model
            return row
        path = artifact_path(fmt, workdir)
        if fmt == "torchscript":
            row.how = _export_torchscript(eager, inputs, path)
        else:
            row.dynamic_batch, row.dynamic_dims, row.how = _export_dynamic(fmt, eager, inputs, path, dims)
    except Exception as exc:
        row.failure = explain_failure(fmt, exc, eager)
        return row
    row.export_s = time.perf_counter() - start
    row.artifact_bytes = os.path.getsize(path)
    start = time.perf_counter()
    try:
        loaded = load_model(fmt, device=device, model_dir=workdir, model_pt_path=path)
    except Exception as exc:
        row.error = f"loading failed: {type(exc).__name__}: {exc}"
        return row
    row.load_s, row.exported = time.perf_counter() - start, True
    row.model = loaded.model
    return row


def _export_torchscript(eager: Any, inputs: tuple, path: str) -> str:
    from handlerkit.formats import export_model

    try:
        export_model(eager, inputs, path, "torchscript", torchscript="script")
        return "torch.jit.script"
    except Exception as exc:
        reason = explain_failure("torchscript", exc, eager)
    export_model(eager, inputs, path, "torchscript", torchscript="trace")
    where = f" at {reason.where}" if reason.where else ""
    return (
        f"torch.jit.trace (script failed{where}: {reason.error}); a trace freezes any branch on a tensor's value "
        "as the example took it"
    )


def _export_dynamic(fmt: str, eager: Any, inputs: tuple, path: str, dims: Dims | None) -> tuple[bool, list[str], str]:
    """Export with the batch and ``dims`` dynamic, else the batch alone, else fixed sizes: whether
    the batch is dynamic, the other dims made dynamic, and how it went."""
    from handlerkit.formats import export_model

    exporter = {"onnx": "torch.onnx.export (dynamo)", "export": "torch.export.export", "aoti": "AOTInductor"}[fmt]
    wanted = dims.dynamic if dims is not None else {}
    labels = [dims.label(i, d) for i, ds in wanted.items() for d in ds] if dims is not None else []
    attempts = [(True, wanted), *([(True, {})] if wanted else []), (False, {})]
    errors: list[Exception] = []
    for batch, extra in attempts:
        try:
            export_model(eager, inputs, path, fmt, dynamic_batch=batch, dynamic_dims=extra)
        except Exception as exc:
            errors.append(exc)
            continue
        how = exporter + (", batch dimension dynamic (1 to 1024)" if batch else "")
        if errors:
            left = [*(labels if not extra else []), *(["batch"] if not batch else [])]
            how += f"; fixed: {', '.join(left)} (dynamic failed: {explain_failure(fmt, errors[0], eager).error})"
        return batch, labels if extra else [], how
    raise errors[0]  # every attempt failed: the first one's error (the most dynamic) is the one to read


def save_dir(context: Any, name: str, fmt: str, replace: bool) -> str:
    """The handler's model dir, checked for saving ``fmt`` there before the lab does any work."""
    from handlerkit.errors import HandlerkitError
    from handlerkit.served_format import plan_save

    model_dir = context.system_properties.get("model_dir")
    if getattr(context, "archive", None) is not None or not model_dir:
        raise HandlerkitError(
            f"save={fmt!r} writes into the handler's model dir, and {name} was opened from an archive "
            "(unpacked into a temporary dir) or has none",
            fix="extract the archive (handlerkit.archive.extract) and open the model dir, then save",
        )
    plan_save(model_dir, fmt, replace=replace)
    return str(model_dir)


@dataclass
class Case:
    """What the saved dir must answer as eager did: a batch through ``handle`` (``batch``), or
    the inference stage's input through the handler's ``inference`` (``data``)."""

    label: str
    expected: Any
    batch: Any = None
    data: Any = None
    changed: dict[tuple[int, int], int] = field(default_factory=dict)


@dataclass
class Refusal:
    """Why a format was not saved, and what to do."""

    reason: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        return {"reason": self.reason, "fix": self.fix}


def save_made(
    row: Any,
    model_dir: str,
    workdir: str,
    view: Any,
    replace: bool,
    cases: list[Case],
    dims: Dims | None,
    tolerance: tuple[float, float],
) -> tuple[Any, str, Refusal | None]:
    """Save ``row``'s format (its file in ``workdir``) into the model dir when it gave eager's
    answers and the saved dir serves ``cases`` (:func:`serve_check`): the
    :class:`~handlerkit.served_format.SavedFormat` (None when not saved), a note, and the refusal."""
    from handlerkit.served_format import ARTIFACT_NAMES, save_format

    fmt = row.format
    if not row.agrees:
        why = row.failure.error if row.failure else row.error or row.difference or "its answers differ from eager's"
        refusal = Refusal(why, "save a format whose answers agree with eager's (the table's answers column)")
        return None, f"{fmt} was not saved into {model_dir}: {why}", refusal
    artifact = artifact_path(fmt, workdir) if fmt in ARTIFACT_NAMES else None
    options = compile_options(view.handler) if fmt == "compile" else None
    log: list[str] = []
    with quiet(log):
        refusal = serve_check(fmt, model_dir, artifact, options, replace, view, cases, dims, tolerance)
    row.log += "".join(log)
    if refusal is not None:
        return None, f"{fmt} was not saved into {model_dir}: {refusal.reason}\n  fix: {refusal.fix}", refusal
    saved = save_format(model_dir, fmt, artifact=artifact, compile_options=options, replace=replace, warn=False)
    saved.notes.append("Opened afresh, the saved dir answered " + ", ".join(case.label for case in cases))
    return saved, f"{saved} Open the model dir again to serve it.", None


def serve_check(
    fmt: str,
    model_dir: str,
    artifact: str | None,
    options: dict[str, Any] | None,
    replace: bool,
    view: Any,
    cases: list[Case],
    dims: Dims | None,
    tolerance: tuple[float, float],
) -> Refusal | None:
    """Save ``fmt`` into a copy of ``model_dir``, open the copy as a server would and run
    ``cases`` through its handler: None when every answer is eager's, else why not."""
    from handlerkit.served_format import save_format

    with tempfile.TemporaryDirectory(prefix="handlerkit-saved-") as tmp:
        copy = os.path.join(tmp, os.path.basename(os.path.normpath(model_dir)))
        shutil.copytree(model_dir, copy, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        saved = save_format(copy, fmt, artifact=artifact, compile_options=options, replace=replace, warn=False)
        return _serve(fmt, saved, view, cases, dims, tolerance)


def _serve(
    fmt: str, saved: Any, view: Any, cases: list[Case], dims: Dims | None, tolerance: tuple[float, float]
) -> Refusal | None:
    from handlerkit._compare import differences, shown
    from handlerkit.service import Service

    copy = saved.model_dir
    artifact = saved.artifact or "the model"
    manifest = saved.model if isinstance(saved.model, dict) else {}
    # A server runs the manifest's handler; a dir whose manifest names none was opened with a
    # class (a notebook's): that class, built afresh.
    handler = None if manifest.get("handler") else type(view.handler)
    properties = getattr(view.context, "system_properties", None) or {}
    try:
        service = Service.open(copy, handler=handler, gpu_id=properties.get("gpu_id"))
    except Exception as exc:
        return Refusal(
            f"the saved dir does not open: {_error(exc)}", "open the model dir as it is and correct that first"
        )
    with contextlib.closing(service):
        name = service.name
        try:
            service.initialize()
        except Exception as exc:
            return Refusal(
                f"the saved dir does not load {artifact} under {name}: {_error(exc)}", _not_loaded_fix(fmt, service)
            )
        for case in cases:
            try:
                if case.batch is not None:
                    answer = service.handle(case.batch)
                else:
                    with service.running("inference"):
                        answer = service.handler.inference(case.data)
            except Exception as exc:
                return _failed(fmt, saved, service, case, exc, dims)
            difference = next(differences(case.expected, answer, *tolerance), None)
            if difference is not None:
                where = difference.path or "the output"
                return Refusal(
                    f"the saved dir answers {case.label} differently from eager at {where} ({difference.kind}): "
                    f"eager {shown(difference.expected)}, saved {fmt} {shown(difference.actual)}",
                    f"save a format whose answers agree for {case.label}",
                )
    return None


def _error(exc: BaseException) -> str:
    text = str(getattr(exc, "message", None) or exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _torchserve_base(handler: Any) -> bool:
    return any(cls.__module__ == "ts.torch_handler.base_handler" for cls in type(handler).__mro__)


def _not_loaded_fix(fmt: str, service: Any) -> str:
    from handlerkit.served_format import NOT_TORCHSERVE_FIX

    if _torchserve_base(service.handler) and fmt in NOT_TORCHSERVE_FIX:
        return f"{service.name} is TorchServe's BaseHandler, which does not load it: " + NOT_TORCHSERVE_FIX[fmt]
    return "open the saved format with the handler (hk.Harness.open) to see why, or save another format"


def _failed(fmt: str, saved: Any, service: Any, case: Case, exc: BaseException, dims: Dims | None) -> Refusal:
    """Why the saved dir failed ``case``: a dimension the file does not take, the handler's
    ``inference`` that cannot call the model as the dir loads it, or the error itself."""
    from handlerkit.formats import ArtifactShapeError, shape_refusal
    from handlerkit.recording.failures import raised_at

    artifact = saved.artifact or "the model"
    path = os.path.join(saved.model_dir, artifact)
    chain = [exc, exc.__cause__] if exc.__cause__ is not None else [exc]
    shape = next((e for e in chain if isinstance(e, ArtifactShapeError)), None) or shape_refusal(exc, path, fmt, None)
    if shape is not None:
        return _refused_dim(fmt, artifact, case, shape, dims)
    model = getattr(service.handler, "model", None)
    frame = _last_frame_in(exc, saved.model_dir)
    if isinstance(exc, (TypeError, AttributeError)) and frame is not None and model is not None:
        kind = f"{type(model).__module__.split('.')[0]}.{type(model).__qualname__}"
        filename, line, function = frame
        code = linecache.getline(filename, line).strip()
        bare = " (TorchServe's BaseHandler keeps the bare session)" if _torchserve_base(service.handler) else ""
        return Refusal(
            f"{service.name}.{function} ({os.path.basename(filename)}:{line}: {code}) cannot call the model as the "
            f"saved dir loads it: {_error(exc)}; the dir loads {artifact} as {kind}{bare}",
            _call_fix(fmt, service, function, kind),
        )
    location = raised_at(exc)
    where = f" at {os.path.basename(location[0])}:{location[1]}" if location is not None else ""
    return Refusal(
        f"the saved dir fails {case.label}: {_error(exc)}{where}",
        "open the saved format with the handler (hk.Harness.open) to see why, or save another format",
    )


def _last_frame_in(exc: BaseException, folder: str) -> tuple[str, int, str] | None:
    """``(file, line, function)`` of the innermost frame of ``exc``'s traceback in ``folder``."""
    root = os.path.realpath(folder) + os.sep
    found = None
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if os.path.realpath(code.co_filename).startswith(root):
            found = (code.co_filename, tb.tb_lineno, code.co_name)
        tb = tb.tb_next
    return found


def _call_fix(fmt: str, service: Any, function: str, kind: str) -> str:
    if fmt == "onnx" and _torchserve_base(service.handler):
        return (
            f"subclass handlerkit's BaseHandler in place of TorchServe's (from handlerkit.handlers import "
            f"BaseHandler): it loads model.onnx as a model called with the tensors, as the lab ran it; or call "
            f"self.model.run(None, {{name: array}}) in {service.name}.{function}; or save torchscript, which "
            f"TorchServe's BaseHandler calls with tensors"
        )
    return f"make {service.name}.{function} call {kind} as the saved dir loads it, or save another format"


def _refused_dim(fmt: str, artifact: str, case: Case, shape: Any, dims: Dims | None) -> Refusal:
    """The save refused for a dimension the saved file does not take: the dims ``case`` varies
    that were not exported dynamic, and how to declare them."""
    exported = " and ".join(f"{name} dim {dim} {expected}" for name, dim, expected, _ in shape.refused)
    reason = f"{artifact} does not take {case.label}: it was exported for {exported}"
    if fmt == "torchscript":
        return Refusal(
            reason,
            "TorchScript has no dynamic-shape setting, and this trace or script keeps that size: save onnx or "
            "export, which the lab exports with the dimensions that vary dynamic",
        )
    if dims is None:
        return Refusal(reason, shape.fix)
    index = dims.names.index(shape.input) if shape.input in dims.names else None
    changed = list(case.changed) or ([(index, shape.dim)] if index is not None else [])
    fixed = [(i, d) for i, d in changed if d not in dims.dynamic.get(i, [])]
    if not fixed:
        wanted = ", ".join(dims.label(i, d) for i, d in changed)
        return Refusal(
            reason,
            f"the exporter could not make {wanted} dynamic (the row's 'how' says why): change the model so that "
            "those sizes stay symbolic, or save another format",
        )
    wanted = {}
    for i, d in fixed:
        wanted.setdefault(dims.names[i], sorted({*dims.dynamic.get(i, []), d}))
    declared = "{" + ", ".join(f"{name!r}: {ds}" for name, ds in wanted.items()) + "}"
    option = ",".join(f"{name}:{d}" for name, ds in wanted.items() for d in ds)
    labels = ", ".join(dims.label(i, d) for i, d in fixed)
    keeps = (
        f"{dims.source or 'dynamic_shapes'} keeps {labels} fixed"
        if any(i in dims.declared for i, _ in fixed)
        else f"{labels} {'was' if len(fixed) == 1 else 'were'} not exported dynamic"
    )
    return Refusal(
        reason,
        f"{keeps}, and the requests vary {'it' if len(fixed) == 1 else 'them'}: declare "
        f"{'it' if len(fixed) == 1 else 'them'} dynamic, dynamic_shapes={declared} (handlerkit formats: --dynamic {option})",
    )
