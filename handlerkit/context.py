"""TorchServe's handler context, rebuilt so a handler can run in a notebook or a test.

Three pieces, each faithful to TorchServe 0.12 (``ts/context.py``, ``ts/metrics/``):

- :class:`RequestProcessor` holds one request's headers and the response status and headers
  the handler sets for it, with TorchServe's method names.
- :class:`RecordingMetrics` implements TorchServe's metrics API (``add_counter``, ``add_time``,
  ``add_metric_to_cache`` …) and records every value as a :class:`MetricRecord` instead of
  logging it, so a notebook or a test can read them back.
- :class:`MockContext` is a drop-in for ``ts.context.Context``: the attributes and methods a
  handler uses, plus :meth:`MockContext.from_model_dir` and :meth:`MockContext.responses`.

Nothing here imports ``ts`` or ``torch``.
"""

from __future__ import annotations

import json
import numbers
import os
import sys
import time
import uuid
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple

from handlerkit.errors import ConfigError, HandlerkitWarning, ModelLoadError

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


# --------------------------------------------------------------------------------------------
# Per-request headers and response status
# --------------------------------------------------------------------------------------------


class RequestProcessor:
    """One request's headers in, its response status and headers out (``ts.context.RequestProcessor``).

    The header dict is kept by reference, as TorchServe does. It holds the request-level HTTP
    headers plus, for each input parameter, ``{param name: {"content-type": ...}}``.

    Args:
        request_header: the request's headers, as the worker builds them.
    """

    def __init__(self, request_header: dict) -> None:
        self._status_code: int = 200
        self._reason_phrase: str | None = None
        self._response_header: dict[str, str] = {}
        self._request_header = request_header

    def get_request_property(self, key: str) -> Any:
        """The request header ``key`` (exact, case-sensitive name), or None."""
        return self._request_header.get(key)

    def report_status(self, code: int, reason_phrase: str | None = None) -> None:
        """Set this request's HTTP status code and reason phrase."""
        self._status_code = code
        self._reason_phrase = reason_phrase

    def get_response_status_code(self) -> int:
        """The status code set so far (200 by default)."""
        return self._status_code

    def get_response_status_phrase(self) -> str | None:
        """The reason phrase set so far (None by default)."""
        return self._reason_phrase

    def add_response_property(self, key: str, value: str) -> None:
        """Set a response header."""
        self._response_header[key] = value

    def get_response_headers(self) -> dict[str, str]:
        """The response headers (the live dict, as in TorchServe)."""
        return self._response_header

    def get_response_header(self, key: str) -> str | None:
        """One response header, or None."""
        return self._response_header.get(key)

    def get_request_properties(self) -> dict:
        """All request headers (the live dict, as in TorchServe)."""
        return self._request_header

    def __repr__(self) -> str:
        return (
            f"RequestProcessor(status={self._status_code}, phrase={self._reason_phrase!r}, "
            f"request_headers={sorted(self._request_header)}, "
            f"response_headers={self._response_header!r})"
        )


class ResponseInfo(NamedTuple):
    """What the handler set for one request: status code, reason phrase, response headers."""

    code: int
    phrase: str | None
    headers: dict[str, str]

    @property
    def content_type(self) -> str | None:
        """The ``content-type`` response header set with ``set_response_content_type``."""
        return self.headers.get("content-type")


def read_responses(context: Any) -> list[ResponseInfo]:
    """Read back, per request, the status and headers a handler set on any TorchServe-like context.

    Works on :class:`MockContext` and on TorchServe's own ``ts.context.Context``.
    """
    processors = getattr(context, "request_processor", None) or []
    return [
        ResponseInfo(
            rp.get_response_status_code(),
            rp.get_response_status_phrase(),
            dict(rp.get_response_headers()),
        )
        for rp in processors
    ]


