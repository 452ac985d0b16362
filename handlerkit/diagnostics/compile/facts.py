"""What a compile report says about the settings and the first call (for :mod:`.compile`).

The ``pt2`` settings come from the handler's recorded decision (handlerkit's
``BaseHandler.decisions.compile``), else from the model config read the way TorchServe 0.12
reads it. The first call's facts come from the records :class:`DynamoEvents` caught.
"""

from __future__ import annotations

import copy
import sys
import warnings
from typing import Any

from handlerkit._text import suggestion
from handlerkit.diagnostics._view import HarnessView
from handlerkit.diagnostics.compile.dynamo_events import DynamoEvents, dynamic_dims, recompiles, user_frame
from handlerkit.diagnostics.compile.gate import eager_model
from handlerkit.diagnostics.noise import spread
from handlerkit.summaries import iter_tensors
from handlerkit.worker.contract import Problem

#: A :class:`handlerkit.diagnostics.compile.CompileReport` (not imported: that module imports this one).
CompileReport = Any

__all__ = ["FELL_BACK", "failure_fix", "first_call_facts", "read_settings", "slower_than_eager", "stage_ms"]

_NOT_COMPILABLE = {
    "torchscript": "torch.compile cannot compile a TorchScript model",
    "onnx": "torch.compile cannot compile an ONNX model (onnxruntime runs it outside PyTorch)",
    "aoti": "an AOTInductor package is compiled ahead of time already",
    "aoti-so": "an AOTInductor package is compiled ahead of time already",
}
_EAGER_FIX = "drop the pt2 section, or serve the eager model (modelFile + state_dict) and compile that with pt2"
_TRY_AOT_EAGER = "try backend: aot_eager to tell Dynamo's failures from the backend's; the error names what failed"
FELL_BACK = "torch.compile failed at the first call; the model runs eagerly"
_MARKS = (("_dynamo_dynamic_indices", "mark_dynamic"), ("_dynamo_unbacked_indices", "mark_unbacked"))
_HOW_TO_COMPILE = "to compile, add pt2: {compile: {enable: true, backend: inductor}} to model-config.yaml"


# ---------------------------------------------------------------------------- settings
def read_settings(report: CompileReport, view: HarnessView, handler: Any) -> None:
    """Fill the report's pt2 fields: the handler's decision, else the config."""
    decisions = getattr(handler, "decisions", None)
    decision = getattr(decisions, "compile", None)
    report.model_format = getattr(decisions, "model_format", None) or None
    if decision is not None and hasattr(decision, "requested"):
        report.pt2_schema = str(decision.schema)
        report.pt2_settings = dict(decision.options)
        report.requested, report.reason, report.error = bool(decision.requested), str(decision.reason), decision.error
        shipped = getattr(decision, "cache", None)
        report.shipped_cache = dict(shipped) if isinstance(shipped, dict) and shipped.get("found") else None
    else:
        pt2 = _parse_pt2(getattr(view.context, "model_yaml_config", None))
        if pt2 is not None:
            report.pt2_schema, report.pt2_settings = pt2.schema, dict(pt2.compile_options)
            report.requested, report.reason = pt2.compile, pt2.reason
            if pt2.compile and not pt2.torchserve_compiles:
                report.reason += "; TorchServe 0.12 would not compile this"
    report.backend = report.pt2_settings.get("backend") or ("inductor" if report.requested else None)


def _parse_pt2(raw: Any) -> Any:
    """``pt2`` as TorchServe 0.12 reads it. Its initialize deleted ``compile.enable`` when that
    was true, so a ``compile`` section without it was enabled."""
    if not isinstance(raw, dict):
        return None
    from handlerkit.errors import ConfigError
    from handlerkit.worker.config import parse_config

    config = copy.deepcopy({"pt2": raw["pt2"]}) if "pt2" in raw else {}
    section = config["pt2"].get("compile") if isinstance(config.get("pt2"), dict) else None
    if isinstance(section, dict) and "enable" not in section:
        section["enable"] = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the config's own warnings were given at initialize
            return parse_config(config, source="model-config.yaml").pt2
    except ConfigError:
        return None


def _infer_format(model: Any) -> str | None:
    """The format of a model a handler loaded itself (TorchServe's handlers record none)."""
    jit = getattr(sys.modules.get("torch"), "jit", None)
    script = getattr(jit, "ScriptModule", None)
    if script is not None and isinstance(model, script):
        return "torchscript"
    kind = type(model)
    session = getattr(model, "session", None)
    if kind.__module__.startswith("onnxruntime") or (hasattr(session, "get_inputs") and hasattr(session, "run")):
        return "onnx"
    return None


