"""The Harness: run a handler's stages one at a time and keep everything they produce.

A notebook session with a handler looks like this::

    import handlerkit as hk
    ctx = hk.MockContext.from_model_dir("fixtures/models/image_classifier")
    h = hk.Harness("image_classifier", ctx)
    h.initialize()                      # StageResult: time, memory, logs, decisions
    h.preprocess(hk.batch(hk.Request.from_file("fixtures/images/circle.png")))
    h.inference()                       # takes the preprocess output
    h.postprocess().output              # [{"circle": 0.99, ...}]

Each stage returns a :class:`StageResult` and is kept in ``h.results[stage]``. Re-running a
stage drops the results after it; ``h.inference(x)`` runs from a tensor of your own. An
exception inside a stage becomes a :class:`~handlerkit.errors.StageError` naming the stage,
the handler and the request; the harness stays usable: fix the code, ``h.reload()``, and run
the stage again. ``h.run(batch)`` runs every stage and gives the same output as
``handler.handle(data, context)``, which :meth:`Harness.handle` calls verbatim.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import inspect
import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

from handlerkit._stack import user_stacklevel
from handlerkit._text import render_html, render_text
from handlerkit.diagnostics.contract import check_output
from handlerkit.diagnostics.memory import MemoryTracker, format_bytes
from handlerkit.diagnostics.timing import Timer, needs_sync
from handlerkit.errors import HandlerkitError, HandlerkitWarning, StageError
from handlerkit.isolation import model_dir_imports
from handlerkit.requests import Batch

__all__ = ["Harness", "StageResult", "Run", "TensorInfo", "STAGES"]

STAGES = ("initialize", "preprocess", "inference", "postprocess")
_LISTING_MAX_AGE_S = 1.0  # see Harness._imports
_ORDER = {name: i for i, name in enumerate(STAGES)}
logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- results
@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor of a stage's input or output lives."""

    path: str
    shape: tuple[int, ...]
    dtype: str
    device: str


def tensor_infos(value: Any, path: str = "", limit: int = 64) -> list[TensorInfo]:
    """The tensors inside a (nested) value, by path: ``[0]["boxes"]`` ..."""
    import torch

    found: list[TensorInfo] = []

    def walk(v: Any, p: str, depth: int) -> None:
        if len(found) >= limit or depth > 6:
            return
        if isinstance(v, torch.Tensor):
            found.append(TensorInfo(p or "<value>", tuple(v.shape), str(v.dtype).replace("torch.", ""), str(v.device)))
        elif isinstance(v, dict):
            for k, item in v.items():
                walk(item, f"{p}[{k!r}]", depth + 1)
        elif isinstance(v, (list, tuple)):
            for i, item in enumerate(v[:limit]):
                walk(item, f"{p}[{i}]", depth + 1)

    if "torch" in sys.modules:
        walk(value, path, 0)
    return found


def describe(value: Any) -> str:
    """A short type/shape description of a stage value for tables."""
    infos = tensor_infos(value, limit=2)
    if infos and infos[0].path == "<value>":
        i = infos[0]
        return f"Tensor{list(i.shape)} {i.dtype} {i.device}"
    if isinstance(value, (list, tuple)):
        inner = describe(value[0]) if value else ""
        return f"{type(value).__name__}[{len(value)}]" + (f" of {inner}" if inner else "")
    if isinstance(value, dict):
        return f"dict({len(value)} keys)"
    if value is None:
        return "None"
    return type(value).__name__


@dataclass
class LogEntry:
    level: str
    logger: str
    message: str


