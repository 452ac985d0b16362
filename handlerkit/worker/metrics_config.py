"""TorchServe's metrics configuration: the metrics a model's ``context.metrics`` starts with.

TorchServe 0.12's worker builds ``context.metrics`` from a metrics YAML: the file named by
``metrics_config`` in config.properties, else the server's own ``ts/configs/metrics.yaml``
(``ts/model_service_worker.py``, ``ts/metrics/metric_cache_yaml_impl.py``). Every metric under
``model_metrics`` is declared in the cache before the handler runs, so
``context.metrics.get_metric("RequestBatchSize", MetricTypes.GAUGE)`` works only when the YAML
declares it (or the handler declared it with ``add_metric_to_cache``). The ``ts_metrics`` section
is the frontend's own (queue time, CPU…): a handler cannot reach those.

:func:`load_metrics_config` reads such a YAML the way the worker does, reports every problem that
would stop the worker (or the Java frontend) at once, and returns a :class:`MetricsConfig` for
:class:`~handlerkit.worker.metrics.RecordingMetrics`. With no path it returns TorchServe 0.12's default,
kept here as data so that handlerkit does not need the ``ts`` package::

    config = load_metrics_config("metrics.yaml")
    config.get("RequestBatchSize", "gauge")   # MetricSpec(... unit='count', dimensions=('ModelName',))
    metrics = RecordingMetrics("mnist", config=config)

:class:`MetricType` and :class:`UndeclaredMetricError` (what ``get_metric`` raises for a metric
that is not declared) live here too; :mod:`handlerkit.worker.metrics` re-exports them.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from handlerkit._stack import user_stacklevel
from handlerkit._text import did_you_mean, suggestion
from handlerkit._validate import describe, read_yaml
from handlerkit.errors import ConfigError, HandlerkitError, HandlerkitWarning

__all__ = [
    "DEFAULT_SOURCE",
    "MetricSpec",
    "MetricType",
    "MetricsConfig",
    "UndeclaredMetricError",
    "load_metrics_config",
    "parse_metrics_config",
]


class MetricType(Enum):
    """A metric's type; TorchServe's ``ts.metrics.metric_type_enum.MetricTypes`` is accepted too."""

    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


#: The ``source`` of the config used when none is given.
DEFAULT_SOURCE = "TorchServe 0.12's default metrics config (ts/configs/metrics.yaml)"

_SECTIONS = ("dimensions", "ts_metrics", "model_metrics")
_ENTRY_KEYS = ("name", "unit", "dimensions")
_TYPES = tuple(t.value for t in MetricType)
# SnakeYAML refuses unknown properties; MetricCache.java then logs the error and keeps no metric.
_FRONTEND_FAILS = " (the frontend fails to load the file and drops every metric)"
_EXAMPLE = "model_metrics: {gauge: [{name: RequestBatchSize, unit: count, dimensions: [ModelName]}]}"


@dataclass(frozen=True)
class MetricSpec:
    """One metric declared in a metrics YAML.

    Attributes:
        name: the metric name.
        metric_type: counter, gauge or histogram.
        unit: the unit as written (``"ms"``, ``"count"``, ``"Milliseconds"``…).
        dimensions: the dimension names, in order; ``add_or_update`` takes one value for each.
    """

    name: str
    metric_type: MetricType
    unit: str
    dimensions: tuple[str, ...] = ()


@dataclass(frozen=True)
class MetricsConfig:
    """A TorchServe metrics YAML, read and checked.

    Attributes:
        model_metrics: the metrics the worker declares in ``context.metrics`` before the handler
            runs, in file order (a name declared twice for one type keeps the last, as in
            TorchServe).
        source: where it came from: a path, or :data:`DEFAULT_SOURCE`.
        ts_metrics: the frontend's metrics; handlers cannot get them.
    """

    model_metrics: tuple[MetricSpec, ...]
    source: str
    ts_metrics: tuple[MetricSpec, ...] = ()

    @property
    def is_default(self) -> bool:
        """True for TorchServe's default config (no ``metrics_config`` given)."""
        return self.source == DEFAULT_SOURCE

    def get(self, name: str, metric_type: Any = MetricType.COUNTER) -> MetricSpec | None:
        """The model metric declared with this name and type (a MetricType, TorchServe's
        MetricTypes or a type name), or None."""
        kind = _metric_type(metric_type)
        for spec in self.model_metrics:
            if spec.name == name and spec.metric_type is kind:
                return spec
        return None

    def names(self) -> list[str]:
        """The model metric names, in file order."""
        return list(dict.fromkeys(spec.name for spec in self.model_metrics))

    def __repr__(self) -> str:
        shown = ", ".join(f"{s.metric_type.value} {s.name}" for s in self.model_metrics[:6])
        more = ", …" if len(self.model_metrics) > 6 else ""
        return f"MetricsConfig({self.source!r}: {shown or 'no model metrics'}{more})"