# ---------------------------------------------------------------------------- first call
def stage_ms(run: Any, stage: str) -> float:
    """A run's time in ``stage`` (device time on an accelerator); ``handle``: the whole call."""
    if stage == "handle":
        return float(run.total_ms)
    return run.stages[stage].device_or_wall_ms


def first_call_facts(
    report: CompileReport, run: Any, first: DynamoEvents, handler: Any, compiled_at_start: bool
) -> None:
    """Fill what the first call showed: applied or not, its time and compile split, graphs,
    breaks, recompiles, dynamic inputs, and the verdict with its problems and notes."""
    model = getattr(handler, "model", None)
    eager = eager_model(model)
    report.applied = eager is not None
    shown = eager if eager is not None else model
    report.model = type(shown).__name__
    report.model_format = report.model_format or _infer_format(shown)
    report.timed_stage = "inference" if "inference" in run.stages else "handle"
    report.first_call_ms = stage_ms(run, report.timed_stage)
    frames = first.frames
    report.frames = frames
    report.compile_observed = bool(frames)
    if frames:
        report.compile_s = sum(f.compile_s or 0.0 for f in frames)
        if any(f.backend_s is not None for f in frames):
            report.backend_s = sum(f.backend_s or 0.0 for f in frames)
            report.dynamo_s = max(report.compile_s - report.backend_s, 0.0)
        if any(f.inductor_s is not None for f in frames):
            report.inductor_s = sum(f.inductor_s or 0.0 for f in frames)
        _cache_split(report, frames)
    report.recompiles = recompiles(frames)
    report.dynamic_inputs = _dynamic_inputs(report.pt2_settings, run, first.symbols)
    _verdict(report, handler, compiled_at_start)
    if report.applied and not report.compile_observed:
        report.notes.append(
            "the first call compiled nothing: Dynamo's cache held this model's code already (it ran before the "
            "report, or a model of the same class was compiled in this process), so the compile cost was not "
            "observed. Call h.initialize() and then compile_report before any other run to see it"
        )


def graph_caches(graphs: list[Any]) -> list[dict[str, Any]]:
    """Per compiled graph, what the caches did: ``hit`` / ``miss`` / ``bypass: <reason>``."""
    keys = ("compile_id", "function", "fx_graph_cache", "aot_autograd_cache", "cache_hit")
    return [{key: getattr(frame, key) for key in keys} for frame in graphs]


def _cache_split(report: CompileReport, frames: list[Any]) -> None:
    """The first call's compile split into graphs compiled cold and graphs loaded from Inductor's
    FX graph cache (a warm ``TORCHINDUCTOR_CACHE_DIR``, or a shipped compile cache), with a note."""
    graphs = [f for f in frames if f.graph_ops is not None or f.fx_graph_cache is not None or f.cache_hits]
    loaded = [f for f in graphs if f.cache_hit]
    report.cache_load_s = sum(f.compile_s or 0.0 for f in loaded) if loaded else None
    cold = [f for f in graphs if not f.cache_hit]
    report.cold_compile_s = sum(f.compile_s or 0.0 for f in cold) if cold else None
    bypassed = [f"{f.compile_id}: {f.fx_graph_cache}" for f in graphs if (f.fx_graph_cache or "").startswith("bypass")]
    if loaded:
        report.notes.append(
            f"Inductor's FX graph cache served {len(loaded)} of {len(graphs)} graph(s) at the first call: a cache "
            f"load of {report.cache_load_s:.2f} s, not a cold compile (a warm cache dir, or a shipped compile cache)"
        )
    if bypassed:
        report.notes.append(
            "Inductor's FX graph cache was bypassed (" + "; ".join(bypassed) + "): those graphs compile cold every time"
        )


def _verdict(report: CompileReport, handler: Any, compiled_at_start: bool) -> None:
    """Why the model is or is not compiled, and the problem to fix when it was asked for and is not."""
    if any(p.check == "compile" for p in report.problems):
        return  # the report's own fallback said it already
    decision = getattr(getattr(handler, "decisions", None), "compile", None)
    if report.applied:
        if not report.requested:
            report.reason = "the handler compiled the model itself (pt2 does not ask for it)"
        for frame in (f for f in report.frames if f.failure):
            report.problems.append(
                Problem(
                    "compile",
                    f"{frame.function} could not be compiled ({frame.failure}); it runs eagerly",
                    _TRY_AOT_EAGER,
                    "inference",
                    severity="warning",
                )
            )
        return
    if compiled_at_start:  # the handler itself fell back during the first call
        report.reason = str(getattr(decision, "reason", "") or FELL_BACK)
        report.error = getattr(decision, "error", None) or report.error
        message = f"compiling failed at the first call: {report.error}"
        report.problems.append(Problem("compile", message, failure_fix(report, None), "inference"))
    elif report.requested:
        report.problems.append(
            Problem(
                "compile",
                f"pt2 asks for torch.compile but the model runs eagerly: {report.reason}",
                _refusal_fix(report),
                "initialize",
            )
        )
    else:
        report.notes.append(_HOW_TO_COMPILE)


