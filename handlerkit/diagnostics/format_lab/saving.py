"""The lab's ``save=``: a format that gave eager's answers saved into the handler's model dir
(:func:`handlerkit.formats.saved.save_format`) once the saved dir serves.

:func:`serve_check` makes the save in a copy of the dir and opens the copy as a server would
(:class:`handlerkit.service.Service`, the manifest's handler), so the handler's own
``inference`` calls the model as the saved dir loads it (TorchServe's BaseHandler keeps an
ONNX model as a bare ``InferenceSession``, not the callable the lab ran), and runs the batch,
each request alone whose sizes differ from the batch's, and the batch with its varying
dimensions longer. Any failure or differing answer refuses the save, naming the dimension or
the handler's line that cannot call the model; the model dir is not touched.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

from handlerkit.diagnostics.format_lab.export import artifact_path, compile_options, quiet
from handlerkit.diagnostics.format_lab.shapes import Dims

__all__ = ["Case", "Refusal", "save_dir", "save_made", "serve_check"]


def save_dir(context: Any, name: str, fmt: str, replace: bool) -> str:
    """The handler's model dir, checked for saving ``fmt`` there before the lab does any work."""
    from handlerkit.errors import HandlerkitError
    from handlerkit.formats.saved import plan_save

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
    :class:`~handlerkit.formats.saved.SavedFormat` (None when not saved), a note, and the refusal."""
    from handlerkit.formats.saved import ARTIFACT_NAMES, save_format

    fmt = row.format
    if not row.agrees:
        why = row.failure.error if row.failure else row.error or row.difference or "its answers differ from eager's"
        return (
            None,
            f"{fmt} was not saved into {model_dir}: {why}",
            Refusal(why, "save a format whose answers agree with eager's (the table's answers column)"),
        )
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
    from handlerkit.formats.saved import save_format

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
    from handlerkit.formats.saved import NOT_TORCHSERVE_FIX

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
        return Refusal(
            reason,
            f"the exporter could not make {', '.join(dims.label(i, d) for i, d in changed)} dynamic (the row's 'how' says why): change the model so that "
            "those sizes stay symbolic, or save another format",
        )
    wanted: dict[str, list[int]] = {}
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
