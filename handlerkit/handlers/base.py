"""A TorchServe-compatible BaseHandler that records every decision it takes.

``handlerkit.BaseHandler`` keeps the attribute names and the stage contract of
``ts.torch_handler.base_handler.BaseHandler`` (TorchServe 0.12), so a handler written
against it runs under TorchServe, and one written for TorchServe runs here after changing
one import. Where it differs, it differs to fail loudly instead of silently:

* every model format runs through the default ``inference`` (ONNX and AOTInductor too);
* ``modelFile`` is imported from the handler's own model dir, even when a module called
  ``model`` was already imported from another one;
* a failed ``torch.compile`` is recorded in :attr:`BaseHandler.decisions` and warned about;
* a compile cache shipped in the model dir is loaded before the first compiled call when its
  tag matches this torch and device, and the decision says why not when it does not
  (:mod:`handlerkit.formats.compile_cache`);
* a bad model dir raises a :class:`~handlerkit.errors.ModelLoadError` that names the file
  and the fix, and leaves ``initialized`` False;
* TF32 is set in ``initialize`` (a ``handler: {tf32: ...}`` setting), never at import;
* the ``handler:`` settings are validated once, at ``initialize`` (:attr:`BaseHandler.settings`);
* one bad request can be answered alone, with its own 4xx and message, while the others are
  answered: ``self.refuse(index, message, fix=...)`` in preprocess
  (:class:`~handlerkit.handlers.request_errors.PerRequestErrors`). Raising
  :class:`~handlerkit.errors.RequestError` fails the whole batch, as in TorchServe.

Like TorchServe's, ``initialize`` deletes ``pt2.compile.enable`` from the context's model
config when it is true, and ``handle`` runs the stages under ``torch.profiler`` when the
``ENABLE_TORCH_PROFILER`` environment variable is set (the trace goes to
``/tmp/pytorch_profiler/<model name>`` unless ``profiler_args`` say otherwise).

Example:
    >>> class MyHandler(BaseHandler):
    ...     def preprocess(self, data):
    ...         return torch.tensor([row["body"] for row in data])
    >>> h = MyHandler(); h.initialize(ctx); h.handle(batch.data, ctx)
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import torch

from handlerkit._stack import user_stacklevel
from handlerkit.errors import HandlerkitError, HandlerkitWarning, ModelLoadError
from handlerkit.formats import detect_format, load_model
from handlerkit.formats.compile_cache import load_shipped
from handlerkit.handlers.request_errors import PerRequestErrors
from handlerkit.worker.batches import bind_implicitly, payload
from handlerkit.worker.devices import choose_device
from handlerkit.worker.timer import Timer

logger = logging.getLogger(__name__)

__all__ = ["BaseHandler", "CompileDecision", "HandlerDecisions", "load_label_mapping", "timed"]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class CompileDecision:
    """What the model config asked of torch.compile, and what happened."""

    requested: bool = False
    schema: str = "none"
    options: dict[str, Any] = field(default_factory=dict)
    applied: bool = False
    reason: str = "no pt2 section in model-config.yaml"
    error: str | None = None
    fell_back_at_runtime: bool = False
    cache: dict[str, Any] = field(default_factory=dict)  # the shipped compile cache (compile_cache.CacheLoad)


@dataclass
class HandlerDecisions:
    """Every decision ``initialize`` took, in a form the diagnostics read."""

    device: str = ""
    device_kind: str = ""
    device_reason: str = ""
    available: dict[str, bool] = field(default_factory=dict)
    model_format: str = ""
    loader: str = ""
    model_path: str | None = None
    model_details: dict[str, Any] = field(default_factory=dict)
    compile: CompileDecision = field(default_factory=CompileDecision)
    tf32: dict[str, Any] = field(default_factory=dict)
    label_map: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def timed(func: F) -> F:
    """Record ``ts_handler_<stage>`` (ms) when the model config has ``handler: {profile: true}``.

    The same switch and metric name as TorchServe's ``ts.handler_utils.timer.timed``; on an
    accelerator the time is device-synchronised (:class:`handlerkit.worker.timer.Timer`).
    """

    @functools.wraps(func)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        settings = getattr(self, "settings", None)
        if settings is None or not settings.profile:
            return func(self, *args, **kwargs)
        with Timer(getattr(self, "device", None)) as timer:
            result = func(self, *args, **kwargs)
        self.context.metrics.add_time("ts_handler_" + func.__name__, timer.device_or_wall_ms)
        return result

    return wrapper  # type: ignore[return-value]


def load_label_mapping(path: str) -> dict[str, str] | None:
    """Read ``index_to_name.json`` the way TorchServe does, with clear errors.

    Values are a label or a list whose last item is the label; the legacy
    ``{"object_type_names": [...]}`` form is accepted. A missing file gives ``None``.
    """
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            mapping = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(
            f"{path} is not valid JSON ({exc})", path=path, fix='write it as {"0": "label", ...}'
        ) from exc
    if not isinstance(mapping, dict):
        raise ModelLoadError(
            f'{path} holds a {type(mapping).__name__}; an index->name map is a JSON object {{"0": "label", ...}}',
            path=path,
            fix="rewrite it in that form",
        )
    names = mapping.get("object_type_names")
    if isinstance(names, list):
        return {str(i): str(v) for i, v in enumerate(names)}
    out: dict[str, str] = {}
    for key, value in mapping.items():
        label = value[-1] if isinstance(value, list) and value else value
        if not isinstance(label, str):
            raise ModelLoadError(
                f"{path}: the label for {key!r} is {value!r}; labels must be a str or a list whose last item is a str",
                path=path,
            )
        out[str(key)] = label
    return out


def output_width(model: Any) -> int | None:
    """The number of output classes of a classifier, when its structure says so; else None."""
    width = getattr(model, "num_classes", None)
    if isinstance(width, int):
        return width
    if isinstance(model, torch.nn.Module):
        last = None
        for module in model.modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d, torch.nn.Conv1d)):
                last = module
        if isinstance(last, torch.nn.Linear):
            return last.out_features
        if last is not None:
            return last.out_channels
    session = getattr(model, "session", None)
    if session is not None:
        shape = session.get_outputs()[0].shape
        if shape and isinstance(shape[-1], int):
            return shape[-1]
    return None


class BaseHandler(PerRequestErrors):
    """TorchServe's BaseHandler contract, with recorded decisions and loud failures.

    ``initialize(context)`` picks the device (CUDA when the context's ``gpu_id`` is set →
    XPU → MPS → XLA → CPU), loads the model named by the manifest in any format of
    :mod:`handlerkit.formats`, applies ``torch.compile`` from the config's ``pt2`` section,
    and loads ``index_to_name.json``. ``handle(data, context)`` runs ``preprocess`` →
    ``inference`` → ``postprocess``, sends requests with an ``explain: True`` header to
    :meth:`explain_handle` and ``describe: True`` to :meth:`describe_handle`, and records
    ``HandlerTime``.

    A request that cannot be read is answered alone: ``self.refuse(index, message, fix=...)``
    in ``preprocess`` sets its status and puts ``{"code", "error", "fix"}`` at its index among
    the answers of the others (:class:`~handlerkit.handlers.request_errors.PerRequestErrors`:
    :meth:`refuse`, :attr:`refused`, :meth:`accepted`).

    Attributes (TorchServe's names): ``model``, ``mapping``, ``device``, ``initialized``,
    ``context``, ``manifest``, ``map_location``, ``model_pt_path``, ``model_yaml_config``;
    plus :attr:`decisions`, a :class:`HandlerDecisions`.
    """

    #: Check at ``initialize`` that the label map has one entry per model output (set by
    #: handlers whose outputs are class scores).
    check_label_map_width: bool = False

    def __init__(self) -> None:
        self.model: Any = None
        self.mapping: dict[str, str] | None = None
        self.device: Any = None
        self.initialized = False
        self.context: Any = None
        self.model_pt_path: str | None = None
        self.manifest: dict[str, Any] | None = None
        self.map_location: str | None = None
        self.model_yaml_config: dict[str, Any] = {}
        self.explain = False
        self.target = 0
        self.profiler_args: dict[str, Any] = {}
        self.settings: Any = None  # the handler: section, validated (handlerkit.worker.config.HandlerSettings)
        self.decisions = HandlerDecisions()

    # ------------------------------------------------------------------ initialize
    def initialize(self, context: Any) -> None:
        """Load the model and everything around it; all or nothing."""
        self.initialized = False
        decisions = HandlerDecisions()
        try:
            self._initialize(context, decisions)
        except Exception:
            self.model = None
            self.mapping = None
            self.decisions = decisions
            raise
        self.decisions = decisions
        self.initialized = True

    def _initialize(self, context: Any, decisions: HandlerDecisions) -> None:
        from handlerkit.worker.config import parse_config

        self.context = context
        raw_config = getattr(context, "model_yaml_config", None) or {}
        self.model_yaml_config = raw_config
        config = parse_config(raw_config, source="model-config.yaml")
        self.settings = config.handler
        _consume_compile_enable(raw_config)
        properties = context.system_properties

        choice = choose_device(properties.get("gpu_id"))
        self.device = choice.device
        self.map_location = choice.kind if choice.kind != "xla" else None
        decisions.device, decisions.device_kind = str(choice.device), choice.kind
        decisions.device_reason, decisions.available = choice.reason, choice.available
        decisions.tf32 = self._apply_tf32(config.handler.tf32)

        self.manifest = context.manifest
        if not isinstance(self.manifest, dict) or not isinstance(self.manifest.get("model"), dict):
            raise ModelLoadError(
                f"context.manifest must be a dict with a 'model' section, got {self.manifest!r}",
                fix="use MockContext.from_model_dir(...) or give MockContext a manifest",
            )
        model_dir = properties.get("model_dir") or "."
        if not os.path.isdir(model_dir):
            raise ModelLoadError(
                f"model_dir {model_dir} does not exist", path=model_dir, fix="point the context at the model dir"
            )
        serialized = self.manifest["model"].get("serializedFile")
        self.model_pt_path = os.path.join(model_dir, serialized) if serialized else None
        model_file = self.manifest["model"].get("modelFile") or None

        fmt = detect_format(self.model_pt_path, model_file, aot_compile=config.pt2.aot_compile)
        loaded = load_model(
            fmt, device=self.device, model_dir=model_dir, model_pt_path=self.model_pt_path, model_file=model_file
        )
        self.model = loaded.model
        decisions.model_format, decisions.loader = loaded.format, loaded.loader
        decisions.model_path, decisions.model_details = loaded.path, loaded.details

        decisions.compile = self._apply_compile(config.pt2, loaded.format)
        if decisions.compile.applied:  # before the first compiled call: the shipped compile cache
            shipped = load_shipped(model_dir, choice.kind, self.device)
            decisions.compile.cache = shipped.to_dict()
            if shipped.found:
                decisions.notes.append(f"compile cache: {shipped.reason}")

        mapping_path = os.path.join(model_dir, "index_to_name.json")
        self.mapping = load_label_mapping(mapping_path)
        decisions.label_map = {"path": mapping_path, "found": self.mapping is not None, "size": len(self.mapping or {})}
        if self.mapping is not None and self.check_label_map_width:
            width = output_width(loaded.model)
            decisions.label_map["model_width"] = width
            if width is not None and width != len(self.mapping):
                raise ModelLoadError(
                    f"{mapping_path} has {len(self.mapping)} labels but the model outputs {width} scores",
                    path=mapping_path,
                    fix=f"write one label per model output (keys '0'..'{width - 1}')",
                )
        if self.mapping is None:
            decisions.notes.append(f"no {mapping_path}: outputs carry class indices, not names")

    def _apply_tf32(self, setting: Any) -> dict[str, Any]:
        """TF32 for CUDA matmuls/convs: "auto" does what TorchServe does (on for Ampere+)."""
        state: dict[str, Any] = {"setting": setting, "applied": False}
        if getattr(self.device, "type", "") == "cuda":
            capability = torch.cuda.get_device_capability(self.device)
            state["capability"] = capability
            want = setting is True or (setting == "auto" and capability >= (8, 0))
            if setting is False or want:
                precision = "tf32" if want else "ieee"
                torch.backends.cuda.matmul.fp32_precision = precision
                torch.backends.cudnn.conv.fp32_precision = precision  # type: ignore[attr-defined]  # torch's stubs lag its API
                state["applied"] = True
        state["matmul"] = torch.backends.cuda.matmul.fp32_precision
        state["cudnn_conv"] = torch.backends.cudnn.conv.fp32_precision  # type: ignore[attr-defined]
        return state

    def _apply_compile(self, pt2: Any, model_format: str = "eager") -> CompileDecision:
        decision = CompileDecision(
            requested=pt2.compile, schema=pt2.schema, options=dict(pt2.compile_options), reason=pt2.reason
        )
        if not pt2.compile:
            return decision
        if model_format == "onnx":  # Dynamo would trace the session's Python wrapper and compile nothing
            decision.reason = "an ONNX model runs in onnxruntime, outside PyTorch: torch.compile has nothing to compile"
            return decision
        backend = pt2.backend
        if backend is not None and backend not in torch._dynamo.list_backends(exclude_tags=()):
            decision.reason = f"backend {backend!r} is not a torch.compile backend; the model runs eagerly"
            decision.error = f"unknown backend {backend!r}"
            warnings.warn(
                f"handlerkit: pt2 asks torch.compile for backend {backend!r}, which torch does not have "
                f"(known: {', '.join(torch._dynamo.list_backends())}); the model runs without compilation",
                HandlerkitWarning,
                stacklevel=user_stacklevel(),
            )
            return decision
        if not isinstance(self.model, torch.nn.Module) and not callable(self.model):
            decision.reason = "the loaded model is not callable, so it cannot be compiled"
            return decision
        try:
            self.model = torch.compile(self.model, **decision.options)
        except Exception as exc:  # TorchServe logs this and goes on; so do we, loudly.
            decision.error = repr(exc)
            decision.reason = f"torch.compile raised {exc!r}; the model runs eagerly"
            warnings.warn(f"handlerkit: {decision.reason}", HandlerkitWarning, stacklevel=user_stacklevel())
            return decision
        decision.applied = True
        decision.reason = "compiled lazily: the first inference compiles; " + (pt2.reason or "")
        if not pt2.backend_known_to_torchserve:
            decision.reason += f" (TorchServe 0.12 would not compile: {backend!r} is not in its backend list)"
        return decision

    # ------------------------------------------------------------------ stages
    @timed
    def preprocess(self, data: Any) -> Any:
        """Requests to a tensor. TorchServe's default is ``torch.as_tensor(data)``; here a row
        that is a request dict is first replaced by its ``data`` or ``body`` value, so a JSON
        body ``[1.0, 2.0]`` works as well as TorchServe's own test input ``[[1.0, 2.0]]``."""
        rows = [payload(row) for row in data]
        return torch.as_tensor(rows, device=self.device)

    @timed
    def inference(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        """Run the model under ``torch.inference_mode()`` on the handler's device."""
        with torch.inference_mode():
            marshalled = data.to(self.device) if isinstance(data, torch.Tensor) else data
            try:
                return self.model(marshalled, *args, **kwargs)
            except torch._dynamo.exc.BackendCompilerFailed as exc:
                return self._fall_back_to_eager(exc, marshalled, *args, **kwargs)

    def _fall_back_to_eager(self, exc: Exception, data: Any, *args: Any, **kwargs: Any) -> Any:
        eager = getattr(self.model, "_orig_mod", None)
        if eager is None:
            raise exc
        self.model = eager
        self.decisions.compile.applied = False
        self.decisions.compile.fell_back_at_runtime = True
        self.decisions.compile.error = repr(exc)
        self.decisions.compile.reason = "torch.compile failed at the first call; the model runs eagerly"
        warnings.warn(
            f"handlerkit: torch.compile failed while compiling the model ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); falling back to the eager model",
            HandlerkitWarning,
            stacklevel=user_stacklevel(),
        )
        return self.model(data, *args, **kwargs)

    @timed
    def postprocess(self, data: Any) -> list[Any]:
        """One list item per request: ``data.tolist()``."""
        return data.tolist()

    # ------------------------------------------------------------------ handle
    def handle(self, data: list[Any], context: Any) -> list[Any]:
        """TorchServe's entry point: describe, explain or preprocess → inference → postprocess
        (under ``torch.profiler`` when ``ENABLE_TORCH_PROFILER`` is set).

        Called directly on a context no batch was bound to (as TorchServe's unit tests call it;
        its worker always binds one first), it binds ``data`` first:
        :func:`~handlerkit.worker.batches.bind_implicitly`."""
        start = time.time()
        bind_implicitly(context, data)
        self.context = context
        if os.environ.get("ENABLE_TORCH_PROFILER"):
            if self.manifest is None:
                self.manifest = context.manifest  # the trace folder is named after the model
            output = self._infer_with_profiler(data)
        elif self._is_describe():
            output = [self.describe_handle()]
        else:
            data_preprocess = self.preprocess(data)
            if not self._is_explain():
                output = self.inference(data_preprocess)
                output = self.postprocess(output)
            else:
                output = self.explain_handle(data_preprocess, data)
        context.metrics.add_time("HandlerTime", round((time.time() - start) * 1000, 2), None, "ms")
        return output

    def _infer_with_profiler(self, data: list[Any]) -> Any:
        """The stages under ``torch.profiler``, as TorchServe's handle runs them with
        ``ENABLE_TORCH_PROFILER``: CPU (and CUDA where available) activities with shapes, one
        ``record_function`` per stage, a trace written by ``profiler_args["on_trace_ready"]``
        (default: TensorBoard traces in ``/tmp/pytorch_profiler/<model name>``)."""
        from torch.profiler import ProfilerActivity, profile, record_function, tensorboard_trace_handler

        if not self.profiler_args:
            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            self.profiler_args.update(activities=activities, record_shapes=True)
        if "on_trace_ready" not in self.profiler_args:
            model_name = ((self.manifest or {}).get("model") or {}).get("modelName", "")
            trace_dir = os.path.join("/tmp/pytorch_profiler", model_name)
            self.profiler_args["on_trace_ready"] = tensorboard_trace_handler(trace_dir)
            logger.info("Saving chrome trace to : %s", trace_dir)
        with profile(**self.profiler_args) as prof:
            with record_function("preprocess"):
                data_preprocess = self.preprocess(data)
            if not self._is_explain():
                with record_function("inference"):
                    output = self.inference(data_preprocess)
                with record_function("postprocess"):
                    output = self.postprocess(output)
            else:
                with record_function("explain"):
                    output = self.explain_handle(data_preprocess, data)
        logger.info(prof.key_averages().table(sort_by="cpu_time_total", row_limit=10))
        return output

    def _header(self, key: str) -> Any:
        if self.context is None or not getattr(self.context, "request_processor", None):
            return None
        return self.context.get_request_header(0, key)

    def _is_explain(self) -> bool:
        if self._header("explain") == "True":
            self.explain = True
            return True
        return False

    def _is_describe(self) -> bool:
        return self._header("describe") == "True"

    def explain_handle(self, data_preprocess: Any, raw_data: list[Any]) -> Any:
        """Explanations for the first request, as TorchServe does (``target`` from its data)."""
        row = raw_data[0]
        inputs, target = None, 0
        if isinstance(row, dict):
            inputs = payload(row)
            target = row.get("target") or 0
        return self.get_insights(data_preprocess, inputs, target)

    def get_insights(self, tensor_data: Any, raw_input: Any, target: Any) -> Any:
        raise HandlerkitError(
            f"the request asked for an explanation (header explain: True) but {type(self).__name__} "
            "has no get_insights()",
            fix="override get_insights(tensor_data, raw_input, target)",
        )

    def describe_handle(self) -> Any:
        """Metadata for ``describe: True`` requests; TorchServe's default returns None."""
        return None

    def get_device(self) -> Any:
        return self.device

    def __repr__(self) -> str:  # safe for a subclass whose __init__ skipped super().__init__()
        state = "initialized" if getattr(self, "initialized", False) else "not initialized"
        decisions = getattr(self, "decisions", None)
        fmt = getattr(decisions, "model_format", "") or "-"
        return f"<{type(self).__name__} {state} device={getattr(self, 'device', None)} format={fmt}>"


def _consume_compile_enable(config: Any) -> None:
    """TorchServe's initialize deletes ``pt2.compile.enable`` when it is true (the rest of the
    section becomes ``torch.compile``'s keyword arguments); a handler that reads the config
    afterwards sees it gone under the server, so here too."""
    pt2 = config.get("pt2") if isinstance(config, dict) else None
    section = pt2.get("compile") if isinstance(pt2, dict) else None
    if isinstance(section, dict) and section.get("enable") is True:
        del section["enable"]
