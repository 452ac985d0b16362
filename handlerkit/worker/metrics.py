"""A recording implementation of TorchServe's metrics API (``context.metrics``).

:class:`RecordingMetrics` has the methods of TorchServe 0.12's metrics cache
(``ts/metrics/metric_cache_abstract.py``) — ``add_counter``, ``add_time`` (ms), ``add_size``
(MB), ``add_percent``, ``add_error``, ``add_metric``, ``add_metric_to_cache`` and
``get_metric`` — and follows its rules for units, dimensions and request ids, but records
every value as a :class:`MetricRecord` instead of logging it, so a notebook or a test can read
them back (``find``, ``last``, ``mark``/``since``).

Given a metrics config (:mod:`handlerkit.worker.metrics_config`: TorchServe's metrics YAML) the store is
the one TorchServe's worker builds from it; without one it is permissive (see the class).

Nothing here imports ``ts`` or ``torch``.
"""

from __future__ import annotations

import numbers
import socket
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from handlerkit._stack import user_stacklevel as _user_stacklevel
from handlerkit.errors import HandlerkitWarning
from handlerkit.worker.metrics_config import (
    MetricsConfig,
    MetricType,
    UndeclaredMetricError,
    _metric_type,
    undeclared_error,
)

__all__ = ["Dimension", "MetricRecord", "MetricType", "RecordedMetric", "RecordingMetrics", "UndeclaredMetricError"]


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
            f"dimensions must be a list of Dimension(name, value) objects or a dict: got {type(dimensions).__name__}"
        )
    out: dict[str, Any] = {}
    for dim in dimensions:
        if hasattr(dim, "name") and hasattr(dim, "value"):
            out[dim.name] = dim.value
        elif isinstance(dim, tuple) and len(dim) == 2:
            out[dim[0]] = dim[1]
        else:
            raise TypeError(f"each dimension must be a Dimension(name, value) or a (name, value) pair: got {dim!r}")
    return out