def _metric_type(value: Any, *, strict: bool = False) -> MetricType:
    """Our MetricType, TorchServe's MetricTypes (compared by value) or, unless ``strict``, a type name."""
    if isinstance(value, MetricType):
        return value
    if strict and not isinstance(value, Enum):
        # TorchServe 0.12's cache checks isinstance(metric_type, MetricTypes) in get_metric and
        # add_metric_to_cache (add_metric and add_time go through them): "gauge" fails there.
        guess = did_you_mean(str(value), [t.value for t in MetricType])
        use = f"MetricTypes.{guess.upper()}" if guess else "MetricTypes.COUNTER, GAUGE or HISTOGRAM"
        raise TypeError(
            f"`metric_type` must be a MetricTypes enum: got {value!r}, which TorchServe 0.12 refuses "
            f"(MetricsCacheTypeError); pass {use} (from ts.metrics.metric_type_enum import MetricTypes)"
        )
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


class UndeclaredMetricError(HandlerkitError, KeyError):
    """``get_metric`` found no metric of that name and type.

    TorchServe raises ``MetricsCacheKeyError``, a ``KeyError``, with the same message; this is a
    ``KeyError`` too, so a handler's ``except KeyError`` behaves as in the server.

    Attributes:
        metric_name: the name asked for.
        metric_type: the type asked for.
    """

    def __init__(self, message: str, *, metric_name: str, metric_type: MetricType, fix: str | None = None):
        super().__init__(message, fix=fix)
        self.metric_name = metric_name
        self.metric_type = metric_type


def undeclared_error(
    name: str, kind: MetricType, declared: Mapping[MetricType, Mapping[str, Any]], config: MetricsConfig | None
) -> UndeclaredMetricError:
    """The error for ``get_metric(name, kind)`` on a store holding ``declared`` (type → name → metric)."""
    # TorchServe's message first (it formats its MetricTypes member with str()), then what we know.
    message = f"Metric of type 'MetricTypes.{kind.name}' and name '{name}' doesn't exist"
    declare = f"add_metric_to_cache({name!r}, unit, dimension_names, MetricTypes.{kind.name})"
    other = [t for t, metrics in declared.items() if name in metrics and t is not kind]
    close = did_you_mean(name, declared.get(kind, {}))
    if other:
        by = config.source if config is not None and config.get(name, other[0]) else "the handler"
        message += f"; {by} declares it as a {other[0].value}"
        fix = f"ask for it as MetricTypes.{other[0].name}, or declare the {kind.value} with {declare}"
    elif close is not None:
        message += f"; did you mean {close!r}?"
        fix = f"get_metric({close!r}, MetricTypes.{kind.name})"
    elif config is None:
        fix = (
            f"declare it first with {declare}; for the metrics a TorchServe metrics YAML declares, "
            "give the store its config: RecordingMetrics(config=load_metrics_config(path))"
        )
    else:
        if any(spec.name == name for spec in config.ts_metrics):
            message += "; it is a frontend metric (ts_metrics), which handlers cannot get"
        where = (
            "a metrics YAML and pass it as metrics_config=<path> (TorchServe: metrics_config in config.properties)"
            if config.is_default
            else f"{config.source} (metrics_config={config.source})"
        )
        fix = f"declare it under model_metrics: {kind.value}: in {where}, or add it in the handler with {declare}"
    return UndeclaredMetricError(message, metric_name=name, metric_type=kind, fix=fix)


def load_metrics_config(path: str | os.PathLike[str] | MetricsConfig | None = None) -> MetricsConfig:
    """Read a TorchServe metrics YAML (config.properties' ``metrics_config``).

    Args:
        path: the YAML file; None for TorchServe 0.12's default config (which declares the
            gauges ``HandlerTime`` and ``PredictionTime``, in ms, with dimensions
            ``ModelName, Level``); a :class:`MetricsConfig` is returned as it is.

    Returns:
        The checked config.

    Raises:
        ConfigError: the file is missing or unreadable, is not YAML, or declares metrics that
            TorchServe 0.12's worker or frontend would refuse (all problems in ``problems``).
        TypeError: ``path`` is not a path, a MetricsConfig or None.
    """
    if path is None:
        return _default_config()
    if isinstance(path, MetricsConfig):
        return path
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"metrics_config must be the path of a metrics YAML, a MetricsConfig or None: got "
            f"{type(path).__name__} {path!r}"
        )
    source = os.fspath(path)
    data = read_yaml(
        source,
        what="metrics config",
        missing_fix="pass the path of a TorchServe metrics YAML (config.properties' metrics_config; "
        "ts/configs/metrics.yaml is a starting point), or metrics_config=None for TorchServe's default",
    )
    return parse_metrics_config(data, source)


