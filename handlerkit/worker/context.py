"""TorchServe's handler context, rebuilt so a handler can run in a notebook or a test.

Faithful to TorchServe 0.12's ``ts/context.py``: :class:`MockContext` is a drop-in for
``ts.context.Context`` and for TorchServe's test MockContext (the attributes and methods a
handler uses), plus :meth:`MockContext.from_model_dir` and :meth:`MockContext.responses`.

Each request's headers and response live in :mod:`handlerkit.worker.request_processor`
(``RequestProcessor``, ``bind_requests``, ``read_responses``, ``ResponseInfo``), the model dir
(manifest, config discovery) is read by :mod:`handlerkit.worker.modeldir`, the model config checked by
:mod:`handlerkit.worker.config`, and ``context.metrics`` is a
:class:`~handlerkit.worker.metrics.RecordingMetrics`; their names are re-exported here. Nothing here
imports ``ts`` or ``torch``.
"""

from __future__ import annotations

import contextlib
import copy
import os
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from handlerkit.worker.metrics import (  # re-exported: handlerkit.worker.context.MetricRecord etc. keep working
    Dimension,
    MetricRecord,
    MetricType,
    RecordedMetric,
    RecordingMetrics,
)
from handlerkit.worker.metrics_config import load_metrics_config as _load_metrics_config
from handlerkit.worker.modeldir import read_config, read_model_dir, resolve_path
from handlerkit.worker.request_processor import (  # re-exported: handlerkit.worker.context.RequestProcessor etc. keep working
    RequestProcessor,
    ResponseInfo,
    bind_requests,
    read_responses,
)
from handlerkit.worker.streaming import ChunkSocket

__all__ = [
    "Dimension",
    "MetricRecord",
    "MetricType",
    "MockContext",
    "RecordedMetric",
    "RecordingMetrics",
    "RequestProcessor",
    "ResponseInfo",
    "bind_requests",
    "read_responses",
]

# TorchServe hard-codes this name in ts.context.Context.
_SERVER_NAME = "MMS"

_BIND_FIX = (
    "set responses in preprocess/handle, not in initialize; calling a handler yourself, bind its "
    "data first as the worker does: hk.Batch.coerce(data).bind(ctx) (the Harness does it)"
)