@dataclass(slots=True)
class StageResult:
    """What one stage took and gave.

    Attributes:
        stage: the stage's name.
        input / output: what the stage received and returned (``output`` is None on error).
        wall_ms: wall-clock time; ``device_ms``: device-synchronised time on an accelerator.
        cpu_peak_bytes / cpu_peak_delta_bytes / cuda_peak_bytes: peak memory during the stage.
        tensors: devices, dtypes and shapes of the output's tensors (``input_tensors`` likewise).
        logs, warnings: records emitted during the stage.
        metrics: metric records the handler added during the stage.
        error: the :class:`StageError`, when the stage raised.
        problems: contract problems found in the output (postprocess / handle).
    """

    stage: str
    input: Any = None
    output: Any = None
    wall_ms: float = 0.0
    device_ms: float | None = None
    cpu_peak_bytes: int | None = None
    cpu_peak_delta_bytes: int | None = None
    cuda_peak_bytes: int | None = None
    logs: list[LogEntry] = field(default_factory=list)
    warnings: list[warnings.WarningMessage] = field(default_factory=list)
    metrics: list[Any] = field(default_factory=list)
    error: StageError | None = None
    problems: list[Any] = field(default_factory=list)
    called_stages: list[str] | None = None  # for a 'handle' stage: the stage methods handle() called

    _tensors: list[TensorInfo] | None = field(default=None, repr=False)
    _input_tensors: list[TensorInfo] | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tensors(self) -> list[TensorInfo]:
        """Devices, dtypes and shapes of the output's tensors (found on first access)."""
        if self._tensors is None:
            self._tensors = tensor_infos(self.output)
        return self._tensors

    @property
    def input_tensors(self) -> list[TensorInfo]:
        if self._input_tensors is None:
            self._input_tensors = tensor_infos(self.input)
        return self._input_tensors

    @property
    def devices(self) -> list[str]:
        return sorted({t.device for t in self.tensors + self.input_tensors})

    def _rows(self) -> list[tuple[str, Any]]:
        rows: list[tuple[str, Any]] = [
            ("status", "ok" if self.ok else f"error: {self.error}"),
            ("wall", f"{self.wall_ms:.2f} ms"),
        ]
        if self.device_ms is not None:
            rows.append(("device time", f"{self.device_ms:.2f} ms"))
        if self.cpu_peak_delta_bytes is not None:
            rows.append(("peak memory (CPU, above start)", format_bytes(self.cpu_peak_delta_bytes)))
        if self.cuda_peak_bytes is not None:
            rows.append(("peak memory (CUDA)", format_bytes(self.cuda_peak_bytes)))
        rows.append(("output", describe(self.output)))
        for t in self.tensors[:8]:
            rows.append((f"tensor {t.path}", f"{list(t.shape)} {t.dtype} on {t.device}"))
        for w in self.warnings[:5]:
            rows.append(("warning", f"{w.category.__name__}: {w.message}"))
        for entry in self.logs[:5]:
            rows.append(("log", f"{entry.level} {entry.logger}: {entry.message}"))
        for m in self.metrics[:5]:
            rows.append(("metric", f"{m.name} = {m.value} {m.unit}"))
        for p in self.problems[:5]:
            rows.append(("problem", str(p)))
        return rows

    def __repr__(self) -> str:
        status = "ok" if self.ok else f"error={type(self.error.original).__name__ if self.error and self.error.original else 'StageError'}"
        return f"<StageResult {self.stage} {status} {self.wall_ms:.2f} ms output={describe(self.output)}>"

    def __str__(self) -> str:
        return render_text(["", ""], self._rows(), title=f"stage {self.stage}")

    def _repr_html_(self) -> str:
        return render_html(["", ""], self._rows(), title=f"stage {self.stage}")


@dataclass(slots=True)
class Run:
    """All stages of one batch: ``output`` is what ``handle`` would have returned."""

    output: Any
    stages: dict[str, StageResult]
    batch_size: int
    mode: str = "stages"

    @property
    def timings(self) -> dict[str, float]:
        return {name: r.wall_ms for name, r in self.stages.items()}

    @property
    def total_ms(self) -> float:
        return sum(r.wall_ms for name, r in self.stages.items() if name != "initialize")

    @property
    def problems(self) -> list[Any]:
        return [p for r in self.stages.values() for p in r.problems]

    def _rows(self) -> list[list[Any]]:
        return [[name, round(r.wall_ms, 3), describe(r.output)] for name, r in self.stages.items()]

    def __repr__(self) -> str:
        return render_text(["stage", "wall ms", "output"], self._rows(), title=f"Run of {self.batch_size} request(s), {self.total_ms:.2f} ms")

    def _repr_html_(self) -> str:
        return render_html(["stage", "wall ms", "output"], self._rows(), title=f"Run of {self.batch_size} request(s), {self.total_ms:.2f} ms")