def _check_value(name: str, value: Any) -> None:
    # TorchServe raises TypeError for a non-numeric counter (from its `value < 0` check) and
    # would log a gauge of any type; a metric that is not a number is a bug either way.
    if not isinstance(value, numbers.Real):
        hint = " (call .item() on a tensor)" if hasattr(value, "item") else ""
        raise TypeError(f"metric {name!r} needs a number: got {type(value).__name__} {value!r}{hint}")


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
        """The line TorchServe's worker logs for it (``CachingMetric.emit_metrics``).

        ``[METRICS]name.unit:value|#dims|#type:KIND|#hostname:host,time`` and, when there is a
        request id, ``,request_id``; the time is :attr:`timestamp` in whole seconds.
        """
        dims = ",".join(f"{k}:{v}" for k, v in self.dimensions.items())
        line = (
            f"[METRICS]{self.name}.{self.unit_name}:{self.value}|#{dims}|#type:{self.metric_type.upper()}"
            f"|#hostname:{socket.gethostname()},{int(self.timestamp)}"
        )
        return f"{line},{self.request_id}" if self.request_id else line


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

    def add_or_update(self, value: float, dimension_values: Sequence[Any] = (), request_id: str | None = "") -> None:
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

    With ``config`` (a :class:`~handlerkit.worker.metrics_config.MetricsConfig`) it is the store
    TorchServe's worker builds from that metrics YAML: its ``model_metrics`` are declared up
    front, so ``get_metric("HandlerTime", MetricTypes.GAUGE)`` works where it works in the
    server and raises :class:`UndeclaredMetricError` (a ``KeyError``) where it fails there;
    metric types must be enum members (TorchServe rejects ``"gauge"``) and dimension names a
    list. Without a config nothing is declared up front and type names are accepted.

    Attributes:
        model_name: written into the ``ModelName`` dimension.
        request_ids: batch index → request id, set per batch (as ``Service.predict`` does).
        records: every value recorded, oldest first.
        config: the metrics config followed, or None (permissive).
    """

    def __init__(
        self, model_name: str | None = None, request_ids: Any = None, *, config: MetricsConfig | None = None
    ) -> None:
        self.model_name = model_name
        self.request_ids = request_ids
        self.records: list[MetricRecord] = []
        self.cache: dict[MetricType, dict[str, RecordedMetric]] = {}
        self.config = config
        self._dropped = 0  # records removed by clear(), so marks stay valid
        for spec in config.model_metrics if config is not None else ():  # as initialize_cache does
            self._declare(spec.name, spec.unit, list(spec.dimensions), spec.metric_type)

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
            raise ValueError(f"the unit for a size based metric is one of ['MB', 'kB', 'GB', 'B']: got {unit!r}")
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
        """Declare a metric (replacing one of the same name and type, as TorchServe does) and return it.

        With a config, replacing a metric the config declares with another unit or other
        dimension names issues a :class:`HandlerkitWarning`: TorchServe's frontend still
        expects what the YAML declares.

        Raises:
            TypeError: a name or unit that is not a str, dimension names that are not a list,
                or an unknown metric type (TorchServe raises ``MetricsCacheTypeError``, a TypeError).
        """
        if not isinstance(metric_name, str):
            raise TypeError(f"`metric_name` must be a str: got {metric_name!r}")
        if not isinstance(unit, str):
            raise TypeError(f"`unit` must be a str: got {unit!r}")
        allowed = list if self.config is not None else (list, tuple)  # TorchServe wants a list
        if dimension_names and not isinstance(dimension_names, allowed):
            raise TypeError(f"`dimension_names` should be a list of dimension name strings: got {dimension_names!r}")
        kind = _metric_type(metric_type, strict=self.config is not None)
        spec = self.config.get(metric_name, kind) if self.config is not None else None
        if (
            spec is not None
            and self.config is not None
            and (unit, tuple(dimension_names or ())) != (spec.unit, spec.dimensions)
        ):
            warnings.warn(
                f"handlerkit: add_metric_to_cache({metric_name!r}) replaces the {kind.value} that "
                f"{self.config.source} declares (unit {spec.unit!r}, dimensions "
                f"{list(spec.dimensions)}) with unit {unit!r}, dimensions {list(dimension_names or [])}; "
                "TorchServe's worker does the same, but its frontend keeps the YAML's declaration",
                HandlerkitWarning,
                stacklevel=_user_stacklevel(),
            )
        return self._declare(metric_name, unit, dimension_names, kind)

    def get_metric(self, metric_name: str, metric_type: Any = MetricType.COUNTER) -> RecordedMetric:
        """A declared metric: from the metrics config, or by ``add_metric_to_cache`` / ``add_*``.

        Raises:
            UndeclaredMetricError: no metric of that name and type (a ``KeyError``, like
                TorchServe's ``MetricsCacheKeyError``, with the same message).
            TypeError: ``metric_name`` is not a str, or ``metric_type`` is not a metric type
                (with a config: not an enum member, as TorchServe requires).
        """
        if not isinstance(metric_name, str):
            raise TypeError(f"`metric_name` must be a str: got {metric_name!r}")
        kind = _metric_type(metric_type, strict=self.config is not None)
        try:
            return self.cache[kind][metric_name]
        except KeyError:
            raise undeclared_error(metric_name, kind, self.cache, self.config) from None

    def undeclared_names(self) -> list[str]:
        """Recorded metric names that the config does not declare under ``model_metrics``.

        TorchServe's frontend drops the values of such metrics (matching by name) unless
        config.properties sets ``model_metrics_auto_detect=true``. Empty without a config.
        """
        if self.config is None:
            return []
        declared = set(self.config.names())
        return [name for name in self.names() if name not in declared]

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

    def since(self, mark: int, until: int | None = None) -> list[MetricRecord]:
        """The records added after :meth:`mark` returned ``mark`` (still held: not cleared), and
        before it returned ``until`` when given."""
        start = max(0, mark - self._dropped)
        return self.records[start:] if until is None else self.records[start : max(0, until - self._dropped)]

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

    def _add(self, name: str, value: float, unit: str, idx: int | None, dimensions: Any, metric_type: Any) -> None:
        kind = _metric_type(metric_type, strict=self.config is not None)
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
        # As in TorchServe, the first call declares the metric; later calls (and a metric the
        # config declares) keep their unit and dimension names.
        metric = self.cache.get(kind, {}).get(name)
        return metric if metric is not None else self._declare(name, unit, list(dims), kind)

    def _declare(self, name: str, unit: str, dimension_names: Sequence[str] | None, kind: MetricType) -> RecordedMetric:
        metric = RecordedMetric(self, name, unit, dimension_names, kind)
        self.cache.setdefault(kind, {})[name] = metric
        return metric