def bind_requests(context: Any, request_ids: Mapping[int, str], headers: Sequence[dict]) -> Any:
    """Give a context a new batch of requests, the way ``ts.service.Service.predict`` does.

    Sets ``context.request_ids``, a fresh ``context.request_processor`` list (so statuses set
    during a previous call do not leak) and ``context.metrics.request_ids`` when the metrics
    object has that attribute. Works on :class:`MockContext` and ``ts.context.Context``.

    Args:
        context: the context to update.
        request_ids: batch index → request id.
        headers: one header dict per request (each is copied).

    Returns:
        The context, for chaining.
    """
    if len(request_ids) != len(headers):
        raise ValueError(
            f"bind_requests needs one header dict per request id: got {len(request_ids)} "
            f"ids and {len(headers)} header dicts"
        )
    ids = dict(request_ids)
    context.request_ids = ids
    context.request_processor = [RequestProcessor(_copy_headers(h)) for h in headers]
    metrics = getattr(context, "metrics", None)
    if metrics is not None and hasattr(metrics, "request_ids"):
        metrics.request_ids = ids
    return context


def _user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning point at the first caller outside handlerkit."""
    package = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame, level = frame.f_back, level + 1
    return level


def _copy_headers(headers: Mapping) -> dict:
    # Parameter entries are nested dicts ({"content-type": ...}); copy them too.
    return {k: dict(v) if isinstance(v, Mapping) else v for k, v in headers.items()}


# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------


class MetricType(Enum):
    """A metric's type; TorchServe's ``ts.metrics.metric_type_enum.MetricTypes`` is accepted too."""

    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


# TorchServe's ts/metrics/unit.py: the unit names written in its metric log lines.
_UNIT_NAMES: dict[str | None, str] = {
    "ms": "Milliseconds",
    "s": "Seconds",
    "percent": "Percent",
    "count": "Count",
    "MB": "Megabytes",
    "GB": "Gigabytes",
    "kB": "Kilobytes",
    "B": "Bytes",
    "": "unit",
    None: "unit",
}


def _metric_type(value: Any) -> MetricType:
    """Our MetricType, TorchServe's MetricTypes (compared by value) or a type name."""
    if isinstance(value, MetricType):
        return value
    raw = getattr(value, "value", value)
    if isinstance(raw, str):
        try:
            return MetricType(raw.lower())
        except ValueError:
            pass
    raise TypeError(
        f"metric_type must be a MetricType (COUNTER, GAUGE or HISTOGRAM; TorchServe's "
        f"MetricTypes works too): got {value!r}"
    )


class Dimension(NamedTuple):
    """A metric dimension; TorchServe's ``ts.metrics.dimension.Dimension`` is accepted too."""

    name: str
    value: Any


def _dimensions(dimensions: Any) -> dict[str, Any]:
    """A dict from None, a mapping, or a list of Dimension-like objects / (name, value) pairs."""
    if dimensions is None:
        return {}
    if isinstance(dimensions, Mapping):
        return dict(dimensions)
    if isinstance(dimensions, (str, bytes)) or not isinstance(dimensions, Iterable):
        raise TypeError(
            "dimensions must be a list of Dimension(name, value) objects or a dict: "
            f"got {type(dimensions).__name__}"
        )
    out: dict[str, Any] = {}
    for dim in dimensions:
        if hasattr(dim, "name") and hasattr(dim, "value"):
            out[dim.name] = dim.value
        elif isinstance(dim, tuple) and len(dim) == 2:
            out[dim[0]] = dim[1]
        else:
            raise TypeError(
                f"each dimension must be a Dimension(name, value) or a (name, value) pair: got {dim!r}"
            )
    return out


def _check_value(name: str, value: Any) -> None:
    # TorchServe raises TypeError for a non-numeric counter (from its `value < 0` check) and
    # would log a gauge of any type; a metric that is not a number is a bug either way.
    if not isinstance(value, numbers.Real):
        hint = " (call .item() on a tensor)" if hasattr(value, "item") else ""
        raise TypeError(
            f"metric {name!r} needs a number: got {type(value).__name__} {value!r}{hint}"
        )