def parse_metrics_config(data: Any, source: str) -> MetricsConfig:
    """Check an already-loaded metrics YAML (``yaml.safe_load`` output) named ``source``.

    Raises:
        ConfigError: as :func:`load_metrics_config`.
    """
    if data is None:
        raise ConfigError(
            f"{source}: the metrics config is empty; TorchServe 0.12's worker needs a model_metrics section",
            fix=f"declare the handler's metrics, e.g. {_EXAMPLE}",
        )
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{source}: the metrics config must be a mapping with ts_metrics and model_metrics "
            f"sections: got {type(data).__name__}",
            fix=f"write it like {_EXAMPLE}",
        )
    problems: list[str] = []
    for key in data:
        if key not in _SECTIONS:
            problems.append(
                f"unknown section {key!r}{suggestion(str(key), _SECTIONS)}; the "
                f"frontend knows only {', '.join(_SECTIONS)}{_FRONTEND_FAILS}"
            )
    if "dimensions" in data and not isinstance(data["dimensions"], list):
        problems.append(f"dimensions: expected a list of names: got {describe(data['dimensions'])}{_FRONTEND_FAILS}")
    if "model_metrics" not in data:
        problems.append(
            "no model_metrics section; TorchServe 0.12's worker fails to start "
            "(\"'model_metrics' key not found in yaml file\")"
        )
    elif not data["model_metrics"]:
        problems.append(
            'model_metrics is empty; TorchServe 0.12\'s worker fails to start ("Missing `model_metrics` specification")'
        )
    model = _section(data.get("model_metrics"), "model_metrics", problems, needs_dimensions=True)
    frontend = _section(data.get("ts_metrics"), "ts_metrics", problems, needs_dimensions=False)
    if problems:
        listed = "".join(f"\n  - {p}" for p in problems)
        raise ConfigError(
            f"{source}: {len(problems)} problem{'s' if len(problems) > 1 else ''} in the metrics "
            f"config that TorchServe 0.12 would refuse:{listed}",
            fix="declare each metric as {name: ..., unit: ..., dimensions: [...]} in a list "
            "under counter:, gauge: or histogram:, e.g. " + _EXAMPLE,
            problems=problems,
        )
    return MetricsConfig(model_metrics=_last_wins(model, source), source=source, ts_metrics=tuple(frontend))


def _section(value: Any, where: str, problems: list[str], *, needs_dimensions: bool) -> list[MetricSpec]:
    """The specs of one section ({type: [entry, ...]}); problems are appended, not raised."""
    if not value:
        return []
    if not isinstance(value, Mapping):
        problems.append(f"{where}: expected a mapping of counter/gauge/histogram to lists: got {describe(value)}")
        return []
    specs: list[MetricSpec] = []
    for type_name, entries in value.items():
        if type_name not in _TYPES:
            problems.append(
                f"{where}: invalid metric type {type_name!r}"
                f"{suggestion(str(type_name), _TYPES)}; the types are {', '.join(_TYPES)}"
            )
            continue
        if not isinstance(entries, list):
            problems.append(f"{where}.{type_name}: expected a list of metrics: got {describe(entries)}")
            continue
        for i, entry in enumerate(entries):
            spec = _entry(entry, f"{where}.{type_name}[{i}]", MetricType(type_name), problems, needs_dimensions)
            if spec is not None:
                specs.append(spec)
    return specs


def _entry(entry: Any, where: str, kind: MetricType, problems: list[str], needs_dimensions: bool) -> MetricSpec | None:
    if not isinstance(entry, Mapping):
        problems.append(f"{where}: expected {{name: ..., unit: ..., dimensions: [...]}}: got {describe(entry)}")
        return None
    found = len(problems)
    for key in entry:
        if key not in _ENTRY_KEYS:
            problems.append(
                f"{where}: unknown key {key!r}{suggestion(str(key), _ENTRY_KEYS)}; "
                f"a metric has name, unit and dimensions{_FRONTEND_FAILS}"
            )
    for key in ("name", "unit"):
        value = entry.get(key)
        if not isinstance(value, str) or not value:
            problems.append(f"{where}.{key}: expected a non-empty string: got {describe(value)}")
    dims = entry.get("dimensions")
    if dims is None:
        if needs_dimensions:  # the worker reads the key, the frontend appends Hostname to the list
            problems.append(f"{where}: no dimensions; TorchServe 0.12 needs a list here (dimensions: [] for none)")
    elif not (isinstance(dims, list) and all(isinstance(d, str) for d in dims)):
        problems.append(f"{where}.dimensions: expected a list of names: got {describe(dims)}")
    if len(problems) > found:
        return None
    return MetricSpec(entry["name"], kind, entry["unit"], tuple(dims or ()))