# -- the context ------------------------------------------------------------------------------
class MockContext:
    """A stand-in for TorchServe's ``ts.context.Context``, for running handlers outside the server.

    A handler gets everything it reads from TorchServe's context: ``model_name``, ``manifest``,
    ``system_properties`` (``model_dir``, ``gpu_id``, ``batch_size``, ``server_name``,
    ``server_version``, ``limit_max_image_pixels``), ``model_yaml_config`` (a plain dict, its own deep copy),
    ``metrics``, per-request headers and response status. It is duck-typed: handlers written
    for TorchServe take it unchanged, and ``ts`` need not be installed.

    Build it from a model dir (reads ``MAR-INF/MANIFEST.json`` or infers one, loads the model
    config)::

        ctx = MockContext.from_model_dir("fixtures/models/image_classifier")

    or with the arguments of TorchServe's own test ``MockContext``::

        ctx = MockContext(model_pt_file="model.pt", model_dir="models/mnist", gpu_id=None)

    Give it a batch of requests (``Batch.bind``, as TorchServe's worker does before every
    call), run the handler, then read what it set::

        batch = hk.batch(hk.Request.json({"x": 1}))
        batch.bind(ctx)
        out = handler.handle(batch.data, ctx)
        ctx.responses()        # [ResponseInfo(code=200, phrase=None, headers={...})]
        ctx.metrics.find("HandlerTime")

    ``gpu_id`` is stored as given, ``None`` included (TorchServe's test MockContext drops it
    without CUDA); ``BaseHandler`` uses CUDA only when CUDA is available *and* it is not None.

    Until a batch is bound, ``request_ids`` and ``request_processor`` are None, as under
    TorchServe, whose worker binds each batch after ``initialize``. As on TorchServe's test
    MockContext, ``handler.handle(data, ctx)`` called directly still runs: request-header reads
    answer as for a request without headers (None; ``{}`` for all of them), so ``explain`` and
    ``describe`` are off, and handlerkit's handlers bind the call's data themselves
    (:func:`handlerkit.worker.batches.bind_implicitly`). Setting a response needs a batch (TypeError
    before one, as in TorchServe; ``set_response_status`` does nothing). A header read in
    ``initialize`` fails TorchServe's model load: the Harness reports it as a contract problem
    (:meth:`noting_header_reads`). ``metrics.request_ids`` holds one fresh id, as the model
    loader sets for the metrics emitted while the model loads.

    Args:
        model_pt_file: ``manifest["model"]["serializedFile"]`` (left out when falsy).
        model_dir: the model dir; None means the current working directory. Made absolute.
        model_file: ``manifest["model"]["modelFile"]`` (left out when falsy).
        gpu_id: ``system_properties["gpu_id"]``.
        model_name: the model name.
        model_yaml_config_file: a YAML file, relative to ``model_dir``, loaded into
            ``model_yaml_config`` (and named as the manifest's ``configFile``).
        manifest: the whole manifest; when given, the three file arguments above are not
            used to build one.
        batch_size: ``system_properties["batch_size"]``.
        limit_max_image_pixels: ``system_properties["limit_max_image_pixels"]``.
        model_yaml_config: the model config as a mapping (instead of a file).
        metrics: a metrics store; a fresh :class:`RecordingMetrics` by default.
        server_version: ``system_properties["server_version"]``.
        metrics_config: TorchServe's ``metrics.yaml`` for the fresh :class:`RecordingMetrics`
            (None: TorchServe's default config); not with ``metrics``.

    Attributes:
        inferred: for :meth:`from_model_dir` without a MANIFEST, each manifest key handlerkit
            inferred and why; empty otherwise.
        cl_socket: the worker socket's stand-in (:class:`~handlerkit.worker.streaming.ChunkSocket`): what
            ``send_intermediate_predict_response`` sends (streaming) lands in ``cl_socket.sent``,
            with its time; the Harness decodes it into chunks (``Run.chunks``, ``h.stream``).
        implicit_batch: True while the batch is one a handler bound itself (see above); the
            next such call replaces it, and any other binding resets it.
        explain: False, as on TorchServe's test MockContext; tests set it, and there as here it
            makes no request an explanation request (a request's ``explain: True`` header does).
    """

    def __init__(
        self,
        model_pt_file: str | None = "model.pt",
        model_dir: str | os.PathLike[str] | None = None,
        model_file: str | None = "model.py",
        gpu_id: int | str | None = "0",
        model_name: str = "mnist",
        model_yaml_config_file: str | None = None,
        *,
        manifest: dict | None = None,
        batch_size: int = 1,
        limit_max_image_pixels: bool = True,
        model_yaml_config: Mapping[str, Any] | None = None,
        metrics: Any = None,
        server_version: str = "0.12.0",
        metrics_config: str | os.PathLike[str] | None = None,
    ) -> None:
        model_dir = os.path.abspath(os.fspath(model_dir) if model_dir is not None else os.getcwd())
        if model_yaml_config is not None and model_yaml_config_file:
            raise ValueError("pass model_yaml_config or model_yaml_config_file, not both")
        if metrics is not None and metrics_config is not None:
            raise ValueError("pass metrics or metrics_config, not both (metrics_config configures a fresh store)")
        if manifest is None:
            model: dict[str, Any] = {"modelName": model_name}
            if model_pt_file:
                model["serializedFile"] = model_pt_file
            if model_file:
                model["modelFile"] = model_file
            if model_yaml_config_file:
                model["configFile"] = model_yaml_config_file
            manifest = {"model": model}
        if model_yaml_config_file:
            config = read_config(Path(model_dir, model_yaml_config_file))
        else:
            config = _plain_config(model_yaml_config)

        self.model_name = model_name
        self.manifest = manifest
        self._system_properties: dict[str, Any] = {
            "model_dir": model_dir,
            "gpu_id": gpu_id,
            "batch_size": batch_size,
            "server_name": _SERVER_NAME,
            "server_version": server_version,
            "limit_max_image_pixels": limit_max_image_pixels,
        }
        self.model_yaml_config: dict[str, Any] = config
        # TorchServe's metrics.yaml, its default or the one given, decides what may be recorded.
        self.metrics = metrics if metrics is not None else RecordingMetrics(config=_load_metrics_config(metrics_config))
        if getattr(self.metrics, "model_name", "") is None:
            # TorchServe's worker names the metrics cache after the model it loads.
            self.metrics.model_name = model_name
        self.stopping_criteria: list | None = None
        self.header_key_sequence_id = os.getenv("TS_REQUEST_SEQUENCE_ID", "ts_request_sequence_id")
        self.header_key_sequence_start = os.getenv("TS_REQUEST_SEQUENCE_START", "ts_request_sequence_start")
        self.header_key_sequence_end = os.getenv("TS_REQUEST_SEQUENCE_END", "ts_request_sequence_end")
        self.cl_socket = ChunkSocket()
        self.inferred: dict[str, str] = {}
        # None until a batch is bound (Batch.bind / bind_requests), as in ts.context.Context.
        self.request_ids: dict[int, str] | None = None
        self.request_processor = None  # its setter also sets implicit_batch = False
        self.explain = False
        self._noted_reads: list[str] | None = None
        if getattr(self.metrics, "request_ids", "") is None:
            # ts.model_loader: metrics_cache.set_request_ids(str(uuid.uuid4())) before initialize.
            self.metrics.request_ids = str(uuid.uuid4())

    # -- ts.context.Context ----------------------------------------------------------------

    @property
    def system_properties(self) -> dict[str, Any]:
        """The worker's properties.

        ``model_dir``, ``gpu_id``, ``batch_size``, ``server_name``, ``server_version`` and
        ``limit_max_image_pixels``.
        """
        return self._system_properties

    def get_request_id(self, idx: int = 0) -> str | None:
        """The id of request ``idx`` in the batch, or None."""
        if self.request_ids is None:
            return None
        return self.request_ids.get(idx)

    @property
    def request_processor(self) -> list[RequestProcessor] | None:
        """One :class:`RequestProcessor` per request of the bound batch; None before any."""
        return self._request_processor

    @request_processor.setter
    def request_processor(self, processors: list[RequestProcessor] | None) -> None:
        self._request_processor = processors
        self.implicit_batch = False  # whoever binds now, it is no longer the handler's own batch

    def _processor(self, idx: int) -> RequestProcessor:
        """Request ``idx``'s processor; TypeError before any batch, as TorchServe's indexing of None."""
        if self._request_processor is None:
            raise TypeError(
                f"'NoneType' object is not subscriptable: context.request_processor is None until a "
                f"batch is bound, as in TorchServe, whose worker binds each batch just before handle "
                f"(so this fails in initialize in the server too); {_BIND_FIX}"
            )
        return self._request_processor[idx]

    def _headers(self, call: str, idx: int, key: str | None = None) -> RequestProcessor | None:
        """Request ``idx``'s processor for a header read, None before any batch; the read is
        noted while :meth:`noting_header_reads` is open."""
        if self._noted_reads is not None:
            read = f"{call}({idx}{'' if key is None else f', {key!r}'})"
            if read not in self._noted_reads:
                self._noted_reads.append(read)
        return None if self._request_processor is None else self._request_processor[idx]

    @contextlib.contextmanager
    def noting_header_reads(self) -> Iterator[list[str]]:
        """Note each distinct request-header read made inside the block, bound or not, as
        ``"get_request_header(0, 'explain')"`` in the list yielded (the Harness opens one
        around ``initialize``, where TorchServe's worker has no request to read)."""
        outer, self._noted_reads = self._noted_reads, []
        try:
            yield self._noted_reads
        finally:
            self._noted_reads = outer

    def get_request_header(self, idx: int, key: str) -> Any:
        """Header ``key`` of request ``idx`` (exact, case-sensitive name), or None; None before
        any batch too (a request without headers, as on TorchServe's test MockContext).

        A parameter name as ``key`` gives ``{"content-type": ...}`` for that parameter.
        """
        rp = self._headers("get_request_header", idx, key)
        return None if rp is None else rp.get_request_property(key)

    def get_all_request_header(self, idx: int) -> dict:
        """All headers of request ``idx`` (the live dict); an empty dict before any batch."""
        rp = self._headers("get_all_request_header", idx)
        return {} if rp is None else rp.get_request_properties()

    def set_response_content_type(self, idx: int, value: str) -> None:
        """Set the ``content-type`` response header of request ``idx``."""
        self.set_response_header(idx, "content-type", value)

    def get_response_content_type(self, idx: int) -> str | None:
        """The ``content-type`` response header of request ``idx``, or None."""
        return self.get_response_headers(idx).get("content-type")

    def get_response_status(self, idx: int) -> tuple[int, str | None]:
        """``(code, phrase)`` of request ``idx``."""
        rp = self._processor(idx)
        return rp.get_response_status_code(), rp.get_response_status_phrase()

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        """Set the HTTP status of request ``idx``; before any batch it does nothing, as in TorchServe."""
        if self._request_processor is not None and self._request_processor[idx] is not None:
            self._request_processor[idx].report_status(code, reason_phrase=phrase)

    def set_all_response_status(self, code: int = 200, phrase: str = "") -> None:
        """Set the HTTP status of every request in the batch (TypeError before any batch, as in TorchServe)."""
        if self.request_processor is None:
            raise TypeError(
                f"'NoneType' object is not iterable: context.request_processor is None until a batch "
                f"is bound, as in TorchServe (so this fails in initialize in the server too); {_BIND_FIX}"
            )
        for rp in self.request_processor:
            rp.report_status(code, reason_phrase=phrase)

    def get_response_headers(self, idx: int) -> dict[str, str]:
        """The response headers of request ``idx``."""
        return self._processor(idx).get_response_headers()

    def set_response_header(self, idx: int, key: str, value: str) -> None:
        """Set a response header of request ``idx``."""
        self._processor(idx).add_response_property(key, value)

    def get_sequence_id(self, idx: int) -> str | None:
        """The sequence id header of request ``idx`` (name from ``TS_REQUEST_SEQUENCE_ID``); None before any batch."""
        rp = self._headers("get_sequence_id", idx)
        return None if rp is None else rp.get_request_property(self.header_key_sequence_id)

    # -- handlerkit ------------------------------------------------------------------------

    def responses(self) -> list[ResponseInfo]:
        """Per request of the current batch: the status code, phrase and headers the handler set."""
        return read_responses(self)

    def __repr__(self) -> str:
        props = self._system_properties
        n = len(self.request_processor or [])
        return (
            f"MockContext(model_name={self.model_name!r}, model_dir={props['model_dir']!r}, "
            f"gpu_id={props['gpu_id']!r}, batch_size={props['batch_size']!r}, "
            f"requests={n}, metrics={len(self.metrics) if hasattr(self.metrics, '__len__') else '?'})"
        )

    # -- construction from a model dir -----------------------------------------------------

    @classmethod
    def from_model_dir(
        cls,
        path: str | os.PathLike[str],
        *,
        gpu_id: int | str | None = None,
        batch_size: int | None = None,
        model_name: str | None = None,
        config: str | os.PathLike[str] | None = None,
        limit_max_image_pixels: bool = True,
        metrics_config: str | os.PathLike[str] | None = None,
    ) -> MockContext:
        """A context for an unpacked model archive (or a dir laid out like one).

        The manifest comes from ``MAR-INF/MANIFEST.json`` when present. Otherwise it is
        inferred from the files (the single weights file, ``model.py``, ``handler.py``,
        ``model-config.yaml``: :func:`handlerkit.worker.modeldir.infer_manifest`), a short
        :class:`HandlerkitWarning` says so, and :attr:`inferred` keeps each key and why.

        The model config is the ``config`` argument, else the manifest's ``configFile``
        (TorchServe loads nothing else). ``batch_size`` defaults to the config's
        ``batchSize``, else 1.

        Args:
            path: the model dir, or an archive (``.mar``, ``.tar.gz``): see :meth:`from_mar`.
            gpu_id: ``system_properties["gpu_id"]`` (None: CPU, as TorchServe without GPUs).
            batch_size: overrides the config's ``batchSize``.
            model_name: overrides the manifest's ``modelName``.
            config: a model config YAML to load instead; a relative path is looked up in the
                model dir, then in the working directory.
            limit_max_image_pixels: ``system_properties["limit_max_image_pixels"]``.
            metrics_config: TorchServe's ``metrics.yaml`` (None: TorchServe's default); a
                relative path is looked up like ``config``.

        Raises:
            ModelLoadError: a missing dir, a malformed MANIFEST.json, several candidate weights
                files, or a config or metrics config file that does not exist (absolute or
                relative path alike).
            ConfigError: a config or metrics config file that does not validate, or a
                ``batchSize`` that is not an integer (one below 1 is raised to 1, as TorchServe does).
        """
        if os.path.isfile(path):  # an archive works wherever a model dir does
            return cls.from_mar(
                path,
                gpu_id=gpu_id,
                batch_size=batch_size,
                model_name=model_name,
                config=config,
                limit_max_image_pixels=limit_max_image_pixels,
                metrics_config=metrics_config,
            )
        found = read_model_dir(path, model_name=model_name, config=config)
        if metrics_config is not None:
            metrics_config = resolve_path(found.path, metrics_config, "metrics_config")
        model = found.manifest["model"]
        ctx = cls(
            model_dir=found.path,
            gpu_id=gpu_id,
            model_name=model_name or model.get("modelName") or found.path.name,
            manifest=found.manifest,
            batch_size=found.batch_size if batch_size is None else batch_size,
            limit_max_image_pixels=limit_max_image_pixels,
            model_yaml_config=found.config,
            metrics_config=metrics_config,
        )
        ctx.inferred = found.inferred
        return ctx

    @classmethod
    def from_mar(cls, path: str | os.PathLike[str], **kwargs: Any) -> MockContext:
        """:meth:`from_model_dir` on a ``.mar``/``.tar.gz``: see :func:`handlerkit.archive.context_from_mar`."""
        from handlerkit.archive.extract import context_from_mar

        return context_from_mar(cls, path, **kwargs)


def _plain_config(config: Any) -> dict[str, Any]:
    """A plain dict from None, a mapping, or an object with a ``.raw`` mapping (ModelConfig)."""
    if config is None:
        return {}
    raw = getattr(config, "raw", config)
    if not isinstance(raw, Mapping):
        raise TypeError(f"model_yaml_config must be a mapping: got {type(config).__name__}")
    # Always a private deep copy: TorchServe's BaseHandler.initialize deletes
    # pt2.compile.enable from the dict it is given, which must not reach the caller's config.
    return copy.deepcopy(dict(raw))