@dataclass(frozen=True)
class MetricRecord:
    """One metric value a handler emitted.

    Attributes:
        name: the metric name.
        value: the number.
        unit: the unit as given (``"ms"``, ``"MB"``, ``"count"``…).
        dimensions: dimension name → value, TorchServe's defaults included.
        request_id: the request id(s) TorchServe would log with it (ids joined by commas when
            no batch index was given), or None.
        metric_type: ``"counter"``, ``"gauge"`` or ``"histogram"``.
        timestamp: ``time.time()`` when it was recorded.
    """

    name: str
    value: float
    unit: str
    dimensions: dict[str, Any] = field(default_factory=dict)
    request_id: str | None = None
    metric_type: str = MetricType.COUNTER.value
    timestamp: float = 0.0

    @property
    def unit_name(self) -> str:
        """The unit as TorchServe writes it in its log (``"Milliseconds"`` for ``"ms"``)."""
        return _UNIT_NAMES.get(self.unit, self.unit)

    def __str__(self) -> str:
        # The line TorchServe's worker logs, without the hostname and time.
        dims = ",".join(f"{k}:{v}" for k, v in self.dimensions.items())
        line = f"[METRICS]{self.name}.{self.unit_name}:{self.value}|#{dims}|#type:{self.metric_type.upper()}"
        return f"{line}|{self.request_id}" if self.request_id else line


class RecordedMetric:
    """A metric declared in the store (TorchServe's ``CachingMetric``); values go to the store's records.

    Get one from :meth:`RecordingMetrics.add_metric_to_cache` or :meth:`RecordingMetrics.get_metric`.
    """

    def __init__(
        self,
        store: RecordingMetrics,
        metric_name: str,
        unit: str,
        dimension_names: Sequence[str] | None = None,
        metric_type: MetricType = MetricType.COUNTER,
    ) -> None:
        self._store = store
        self.metric_name = metric_name
        self.unit = unit
        self.dimension_names: list[str] = list(dimension_names or [])
        self.metric_type = metric_type

    def add_or_update(
        self,
        value: float,
        dimension_values: Sequence[Any] = (),
        request_id: str | None = "",
    ) -> None:
        """Record a value, with one dimension value per dimension name.

        Like TorchServe, a wrong number of dimension values or a negative counter is dropped
        (TorchServe logs an error; handlerkit issues a :class:`HandlerkitWarning`).

        Raises:
            TypeError: ``value`` is not a number.
        """
        _check_value(self.metric_name, value)
        if dimension_values is None or len(dimension_values) != len(self.dimension_names):
            warnings.warn(
                f"handlerkit: metric {self.metric_name!r} was declared with dimensions "
                f"{self.dimension_names} but got values {dimension_values!r}; TorchServe logs "
                "an error and drops the value",
                HandlerkitWarning,
                stacklevel=_user_stacklevel(),
            )
            return
        if self.metric_type is MetricType.COUNTER and value < 0:
            warnings.warn(
                f"handlerkit: counter {self.metric_name!r} cannot be decreased (got {value}); "
                "TorchServe logs an error and drops the value",
                HandlerkitWarning,
                stacklevel=_user_stacklevel(),
            )
            return
        self._store._record(
            MetricRecord(
                name=self.metric_name,
                value=value,
                unit=self.unit,
                dimensions=dict(zip(self.dimension_names, dimension_values)),
                request_id=request_id,
                metric_type=self.metric_type.value,
                timestamp=time.time(),
            )
        )

    def update(self, value: float, request_id: str | None = "", dimensions: Any = None) -> None:
        """TorchServe's backwards-compatible update: replaces the dimension names, then records."""
        dims = _dimensions(dimensions)
        self.dimension_names = list(dims)
        self.add_or_update(value, list(dims.values()), request_id)

    def __repr__(self) -> str:
        return (
            f"RecordedMetric({self.metric_name!r}, unit={self.unit!r}, "
            f"dimensions={self.dimension_names}, type={self.metric_type.value})"
        )