def _last_wins(specs: list[MetricSpec], source: str) -> tuple[MetricSpec, ...]:
    # TorchServe's cache keeps the last declaration of a (type, name) and logs "Overriding".
    kept: dict[tuple[MetricType, str], MetricSpec] = {}
    for spec in specs:
        key = (spec.metric_type, spec.name)
        if key in kept:
            warnings.warn(
                f"handlerkit: {source}: model_metrics.{spec.metric_type.value} declares "
                f"{spec.name!r} twice; TorchServe keeps the last one (unit {spec.unit!r}, "
                f"dimensions {list(spec.dimensions)})",
                HandlerkitWarning,
                stacklevel=user_stacklevel(),
            )
            del kept[key]
        kept[key] = spec
    return tuple(kept.values())


# TorchServe 0.12's ts/configs/metrics.yaml, as the data safe_load gives (anchors resolved).
_LEVEL_HOST = ["Level", "Hostname"]
_MODEL_VERSION_HOST = ["model_name", "model_version", "hostname"]
_DEFAULT_DATA: dict[str, Any] = {
    "dimensions": ["ModelName", "WorkerName", "Level", "DeviceId", "Hostname"],
    "ts_metrics": {
        "counter": [
            {"name": "Requests2XX", "unit": "Count", "dimensions": _LEVEL_HOST},
            {"name": "Requests4XX", "unit": "Count", "dimensions": _LEVEL_HOST},
            {"name": "Requests5XX", "unit": "Count", "dimensions": _LEVEL_HOST},
            {"name": "ts_inference_requests_total", "unit": "Count", "dimensions": _MODEL_VERSION_HOST},
            {"name": "ts_inference_latency_microseconds", "unit": "Microseconds", "dimensions": _MODEL_VERSION_HOST},
            {"name": "ts_queue_latency_microseconds", "unit": "Microseconds", "dimensions": _MODEL_VERSION_HOST},
        ],
        "gauge": [
            {"name": "QueueTime", "unit": "Milliseconds", "dimensions": _LEVEL_HOST},
            {"name": "WorkerThreadTime", "unit": "Milliseconds", "dimensions": _LEVEL_HOST},
            {"name": "WorkerLoadTime", "unit": "Milliseconds", "dimensions": ["WorkerName", *_LEVEL_HOST]},
            {"name": "CPUUtilization", "unit": "Percent", "dimensions": _LEVEL_HOST},
            {"name": "MemoryUsed", "unit": "Megabytes", "dimensions": _LEVEL_HOST},
            {"name": "MemoryAvailable", "unit": "Megabytes", "dimensions": _LEVEL_HOST},
            {"name": "MemoryUtilization", "unit": "Percent", "dimensions": _LEVEL_HOST},
            {"name": "DiskUsage", "unit": "Gigabytes", "dimensions": _LEVEL_HOST},
            {"name": "DiskUtilization", "unit": "Percent", "dimensions": _LEVEL_HOST},
            {"name": "DiskAvailable", "unit": "Gigabytes", "dimensions": _LEVEL_HOST},
            {"name": "GPUMemoryUtilization", "unit": "Percent", "dimensions": ["Level", "DeviceId", "Hostname"]},
            {"name": "GPUMemoryUsed", "unit": "Megabytes", "dimensions": ["Level", "DeviceId", "Hostname"]},
            {"name": "GPUUtilization", "unit": "Percent", "dimensions": ["Level", "DeviceId", "Hostname"]},
        ],
    },
    "model_metrics": {
        "gauge": [
            {"name": "HandlerTime", "unit": "ms", "dimensions": ["ModelName", "Level"]},
            {"name": "PredictionTime", "unit": "ms", "dimensions": ["ModelName", "Level"]},
        ]
    },
}


@functools.lru_cache(maxsize=1)
def _default_config() -> MetricsConfig:
    # Parsed by the same code as a user's file; cached because the result is immutable.
    return parse_metrics_config(_DEFAULT_DATA, DEFAULT_SOURCE)