def failure_fix(report: CompileReport, original: BaseException | None) -> str:
    """The fix for a compile that failed inside the first call."""
    refused = _NOT_COMPILABLE.get(report.model_format or "")
    if refused:
        return f"{refused}: {_EAGER_FIX}"
    stack = [(f.filename, f.lineno, getattr(f, "line", None)) for f in (getattr(original, "real_stack", None) or [])]
    frame = user_frame(stack)
    if frame is not None:
        return f"change what Dynamo cannot trace at {frame[0]}:{frame[1]} ({frame[2]}), or set fullgraph: false"
    return _TRY_AOT_EAGER


def _refusal_fix(report: CompileReport) -> str:
    refused = _NOT_COMPILABLE.get(report.model_format or "")
    if refused:
        return f"{refused}: {_EAGER_FIX}"
    backend = report.pt2_settings.get("backend")
    if report.error and backend and "backend" in report.error:
        try:
            import torch._dynamo

            known = list(torch._dynamo.list_backends())
        except Exception:
            known = []
        hint = suggestion(str(backend), known) if known else ""
        return f"use one of torch's backends ({', '.join(known)}){hint}"
    return "correct the pt2 section as the reason says"


def _dynamic_inputs(settings: dict[str, Any], run: Any, symbols: list[str]) -> list[str]:
    found = []
    dynamic = settings.get("dynamic")
    if dynamic is True:
        found.append("every dimension (pt2 dynamic: true)")
    elif dynamic is False:
        found.append("none (pt2 dynamic: false: each new shape compiles again)")
    stage = run.stages.get("inference")
    for i, (_, tensor) in enumerate(iter_tensors(stage.input if stage is not None else None)):
        for attribute, how in _MARKS:
            for dim in sorted(getattr(tensor, attribute, None) or ()):
                found.append(f"inference input {i}: dim {dim} ({how} in preprocess)")
    found += [f"{d} (made dynamic by Dynamo)" for d in dynamic_dims(symbols)]
    return found


# ---------------------------------------------------------------------------- the steady state
#: Backends that trace and run the graph as eager PyTorch: they check Dynamo, they generate no code.
_DEBUG_BACKENDS = ("eager", "aot_eager", "aot_eager_decomp_partition")


def slower_than_eager(report: CompileReport, later: DynamoEvents) -> list[Problem]:
    """A problem when the compiled model is slower than eager beyond the steady calls' noise, with
    the fixes the report's facts point at, ending with serving eager; none otherwise."""
    faster, compiled, eager = report.faster, report.steady_compiled, report.steady_eager
    if faster is None or compiled is None or eager is None:
        return []
    if faster.best != "eager":
        if faster.best is None:
            report.notes.append(f"compiled against eager: {faster.reason}")
        return []
    fixes = []
    if report.backend in _DEBUG_BACKENDS:
        fixes.append(f"backend {report.backend!r} generates no code (it checks tracing): use backend: inductor")
    if later.frames:
        fixes.append(
            "the steady calls compiled again (see recompiles): warm the model up with the shapes traffic brings, "
            "or mark the varying dimension dynamic"
        )
    if report.graph_breaks:
        fixes.append(f"remove the {len(report.graph_breaks)} graph break(s) (each hint says how)")
    if report.pt2_settings.get("dynamic") is True:
        fixes.append("dynamic: true compiles shape-generic code: leave it unset where shapes are fixed")
    mode = report.pt2_settings.get("mode")
    if mode:
        fixes.append(f"try without mode {mode!r}")
    fixes.append(
        "or serve eager (pt2: {compile: {enable: false}} in model-config.yaml): a small model's work can cost "
        "less than the compiled code's guards and calls"
    )
    message = (
        f"the compiled model is slower than eager: {report.timed_stage} takes {spread(compiled)} compiled and "
        f"{spread(eager)} eager ({eager.median / compiled.median:.2f}x), a difference beyond the run's noise"
    )
    return [Problem("compile-slower", message, "; ".join(fixes), report.timed_stage, severity="warning")]