class RecordingMetrics:
    """TorchServe's metrics API (``ts.metrics.metric_cache_abstract``) that records instead of logging.

    Every value a handler emits becomes a :class:`MetricRecord` in :attr:`records`. Default
    dimensions follow TorchServe: ``ModelName`` and ``Level="Model"`` when request ids are
    known, ``Level="Error"`` when not (and always for :meth:`add_error`).

    Example::

        m = RecordingMetrics(model_name="mnist")
        start = m.mark()
        m.add_time("HandlerTime", 12.5)
        m.since(start)[0].unit       # 'ms'
        m.last("HandlerTime").value  # 12.5

    Attributes:
        model_name: written into the ``ModelName`` dimension.
        request_ids: batch index → request id, set per batch (as ``Service.predict`` does).
        records: every value recorded, oldest first.
    """

    def __init__(self, model_name: str | None = None, request_ids: Any = None) -> None:
        self.model_name = model_name
        self.request_ids = request_ids
        self.records: list[MetricRecord] = []
        self.cache: dict[MetricType, dict[str, RecordedMetric]] = {}
        self._dropped = 0  # records removed by clear(), so marks stay valid

    # -- TorchServe's API ----------------------------------------------------------------

    def set_request_ids(self, request_ids: Any) -> None:
        """Set the request ids (TorchServe's setter)."""
        self.request_ids = request_ids

    def add_metric(
        self,
        name: str,
        value: float,
        unit: str,
        idx: int | None = None,
        dimensions: Any = None,
        metric_type: Any = MetricType.COUNTER,
    ) -> None:
        """Add a metric of any type (a counter by default)."""
        self._add(name, value, unit, idx, dimensions, metric_type)

    def add_counter(self, name: str, value: float, idx: int | None = None, dimensions: Any = None) -> None:
        """Add to a counter (unit ``"count"``)."""
        self._add(name, value, "count", idx, dimensions, MetricType.COUNTER)

    def add_time(
        self,
        name: str,
        value: float,
        idx: int | None = None,
        unit: str = "ms",
        dimensions: Any = None,
        metric_type: Any = MetricType.GAUGE,
    ) -> None:
        """Add a duration, in ``"ms"`` (default) or ``"s"`` (a gauge by default)."""
        if unit not in ("ms", "s"):
            raise ValueError(f"the unit for a timed metric should be one of ['ms', 's']: got {unit!r}")
        self._add(name, value, unit, idx, dimensions, metric_type)

    def add_size(
        self,
        name: str,
        value: float,
        idx: int | None = None,
        unit: str = "MB",
        dimensions: Any = None,
        metric_type: Any = MetricType.GAUGE,
    ) -> None:
        """Add a size, in ``"MB"`` (default), ``"kB"``, ``"GB"`` or ``"B"`` (a gauge by default)."""
        if unit not in ("MB", "kB", "GB", "B"):
            raise ValueError(
                f"the unit for a size based metric is one of ['MB', 'kB', 'GB', 'B']: got {unit!r}"
            )
        self._add(name, value, unit, idx, dimensions, metric_type)

    def add_percent(
        self,
        name: str,
        value: float,
        idx: int | None = None,
        dimensions: Any = None,
        metric_type: Any = MetricType.GAUGE,
    ) -> None:
        """Add a percentage (unit ``"percent"``, a gauge by default)."""
        self._add(name, value, "percent", idx, dimensions, metric_type)

    def add_error(self, name: str, value: float, dimensions: Any = None) -> None:
        """Add an error counter (``Level="Error"``, no request id, unit ``""``)."""
        dims = _dimensions(dimensions)
        dims.setdefault("Level", "Error")
        metric = self._get_or_add(name, "", dims, MetricType.COUNTER)
        metric.add_or_update(value, list(dims.values()))

    def add_metric_to_cache(
        self,
        metric_name: str,
        unit: str,
        dimension_names: Sequence[str] | None = None,
        metric_type: Any = MetricType.COUNTER,
    ) -> RecordedMetric:
        """Declare a metric (replacing one of the same name and type) and return it.

        Raises:
            TypeError: a name or unit that is not a str, dimension names that are not a list,
                or an unknown metric type (TorchServe raises ``MetricsCacheTypeError``, a TypeError).
        """
        if not isinstance(metric_name, str):
            raise TypeError(f"`metric_name` must be a str: got {metric_name!r}")
        if not isinstance(unit, str):
            raise TypeError(f"`unit` must be a str: got {unit!r}")
        if dimension_names and not isinstance(dimension_names, (list, tuple)):
            raise TypeError(
                f"`dimension_names` should be a list of dimension name strings: got {dimension_names!r}"
            )
        kind = _metric_type(metric_type)
        metric = RecordedMetric(self, metric_name, unit, dimension_names, kind)
        self.cache.setdefault(kind, {})[metric_name] = metric
        return metric

    def get_metric(self, metric_name: str, metric_type: Any = MetricType.COUNTER) -> RecordedMetric:
        """A declared metric.

        Raises:
            KeyError: no metric of that name and type (TorchServe raises ``MetricsCacheKeyError``).
        """
        kind = _metric_type(metric_type)
        try:
            return self.cache[kind][metric_name]
        except KeyError:
            raise KeyError(
                f"Metric of type '{kind.value}' and name '{metric_name}' doesn't exist"
            ) from None

    # -- reading back --------------------------------------------------------------------

    def find(self, name: str) -> list[MetricRecord]:
        """Every record of metric ``name``, oldest first."""
        return [r for r in self.records if r.name == name]

    def last(self, name: str) -> MetricRecord | None:
        """The latest record of metric ``name``, or None."""
        for record in reversed(self.records):
            if record.name == name:
                return record
        return None

    def names(self) -> list[str]:
        """The metric names recorded, in first-seen order."""
        return list(dict.fromkeys(r.name for r in self.records))

    def mark(self) -> int:
        """A position in the record stream; pass it to :meth:`since`."""
        return self._dropped + len(self.records)

    def since(self, mark: int) -> list[MetricRecord]:
        """The records added after :meth:`mark` returned ``mark`` (still held: not cleared)."""
        return self.records[max(0, mark - self._dropped) :]

    def clear(self) -> None:
        """Forget the records (declared metrics stay); earlier marks stay valid."""
        self._dropped += len(self.records)
        self.records.clear()

    def __len__(self) -> int:
        return len(self.records)

    def __bool__(self) -> bool:
        # A store with no records yet is still a store: `if context.metrics:` must not skip it.
        return True

    def __iter__(self) -> Iterator[MetricRecord]:
        return iter(list(self.records))

    def __repr__(self) -> str:
        names = self.names()
        shown = ", ".join(names[:6]) + (", …" if len(names) > 6 else "")
        return f"RecordingMetrics({len(self.records)} records: {shown or 'none'})"

    # -- internals -------------------------------------------------------------------------

    def _record(self, record: MetricRecord) -> None:
        self.records.append(record)

    def _get_req(self, idx: int | None) -> str | None:
        # TorchServe: all ids joined by commas, or the one at batch index `idx` when known.
        ids = self.request_ids
        if isinstance(ids, Mapping):
            if idx is not None and idx in ids:
                return ids[idx]
            return ",".join(str(v) for v in ids.values())
        return ids

    def _add(
        self,
        name: str,
        value: float,
        unit: str,
        idx: int | None,
        dimensions: Any,
        metric_type: Any,
    ) -> None:
        kind = _metric_type(metric_type)
        req_id = self._get_req(idx)
        dims = _dimensions(dimensions)
        if req_id is None:
            dims.setdefault("Level", "Error")
        else:
            dims.setdefault("ModelName", self.model_name)
            dims.setdefault("Level", "Model")
        metric = self._get_or_add(name, unit, dims, kind)
        metric.add_or_update(value, list(dims.values()), req_id)

    def _get_or_add(self, name: str, unit: str, dims: dict, kind: MetricType) -> RecordedMetric:
        # As in TorchServe, the first call declares the metric; later calls reuse its unit
        # and dimension names.
        try:
            return self.get_metric(name, kind)
        except KeyError:
            return self.add_metric_to_cache(name, unit, list(dims), kind)


