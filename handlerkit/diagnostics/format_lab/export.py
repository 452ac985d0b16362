"""A format made from the eager model for the format lab: exported and loaded back, or why not.

:func:`make` exports with :func:`handlerkit.formats.export_model` (TorchScript by script,
falling back to trace; ONNX, ``torch.export`` and AOTInductor with a dynamic batch dimension,
falling back to a fixed one) and loads the file with :func:`handlerkit.formats.load_model`;
``compile`` wraps the model in ``torch.compile`` with the handler's ``pt2`` options.

:func:`save_made` saves a format that gave eager's answers into the handler's model dir
(:func:`handlerkit.formats.saved.save_format`), the lab's ``save=``.

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
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from handlerkit.diagnostics.format_lab.shapes import Dims

__all__ = ["ExportFailure", "Made", "artifact_path", "compile_options", "explain_failure", "make", "quiet"]

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