# ---------------------------------------------------------------------------- capture
class _ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.entries: list[LogEntry] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string in someone's log call must not break the stage
            message = str(record.msg)
        self.entries.append(LogEntry(record.levelname, record.name, message))


class _Capture:
    """Warnings and log records caught while a stage, or all the stages of a run, ran; the
    model dir's imports are open meanwhile.

    Entered once per run, so each stage only notes where its slice starts. A class rather than
    stacked ``with`` blocks: the harness pays for it on every run (see the overhead benchmark).
    Caught warnings are shown as usual when it closes, once per place per harness.
    """

    __slots__ = ("_catcher", "_harness", "_imports", "_log_handler", "logs", "warnings")

    def __init__(self, harness: Harness) -> None:
        self._harness = harness
        self.warnings: list[warnings.WarningMessage] = []
        self.logs: list[LogEntry] = []
        self._log_handler: _ListHandler | None = None

    def __enter__(self) -> _Capture:
        harness = self._harness
        self._imports = harness._imports()
        self._imports.__enter__()
        try:
            self._catcher = warnings.catch_warnings(record=True)
            self.warnings = self._catcher.__enter__()
            # Record every warning: the same as simplefilter("always") on the copied filter
            # list, without the ValueError simplefilter raises and catches each time.
            warnings.resetwarnings()
            warnings.simplefilter("always", append=True)
            if harness.capture_logs:
                # Only a handler is added: Logger.setLevel would clear the cache of every logger
                # (hundreds once torch is imported), ~0.3 ms each time.
                self._log_handler = harness._log_handler
                self._log_handler.entries = self.logs
                logging.root.addHandler(self._log_handler)
        except BaseException:
            self._imports.__exit__(None, None, None)
            raise
        harness._capture = self
        return self

    def __exit__(self, *exc_info: object) -> None:
        harness = self._harness
        harness._capture = None
        try:
            if self._log_handler is not None:
                logging.root.removeHandler(self._log_handler)
                self._log_handler.entries = []
            self._catcher.__exit__(None, None, None)
        finally:
            self._imports.__exit__(None, None, None)
        for w in self.warnings:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, registry=harness._warning_registry)


def _enable_info_logs() -> None:
    """TorchServe's worker configures logging at INFO, so handlers' logger.info calls are
    seen; do the same (once) so the harness can record them. Nothing is printed: no handler
    is added, and Python's last-resort handler shows WARNING and above only."""
    root = logging.getLogger()
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)


# ---------------------------------------------------------------------------- the harness
def _is_known_base_handle(func: Any) -> bool:
    """True for BaseHandler.handle of handlerkit or TorchServe (handle runs the stages)."""
    from handlerkit.handlers.base import BaseHandler

    if func is BaseHandler.handle:
        return True
    module = getattr(func, "__module__", "") or ""
    return module == "ts.torch_handler.base_handler" and getattr(func, "__qualname__", "") == "BaseHandler.handle"