# --------------------------------------------------------------------------------------------
# The context
# --------------------------------------------------------------------------------------------


class _IntermediateResponses:
    """Stands in for the worker socket: keeps what ``send_intermediate_predict_response`` sends."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def sendall(self, data: bytes | bytearray) -> None:
        self.sent.append(bytes(data))

    def __repr__(self) -> str:
        return f"<intermediate responses: {len(self.sent)} sent>"


class MockContext:
    """A stand-in for TorchServe's ``ts.context.Context``, for running handlers outside the server.

    A handler gets everything it reads from TorchServe's context: ``model_name``, ``manifest``,
    ``system_properties`` (``model_dir``, ``gpu_id``, ``batch_size``, ``server_name``,
    ``server_version``, ``limit_max_image_pixels``), ``model_yaml_config`` (a plain dict),
    ``metrics``, per-request headers and response status. It is duck-typed: handlers written
    for TorchServe take it unchanged, and ``ts`` need not be installed.

    Build it from a model dir (reads ``MAR-INF/MANIFEST.json`` or infers one, loads the model
    config)::

        ctx = MockContext.from_model_dir("fixtures/models/shapes")

    or with the arguments of TorchServe's own test ``MockContext``::

        ctx = MockContext(model_pt_file="model.pt", model_dir="models/mnist", gpu_id=None)

    Give it a batch of requests (``handlerkit.requests.Batch.bind`` does this, as TorchServe's
    worker does before every call), run the handler, then read what it set::

        batch = hk.batch(hk.Request.json({"x": 1}))
        batch.bind(ctx)
        out = handler.handle(batch.data, ctx)
        ctx.responses()        # [ResponseInfo(code=200, phrase=None, headers={...})]
        ctx.metrics.find("HandlerTime")

    ``gpu_id`` is stored as given, ``None`` included. TorchServe's test MockContext drops it
    when CUDA is absent; here the handler decides, as in the server: ``BaseHandler`` uses CUDA
    only when CUDA is available *and* ``gpu_id`` is not None.

    Before any batch is bound the context holds one placeholder request (a fresh id, no
    headers), so a handler that reads headers in ``initialize`` works.

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

    Attributes:
        inferred: for :meth:`from_model_dir` without a MANIFEST, each manifest key handlerkit
            inferred and why; empty otherwise.
        cl_socket: collects intermediate (streaming) responses in ``cl_socket.sent``.
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
    ) -> None:
        model_dir = os.path.abspath(os.fspath(model_dir) if model_dir is not None else os.getcwd())
        if model_yaml_config is not None and model_yaml_config_file:
            raise ValueError("pass model_yaml_config or model_yaml_config_file, not both")
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
            config = _read_yaml(Path(model_dir, model_yaml_config_file))
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
        self.metrics = metrics if metrics is not None else RecordingMetrics()
        if getattr(self.metrics, "model_name", "") is None:
            # TorchServe's worker names the metrics cache after the model it loads.
            self.metrics.model_name = model_name
        self.stopping_criteria: list | None = None
        self.header_key_sequence_id = os.getenv("TS_REQUEST_SEQUENCE_ID", "ts_request_sequence_id")
        self.header_key_sequence_start = os.getenv(
            "TS_REQUEST_SEQUENCE_START", "ts_request_sequence_start"
        )
        self.header_key_sequence_end = os.getenv("TS_REQUEST_SEQUENCE_END", "ts_request_sequence_end")
        self.cl_socket = _IntermediateResponses()
        self.inferred: dict[str, str] = {}
        self.request_ids: dict[int, str] | None = None
        self.request_processor: list[RequestProcessor] | None = None
        bind_requests(self, {0: str(uuid.uuid4())}, [{}])

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

    def get_request_header(self, idx: int, key: str) -> Any:
        """Header ``key`` of request ``idx`` (exact, case-sensitive name), or None.

        A parameter name as ``key`` gives ``{"content-type": ...}`` for that parameter.
        """
        return self.request_processor[idx].get_request_property(key)

    def get_all_request_header(self, idx: int) -> dict:
        """All headers of request ``idx``."""
        return self.request_processor[idx].get_request_properties()

    def set_response_content_type(self, idx: int, value: str) -> None:
        """Set the ``content-type`` response header of request ``idx``."""
        self.set_response_header(idx, "content-type", value)

    def get_response_content_type(self, idx: int) -> str | None:
        """The ``content-type`` response header of request ``idx``, or None."""
        return self.get_response_headers(idx).get("content-type")

    def get_response_status(self, idx: int) -> tuple[int, str | None]:
        """``(code, phrase)`` of request ``idx``."""
        rp = self.request_processor[idx]
        return rp.get_response_status_code(), rp.get_response_status_phrase()

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        """Set the HTTP status of request ``idx``."""
        if self.request_processor is not None and self.request_processor[idx] is not None:
            self.request_processor[idx].report_status(code, reason_phrase=phrase)

    def set_all_response_status(self, code: int = 200, phrase: str = "") -> None:
        """Set the HTTP status of every request in the batch."""
        for rp in self.request_processor:
            rp.report_status(code, reason_phrase=phrase)

    def get_response_headers(self, idx: int) -> dict[str, str]:
        """The response headers of request ``idx``."""
        return self.request_processor[idx].get_response_headers()

    def set_response_header(self, idx: int, key: str, value: str) -> None:
        """Set a response header of request ``idx``."""
        self.request_processor[idx].add_response_property(key, value)

    def get_sequence_id(self, idx: int) -> str | None:
        """The sequence id header of request ``idx`` (name from ``TS_REQUEST_SEQUENCE_ID``)."""
        return self.request_processor[idx].get_request_property(self.header_key_sequence_id)

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
    ) -> MockContext:
        """A context for an unpacked model archive (or a dir laid out like one).

        The manifest comes from ``MAR-INF/MANIFEST.json`` when present. Otherwise it is
        inferred from the files: ``serializedFile`` is the single weights file (``*.pt``,
        ``*.pth``, ``*.bin``, ``*.onnx``, ``*.pt2``, ``*.so``, ``*.safetensors``),
        ``modelFile`` is ``model.py``, ``handler`` is ``handler.py``, ``configFile`` is
        ``model-config.yaml`` (each only when present), ``modelName`` the dir name. One
        :class:`HandlerkitWarning` says what was inferred; :attr:`inferred` keeps it.

        The model config is the ``config`` argument, else the manifest's ``configFile``
        (TorchServe loads nothing else). ``batch_size`` defaults to the config's
        ``batchSize``, else 1.

        Args:
            path: the model dir.
            gpu_id: ``system_properties["gpu_id"]`` (None: CPU, as TorchServe without GPUs).
            batch_size: overrides the config's ``batchSize``.
            model_name: overrides the manifest's ``modelName``.
            config: a model config YAML to load instead; a relative path is looked up in the
                model dir, then in the working directory.
            limit_max_image_pixels: ``system_properties["limit_max_image_pixels"]``.

        Raises:
            ModelLoadError: a missing dir, a malformed MANIFEST.json, several candidate weights
                files, or a config file that does not exist.
            ConfigError: a config file that is not a YAML mapping.
        """
        model_dir = Path(path).expanduser()
        if not model_dir.is_dir():
            what = "is not a directory" if model_dir.exists() else "does not exist"
            raise ModelLoadError(
                f"model dir {os.fspath(path)!r} {what}; pass the folder holding the model "
                "files (an unpacked .mar)",
                path=os.fspath(path),
            )
        model_dir = model_dir.resolve()
        manifest_path = model_dir / "MAR-INF" / "MANIFEST.json"
        if manifest_path.is_file():
            manifest, inferred = _read_manifest(manifest_path), {}
        else:
            manifest, inferred = _infer_manifest(model_dir, model_name)
            _warn_inferred(model_dir, manifest, inferred)
        model = manifest["model"]

        config_path = _config_path(model_dir, config, model, manifest_from_file=not inferred)
        yaml_config = _read_yaml(config_path) if config_path is not None else {}
        if batch_size is None:
            batch_size = _config_batch_size(yaml_config, config_path)

        ctx = cls(
            model_dir=model_dir,
            gpu_id=gpu_id,
            model_name=model_name or model.get("modelName") or model_dir.name,
            manifest=manifest,
            batch_size=batch_size,
            limit_max_image_pixels=limit_max_image_pixels,
            model_yaml_config=yaml_config,
        )
        ctx.inferred = inferred
        return ctx


# --------------------------------------------------------------------------------------------
# Model dir helpers
# --------------------------------------------------------------------------------------------

_WEIGHTS_SUFFIXES = (".pt", ".pth", ".bin", ".onnx", ".pt2", ".so", ".safetensors")


def _plain_config(config: Any) -> dict[str, Any]:
    """A plain dict from None, a mapping, or an object with a ``.raw`` mapping (ModelConfig)."""
    if config is None:
        return {}
    raw = getattr(config, "raw", config)
    if not isinstance(raw, Mapping):
        raise TypeError(f"model_yaml_config must be a mapping: got {type(config).__name__}")
    return dict(raw)


def _read_yaml(path: Path) -> dict[str, Any]:
    """Parse a model config YAML into a plain dict ({} for an empty file)."""
    import yaml  # pyyaml is a dependency; imported here to keep `import handlerkit` light

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelLoadError(f"model config {str(path)!r} does not exist", path=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read model config {str(path)!r}: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"model config {str(path)!r} is not valid YAML: {exc}. Fix the file (YAML uses "
            "spaces, not tabs, for indentation)"
        ) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"model config {str(path)!r} must be a YAML mapping (key: value lines): got a "
            f"{type(data).__name__}"
        )
    return data


def _read_manifest(path: Path) -> dict[str, Any]:
    fix = (
        "fix the file, or delete MAR-INF/MANIFEST.json to let handlerkit infer the manifest "
        "from the files"
    )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path} is not valid JSON ({exc}); {fix}", path=str(path)) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}; {fix}", path=str(path)) from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("model"), dict):
        raise ModelLoadError(
            f"{path} must be a JSON object with a \"model\" object, as torch-model-archiver "
            f'writes: {{"runtime": "python", "model": {{"modelName": ..., "handler": ...}}}}; {fix}',
            path=str(path),
        )
    return manifest