class Harness:
    """Step through a handler's stages, keep every intermediate, time and check them.

    Args:
        handler: a handler instance, a handler class (built with no arguments), a TorchServe
            spec string (``"image_classifier"``, ``"handler.py"``, ``"handler.py:handle"``)
            resolved by :mod:`handlerkit.loading` in the context's model dir, or a
            module-level function ``handle(data, context)``.
        context: the context handed to the handler; a :class:`~handlerkit.MockContext` of the
            current directory when omitted.
        track_memory: measure peak memory per stage (costs a little per stage).
        capture_logs: keep the log records emitted in each stage. Like TorchServe's worker,
            this sets the root logger's level to INFO (once) so handlers' ``logger.info``
            records exist; it adds no handler, so nothing more is printed.
    """

    def __init__(self, handler: Any, context: Any = None, *, track_memory: bool = True, capture_logs: bool = True):
        from handlerkit.context import MockContext

        self.context = context if context is not None else MockContext()
        model_dir = (getattr(self.context, "system_properties", None) or {}).get("model_dir")
        self.model_dir: str | None = os.path.realpath(model_dir) if model_dir else None
        self.track_memory = track_memory
        self.capture_logs = capture_logs
        if capture_logs:
            _enable_info_logs()
        self.results: dict[str, StageResult] = {}
        self._warning_registry: dict[Any, Any] = {}
        self._warned_single = False
        self._import_dir = self._existing_model_dir()
        self._capture: _Capture | None = None
        self._timed_device: Any = None  # the last stage's device, and whether timing it needs sync
        self._timed_sync = False
        self._log_handler = _ListHandler()  # one per harness: building a logging.Handler costs locks and weakrefs
        self._metrics_marks = hasattr(getattr(self.context, "metrics", None), "mark")  # handlerkit's store
        self.batch: Any = None
        self.handler: Any = None
        self.function: Callable[..., Any] | None = None
        self.spec: str | None = None
        self._resolve(handler)
        self._overrides_handle = self.handler is not None and not _is_known_base_handle(
            getattr(type(self.handler), "handle", None)
        )

    # -- construction ------------------------------------------------------------------
    def _resolve(self, handler: Any) -> None:
        if isinstance(handler, str):
            from handlerkit.loading import resolve_handler

            self.spec = handler
            with self._imports(max_age=0):
                resolved = resolve_handler(handler, self._import_dir)
            if resolved.instance is not None:
                self.handler = resolved.instance
            else:
                self.function = resolved.function
        elif inspect.isclass(handler):
            self.handler = handler()
        elif inspect.isfunction(handler) or (callable(handler) and not hasattr(handler, "handle")):
            self.function = handler
        elif hasattr(handler, "handle"):
            self.handler = handler
        else:
            raise TypeError(
                f"Harness needs a handler instance, class, spec string or handle(data, context) function; got {handler!r}"
            )

    @property
    def name(self) -> str:
        if self.handler is not None:
            return type(self.handler).__name__
        return getattr(self.function, "__qualname__", repr(self.function))

    @property
    def is_function(self) -> bool:
        return self.function is not None

    @property
    def single_stage(self) -> bool:
        """True when the handler is run as one ``handle`` stage (function handlers, and
        handlers whose own ``handle`` replaces TorchServe's preprocess → inference → postprocess)."""
        return self.is_function or self._overrides_handle

    # -- plumbing shared by every stage ----------------------------------------------------
    def _existing_model_dir(self) -> str | None:
        """The model dir when it exists (checked at construction, initialize and reload, not per
        stage: a stat costs ~10 us between two bursts of torch work). A missing model dir is
        initialize's error to report, with its fix."""
        return self.model_dir if self.model_dir and os.path.isdir(self.model_dir) else None

    def _imports(self, max_age: float = _LISTING_MAX_AGE_S) -> Any:
        """The model dir's imports (handlerkit.isolation.model_dir_imports); re-entering costs
        almost nothing, so stages inside run() open it freely. The dir's listing is trusted for
        a second, so a loop of runs makes no syscall for it; initialize and reload look afresh."""
        return model_dir_imports(self._import_dir, max_age=max_age)

    def _invalidate_from(self, stage: str) -> None:
        """Drop the results of ``stage`` and every later one (``handle``, ``explain`` and
        ``describe`` count as later); ``initialize`` is only replaced by initialize itself."""
        start = _ORDER[stage]
        results = self.results
        if len(results) > 1 or "initialize" not in results:
            for name in [n for n in results if n != "initialize" and _ORDER.get(n, len(STAGES)) >= start]:
                del results[name]

    def _captured(self) -> Any:
        """The capture of warnings and logs (and the model dir's imports) around one stage or
        all the stages of a run; inside an open one, a no-op."""
        return contextlib.nullcontext(self._capture) if self._capture is not None else _Capture(self)

    def _stage(self, stage: str, func: Callable[[Any], Any], stage_input: Any, request_count: int | None = None) -> StageResult:
        """Run ``func(stage_input)`` as ``stage``: time it, capture logs/warnings/metrics, wrap errors."""
        return self._stages(((stage, func),), stage_input, request_count)[-1]

    def _stages(
        self, steps: Sequence[tuple[str, Callable[[Any], Any]]], stage_input: Any, request_count: int | None
    ) -> list[StageResult]:
        """Run ``steps`` in a chain, each ``(stage, func)`` on the previous one's output; keep a
        :class:`StageResult` for each in ``self.results``; raise a StageError at the first failure.

        This runs for every batch, so it is kept to a handful of operations between the stages
        (the overhead benchmark measures it against a bare ``handle``): each stage only notes
        where its warnings, logs and metrics start and reads the clock; the results are built
        after the last stage has run.
        """
        capture = self._capture
        if capture is None:
            with _Capture(self):
                return self._stages(steps, stage_input, request_count)
        metrics = self.context.metrics if self._metrics_marks else None
        device = getattr(self.handler, "device", None)
        # An accelerator needs a synchronising Timer; on CPU two clock reads do.
        if device is not self._timed_device:
            self._timed_device, self._timed_sync = device, device is not None and needs_sync(device)
        sync, track_memory = self._timed_sync, self.track_memory
        warnings_seen, logs_seen = capture.warnings, capture.logs
        marks = [(len(warnings_seen), len(logs_seen), metrics.mark() if metrics is not None else 0)]
        laps = []  # (stage, input, output, wall_ms, device_ms, memory tracker)
        value, error = stage_input, None
        for stage, func in steps:
            memory = MemoryTracker(device=device).__enter__() if track_memory else None
            output = device_ms = None
            if not sync:
                t0 = time.perf_counter_ns()
                try:
                    output = func(value)
                except Exception as exc:  # every stage failure becomes a StageError
                    error = exc
                wall_ms = (time.perf_counter_ns() - t0) / 1e6
            else:
                timer = Timer(device).start()
                try:
                    output = func(value)
                except Exception as exc:
                    error = exc
                wall_ms = timer.stop(failed=error is not None)
                device_ms = timer.device_ms
            if memory is not None:
                memory.__exit__(None, None, None)
            marks.append((len(warnings_seen), len(logs_seen), metrics.mark() if metrics is not None else 0))
            laps.append((stage, value, output, wall_ms, device_ms, memory))
            if error is not None:
                break
            value = output
        built = []
        for (stage, value, output, wall_ms, device_ms, memory), (w0, l0, m0), (w1, l1, m1) in zip(laps, marks, marks[1:]):
            result = StageResult(
                stage,
                value,
                output,
                wall_ms,
                device_ms,
                warnings=warnings_seen[w0:w1],
                logs=logs_seen[l0:l1],
                metrics=metrics.since(m0, m1) if metrics is not None else [],
            )
            if memory is not None:
                result.cpu_peak_bytes = memory.cpu_peak_bytes
                result.cpu_peak_delta_bytes = memory.cpu_peak_delta_bytes
                result.cuda_peak_bytes = memory.cuda_peak_bytes
            self.results[stage] = result
            built.append(result)
        if error is not None:
            result = built[-1]
            result.error = self._stage_error(result.stage, error, request_count)
            raise result.error from error
        return built

    def _stage_error(self, stage: str, exc: BaseException, request_count: int | None) -> StageError:
        from handlerkit.diagnostics.contract import suggest_fix

        index = getattr(exc, "request_index", None)
        if index is None and request_count == 1:
            index = 0
        if index is None and stage == "preprocess" and self.batch is not None and len(self.batch) > 1:
            index = self._find_failing_request()
        where = f"request {index}" if index is not None else "the batch"
        fix = suggest_fix(stage, exc)
        message = f"{stage} failed in {self.name} for {where}: {type(exc).__name__}: {exc}"
        if fix:
            message += f"\n  fix: {fix}"
        return StageError(message, stage=stage, handler=self.name, request_index=index, original=exc)

    def _find_failing_request(self) -> int | None:
        """Preprocess each request alone to find the one that fails (context restored after)."""
        whole = self.batch
        try:
            for i, single in enumerate(whole.split()):
                single.bind(self.context)
                try:
                    with self._imports(), warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        self.handler.preprocess(single.data)
                except Exception:
                    return i
        finally:
            whole.bind(self.context)
        return None

    # -- the stages ------------------------------------------------------------------------
    def _fresh_config(self) -> None:
        """Hand the handler a copy of the model config: TorchServe's BaseHandler.initialize
        deletes ``pt2.compile.enable`` from it, which would break a second initialize."""
        config = getattr(self.context, "model_yaml_config", None)
        if not isinstance(config, dict):
            return
        if config is not getattr(self, "_handed_config", None):
            self._pristine_config = copy.deepcopy(config)  # the user set a new config
        self._handed_config = copy.deepcopy(self._pristine_config)
        self.context.model_yaml_config = self._handed_config

    def initialize(self) -> StageResult:
        """Run the handler's ``initialize(context)`` (``handle(None, context)`` for functions)."""
        self.results.clear()
        self._import_dir = self._existing_model_dir()
        self._fresh_config()
        with self._imports(max_age=0):  # a fresh look at the dir's files; the stage nests inside
            if self.is_function:
                func = self.function
                result = self._stage("initialize", lambda _: func(None, self.context), None)
            else:
                result = self._stage("initialize", lambda _: self.handler.initialize(self.context), None)
            decisions = getattr(self.handler, "decisions", None)
            if decisions is not None and result.output is None:
                result.output = decisions
        return result

    def _coerce(self, batch_or_data: Any) -> Any:
        return Batch.coerce(batch_or_data)

    def preprocess(self, batch_or_data: Any) -> StageResult:
        """Bind the batch to the context and run ``preprocess(data)``."""
        self._need_stage_methods("preprocess")
        batch = self._coerce(batch_or_data)
        self._bind(batch)
        return self._stage("preprocess", self.handler.preprocess, batch.data, len(batch))

    def _bind(self, batch: Any) -> None:
        """Make ``batch`` the current one, as TorchServe's worker does before ``handle``."""
        self.batch = batch
        self._invalidate_from("preprocess")
        batch.bind(self.context)
        if self.handler is not None:
            self.handler.context = self.context  # BaseHandler.handle sets it before preprocess

    def inference(self, x: Any = None) -> StageResult:
        """Run ``inference`` on ``x``, or on the last preprocess output."""
        self._need_stage_methods("inference")
        if x is None:
            x = self._last_output("preprocess", "inference")
        self._invalidate_from("inference")
        return self._stage("inference", self.handler.inference, x, self._count())

    def postprocess(self, y: Any = None) -> StageResult:
        """Run ``postprocess`` on ``y``, or on the last inference output, and check the contract."""
        self._need_stage_methods("postprocess")
        if y is None:
            y = self._last_output("inference", "postprocess")
        self._invalidate_from("postprocess")
        count = self._count()
        result = self._stage("postprocess", self.handler.postprocess, y, count)
        self._check_postprocess(result, count)
        return result

    def _check_postprocess(self, result: StageResult, count: int | None) -> None:
        result.problems = check_output(result.output, count, stage="postprocess")
        if result.problems:
            self._warn_problems(result)

    def _count(self) -> int | None:
        return len(self.batch) if self.batch is not None else None

    def _warn_problems(self, result: StageResult) -> None:
        for problem in result.problems:
            warnings.warn(f"handlerkit: {problem}", HandlerkitWarning, stacklevel=user_stacklevel())

    def _last_output(self, stage: str, wanted_by: str) -> Any:
        result = self.results.get(stage)
        if result is None or not result.ok:
            raise HandlerkitError(
                f"{wanted_by} needs the output of {stage}, which has not run successfully; "
                f"fix: run h.{stage}(...) first, or pass the input: h.{wanted_by}(value)"
            )
        return result.output

    def _need_stage_methods(self, stage: str) -> None:
        if self.is_function:
            raise HandlerkitError(
                f"{self.name} is a function handler: it has no {stage} stage to step through; "
                "use h.run(batch) (one 'handle' stage) or h.handle(batch)"
            )

    # -- whole batches ---------------------------------------------------------------------
    def _routing(self) -> str:
        """Where BaseHandler.handle sends the bound batch: by request 0's headers."""
        header = self.context.get_request_header
        if header(0, "describe") == "True":
            return "describe"
        if header(0, "explain") == "True":
            return "explain"
        return "predict"

    def run(self, batch_or_data: Any) -> Run:
        """Every stage of one batch; ``Run.output`` equals what ``handle`` returns.

        Initializes first when that has not happened. Requests with a ``describe: True``
        header run ``describe_handle``, ``explain: True`` runs ``explain_handle`` after
        preprocess — where TorchServe's BaseHandler.handle sends them.
        """

        with self._captured():  # one capture for the whole run; each stage takes its slice
            return self._run(batch_or_data)

    def _run(self, batch_or_data: Any) -> Run:
        initialized = self.results.get("initialize")
        if initialized is None or initialized.error is not None:
            self.initialize()
        batch = batch_or_data if type(batch_or_data) is Batch else Batch.coerce(batch_or_data)
        start = time.time()
        if self.function is not None or self._overrides_handle:  # self.single_stage, inlined
            self._warn_single_stage_once()
            result = self.handle_stage(batch)
            stages = {"handle": result}
            output, mode = result.output, "handle"
        else:
            self._bind(batch)
            route = self._routing()
            handler, count = self.handler, len(batch)
            if route == "describe":
                result = self._stage("describe", lambda _: [handler.describe_handle()], batch.data, count)
                stages, output, mode = {"describe": result}, result.output, "describe"
            elif route == "explain":
                data = batch.data  # one list for both, as in TorchServe's handle
                pre = self._stage("preprocess", handler.preprocess, data, count)
                handler._is_explain()  # TorchServe's handle sets handler.explain here
                result = self._stage("explain", lambda x: handler.explain_handle(x, data), pre.output, count)
                stages, output, mode = {"preprocess": pre, "explain": result}, result.output, "explain"
            else:  # _bind cleared the later stages already; the public methods' checks are moot
                steps = (("preprocess", handler.preprocess), ("inference", handler.inference), ("postprocess", handler.postprocess))
                pre, inf, post = self._stages(steps, batch.data, count)
                self._check_postprocess(post, count)
                stages, output, mode = {"preprocess": pre, "inference": inf, "postprocess": post}, post.output, "stages"
            metrics = getattr(self.context, "metrics", None)
            if metrics is not None:  # what BaseHandler.handle records around the stages
                metrics.add_time("HandlerTime", round((time.time() - start) * 1000, 2), None, "ms")
            if mode in ("describe", "explain"):
                last = stages[mode]
                last.problems = check_output(output, count, stage=mode)
        all_stages = {"initialize": self.results["initialize"], **stages}
        return Run(output=output, stages=all_stages, batch_size=len(batch), mode=mode)

    def handle_stage(self, batch_or_data: Any) -> StageResult:
        """``handle(data, context)`` as one stage (timed, captured, contract-checked)."""
        batch = self._coerce(batch_or_data)
        self.batch = batch
        self._invalidate_from("preprocess")
        batch.bind(self.context)
        entry = self.function if self.is_function else self.handler.handle
        data = batch.data
        calls: list[str] = []
        with self._spy_stages(calls):
            result = self._stage("handle", lambda d: entry(d, self.context), data, len(batch))
        result.problems = check_output(result.output, len(batch), stage="handle")
        if self._overrides_handle and not calls and self._has_stage_methods():
            result.problems.append(
                f"{self.name}.handle() never called preprocess, inference or postprocess: edits to those "
                "methods have no effect, here or under TorchServe; fix: call them from handle(), or drop the "
                "handle override and let BaseHandler.handle run them"
            )
        result.called_stages = calls
        self._warn_problems(result)
        return result

    @contextlib.contextmanager
    def _spy_stages(self, calls: list[str]) -> Iterator[None]:
        """Note which stage methods a custom handle() calls (instance attributes, removed after)."""
        if not self._overrides_handle or self.handler is None:
            yield
            return
        patched = []
        for name in ("preprocess", "inference", "postprocess"):
            method = getattr(self.handler, name, None)
            if method is None or name in vars(self.handler):
                continue

            def spy(*args: Any, _m: Any = method, _n: str = name, **kwargs: Any) -> Any:
                calls.append(_n)
                return _m(*args, **kwargs)

            setattr(self.handler, name, spy)
            patched.append(name)
        try:
            yield
        finally:
            for name in patched:
                delattr(self.handler, name)

    def _has_stage_methods(self) -> bool:
        """Whether the handler has a preprocess, inference or postprocess a custom handle()
        might be expected to run (a plain class with only handle() has none: nothing to flag)."""
        return any(callable(getattr(self.handler, name, None)) for name in ("preprocess", "inference", "postprocess"))

    def _warn_single_stage_once(self) -> None:
        if self._overrides_handle and not self._warned_single and self._has_stage_methods():
            self._warned_single = True
            warnings.warn(
                f"handlerkit: {self.name} overrides handle(), so TorchServe runs that method and not "
                "preprocess → inference → postprocess on their own; the harness runs it as one 'handle' stage",
                HandlerkitWarning,
                stacklevel=user_stacklevel(),
            )

    def handle(self, batch_or_data: Any) -> Any:
        """Exactly ``handler.handle(batch.data, context)`` (after binding the batch)."""
        batch = self._coerce(batch_or_data)
        batch.bind(self.context)
        entry = self.function if self.is_function else self.handler.handle
        with self._imports():
            return entry(batch.data, self.context)

    # -- reports -----------------------------------------------------------------------------
    def time(self, batch_or_data: Any, warmup: int = 3, repeat: int = 20) -> Any:
        """Per-stage min / median / p90 / mean over ``repeat`` runs (device-synchronised)."""
        from handlerkit.diagnostics.profile import time_stages

        return time_stages(self, self._coerce(batch_or_data), warmup=warmup, repeat=repeat)

    def sweep(self, batch_or_data: Any, batch_sizes: Sequence[int] = (1, 2, 4, 8), warmup: int = 2, repeat: int = 10) -> Any:
        """Latency and throughput per stage for each batch size (requests repeated to size)."""
        from handlerkit.diagnostics.profile import sweep_stages

        return sweep_stages(self, self._coerce(batch_or_data), batch_sizes=batch_sizes, warmup=warmup, repeat=repeat)

    def device_report(self) -> Any:
        """Device chosen and why, accelerators, TF32, where parameters and stage tensors live."""
        from handlerkit.diagnostics.device import build_device_report

        return build_device_report(self)

    def check(self, batch_or_data: Any, *, atol: float = 1e-4, rtol: float = 1e-4) -> Any:
        """Contract checks: output shape/type, statuses, batch parity, request encodings."""
        from handlerkit.diagnostics.contract import run_checks

        return run_checks(self, self._coerce(batch_or_data), atol=atol, rtol=rtol)

    # -- reload ------------------------------------------------------------------------------
    def reload(self) -> None:
        """Re-import the handler's source and rebind its methods; the loaded model stays.

        The module is executed afresh from its file; only when that succeeds is the live
        handler's class swapped for the new definition (``initialize`` is not re-run).
        Results of preprocess and later are dropped.
        """
        from handlerkit.isolation import exec_source

        self._import_dir = self._existing_model_dir()
        target = self.function if self.is_function else type(self.handler)
        with self._imports(max_age=0):  # a model-dir module is in sys.modules only inside this block
            module = sys.modules.get(target.__module__)
            path = getattr(module, "__file__", None)
            if module is None or not path or not os.path.isfile(path):
                raise HandlerkitError(f"cannot reload {self.name}: its module {target.__module__!r} has no source file")
            spec = importlib.util.spec_from_file_location(module.__name__, path)
            if spec is None or spec.loader is None:
                raise HandlerkitError(f"cannot reload {self.name}: no loader for {path}")
            fresh = importlib.util.module_from_spec(spec)
            try:
                exec_source(fresh, path)
            except Exception as exc:
                raise StageError(
                    f"reload of {path} failed, the handler keeps its previous code: {type(exc).__name__}: {exc}",
                    stage="reload",
                    handler=self.name,
                    original=exc,
                ) from exc
            replacement = getattr(fresh, target.__name__, None)
            if replacement is None:
                raise HandlerkitError(
                    f"reload of {path}: it no longer defines {target.__name__}; the handler keeps its previous code"
                )
            sys.modules[module.__name__] = fresh
        if self.is_function:
            self.function = replacement
        else:
            self.handler.__class__ = replacement
            self._overrides_handle = not _is_known_base_handle(getattr(replacement, "handle", None))
        self._invalidate_from("preprocess")

    def __repr__(self) -> str:
        done = ", ".join(f"{k}{'' if v.ok else '!'}" for k, v in self.results.items()) or "nothing run yet"
        return f"<Harness {self.name}: {done}>"