def _infer_manifest(model_dir: Path, model_name: str | None) -> tuple[dict[str, Any], dict[str, str]]:
    files = sorted(p.name for p in model_dir.iterdir() if p.is_file())
    weights = [name for name in files if name.endswith(_WEIGHTS_SUFFIXES)]
    if len(weights) > 1:
        raise ModelLoadError(
            f"model dir {str(model_dir)!r} has several weights files: {', '.join(weights)}; "
            "handlerkit cannot tell which is the model. Write MAR-INF/MANIFEST.json naming "
            '"serializedFile" (torch-model-archiver --serialized-file does), or keep only one',
            path=str(model_dir),
        )
    model: dict[str, Any] = {}
    inferred: dict[str, str] = {}
    if model_name:
        model["modelName"], inferred["modelName"] = model_name, "the model_name argument"
    else:
        model["modelName"], inferred["modelName"] = model_dir.name, "the model dir's name"
    if weights:
        model["serializedFile"] = weights[0]
        inferred["serializedFile"] = "the only weights file in the dir"
    optional = (("modelFile", "model.py"), ("handler", "handler.py"), ("configFile", "model-config.yaml"))
    for key, filename in optional:
        if filename in files:
            model[key], inferred[key] = filename, f"{filename} is in the dir"
    model["modelVersion"], inferred["modelVersion"] = "1.0", "default"
    inferred["runtime"] = "default"
    return {"runtime": "python", "model": model}, inferred


def _warn_inferred(model_dir: Path, manifest: dict[str, Any], inferred: dict[str, str]) -> None:
    model = manifest["model"]
    parts = []
    for key, why in inferred.items():
        value = manifest["runtime"] if key == "runtime" else model[key]
        parts.append(f"{key}={value!r} ({why})")
    if "serializedFile" not in model:
        parts.append(f"no serializedFile (no {'/'.join('*' + s for s in _WEIGHTS_SUFFIXES)} file)")
    warnings.warn(
        f"handlerkit: {model_dir} has no MAR-INF/MANIFEST.json; inferred the manifest from the "
        f"files: {'; '.join(parts)}. Write MAR-INF/MANIFEST.json to make this explicit",
        HandlerkitWarning,
        stacklevel=_user_stacklevel(),
    )


def _config_path(
    model_dir: Path,
    config: str | os.PathLike[str] | None,
    model: Mapping[str, Any],
    *,
    manifest_from_file: bool,
) -> Path | None:
    if config is not None:
        given = Path(config).expanduser()
        if given.is_absolute():
            return given
        for candidate in (model_dir / given, Path.cwd() / given):
            if candidate.is_file():
                return candidate
        raise ModelLoadError(
            f"config {os.fspath(config)!r} not found in the model dir ({model_dir}) nor in the "
            f"working directory ({Path.cwd()})",
            path=os.fspath(config),
        )
    name = model.get("configFile")
    if name:
        path = model_dir / name
        if not path.is_file():
            raise ModelLoadError(
                f"the manifest names configFile {name!r} but {path} does not exist; add the file "
                "or remove configFile from MAR-INF/MANIFEST.json",
                path=str(path),
            )
        return path
    if manifest_from_file and (model_dir / "model-config.yaml").is_file():
        warnings.warn(
            f"handlerkit: {model_dir / 'model-config.yaml'} is not loaded: MAR-INF/MANIFEST.json "
            "names no configFile, so TorchServe would not load it either (archive with "
            "--config-file model-config.yaml, or pass config=)",
            HandlerkitWarning,
            stacklevel=_user_stacklevel(),
        )
    return None


def _config_batch_size(config: Mapping[str, Any], path: Path | None) -> int:
    value = config.get("batchSize", 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"batchSize in {path} must be a positive integer: got {value!r}")
    return value
