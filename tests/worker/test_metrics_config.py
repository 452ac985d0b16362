"""handlerkit.worker.metrics_config: a TorchServe metrics YAML read as the worker reads it, checked against
TorchServe 0.12's own MetricsCacheYamlImpl built in-process from the same file: the metrics it
declares, every problem that stops the worker (or the frontend) reported at once, and the
messages of a lookup of a metric the config does not declare."""

from __future__ import annotations

import pickle
import re
from dataclasses import FrozenInstanceError

import pytest
import yaml
from ts.metrics.metric_type_enum import MetricTypes

from conftest import ts_default_metrics_yaml, ts_metrics_cache
from handlerkit.errors import ConfigError, HandlerkitWarning
from handlerkit.worker.metrics import RecordingMetrics
from handlerkit.worker.metrics_config import (
    DEFAULT_SOURCE,
    MetricSpec,
    MetricType,
    UndeclaredMetricError,
    load_metrics_config,
    parse_metrics_config,
)

pytestmark = pytest.mark.torchserve

TS_DEFAULT_YAML = ts_default_metrics_yaml()


# --------------------------------------------------------------------------------------------
# The config
# --------------------------------------------------------------------------------------------


def test_default_config_is_torchserves_file():
    ours = load_metrics_config()
    theirs = parse_metrics_config(yaml.safe_load(TS_DEFAULT_YAML.read_text()), str(TS_DEFAULT_YAML))
    assert (ours.model_metrics, ours.ts_metrics) == (theirs.model_metrics, theirs.ts_metrics)
    assert ours.source == DEFAULT_SOURCE and ours.is_default and not theirs.is_default
    assert ours.model_metrics == (
        MetricSpec("HandlerTime", MetricType.GAUGE, "ms", ("ModelName", "Level")),
        MetricSpec("PredictionTime", MetricType.GAUGE, "ms", ("ModelName", "Level")),
    )
    assert load_metrics_config() is ours  # parsed once


@pytest.mark.parametrize("which", ["default", "custom"])
def test_declared_metrics_are_those_torchserve_declares(which, custom_metrics_yaml):
    path = TS_DEFAULT_YAML if which == "default" else custom_metrics_yaml
    theirs = ts_metrics_cache("mnist", path)
    ours = load_metrics_config(None if which == "default" else custom_metrics_yaml)
    declared = {
        (kind.value, name): (metric.unit, metric.dimension_names)
        for kind, metrics in theirs.cache.items()
        for name, metric in metrics.items()
    }
    store = RecordingMetrics(config=ours)
    assert [(s.metric_type.value, s.name) for s in ours.model_metrics] == list(declared)
    for (kind, name), (ts_unit, ts_dims) in declared.items():
        metric = store.get_metric(name, MetricTypes(kind))
        assert (metric.dimension_names, metric.metric_type.value) == (ts_dims, kind)
        # TorchServe stores the unit's log name ("Milliseconds" for "ms"); records carry both.
        metric.add_or_update(1, ["x"] * len(ts_dims))
        assert store.last(name).unit_name == ts_unit
    assert len(store) == len(declared)


def test_config_is_small_frozen_data(custom_metrics_yaml):
    config = load_metrics_config(custom_metrics_yaml)
    assert config.source == str(custom_metrics_yaml) and not config.is_default
    assert config.get("RequestBatchSize", MetricTypes.GAUGE) == MetricSpec(
        "RequestBatchSize", MetricType.GAUGE, "count", ("ModelName",)
    )
    assert config.get("RequestBatchSize", "gauge") is config.get("RequestBatchSize", MetricType.GAUGE)
    assert config.get("RequestBatchSize") is None  # a counter by default, as in get_metric
    assert config.names()[:3] == ["InferenceRequestCount", "InitializeCallCount", "PreprocessCallCount"]
    assert [s.name for s in config.ts_metrics] == ["QueueTime"]
    assert pickle.loads(pickle.dumps(config)) == config and hash(config) == hash(load_metrics_config(custom_metrics_yaml))
    with pytest.raises(FrozenInstanceError):
        config.source = "other"  # type: ignore[misc]
    assert repr(config).startswith(f"MetricsConfig({str(custom_metrics_yaml)!r}: counter InferenceRequestCount")
    assert load_metrics_config(config) is config


def test_path_of_wrong_type():
    with pytest.raises(TypeError, match="metrics_config must be the path of a metrics YAML.*got int 3"):
        load_metrics_config(3)  # type: ignore[arg-type]


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=r"nope\.yaml: no such metrics config") as info:
        load_metrics_config(path)
    assert "metrics_config=None" in info.value.fix
    with pytest.raises(OSError):  # TorchServe's worker: MetricsCacheIOError
        ts_metrics_cache("mnist", path)


def test_invalid_yaml_says_where(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model_metrics:\n  gauge: [\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml, line 3, column 1: not valid YAML") as info:
        load_metrics_config(path)
    assert "indent with spaces" in info.value.fix
    with pytest.raises(yaml.YAMLError):  # MetricsCachePyYamlError
        ts_metrics_cache("mnist", path)


ENTRY = "{name: A, unit: ms, dimensions: []}"
GAUGE = "model_metrics:\n  gauge: "
BAD_CONFIGS = [  # (text, the problem reported, whether TorchServe's worker refuses it too)
    ("", "the metrics config is empty", True),
    ("- a\n- b\n", "must be a mapping with ts_metrics and model_metrics sections: got list", True),
    ("ts_metrics: {}\n", "no model_metrics section; TorchServe 0.12's worker fails to start", True),
    ("model_metrics: {}\n", "model_metrics is empty", True),
    (f"model_metrics:\n  summary: [{ENTRY}]\n", "model_metrics: invalid metric type 'summary'", True),
    (f"model_metrics:\n  gauges: [{ENTRY}]\n", r"invalid metric type 'gauges' \(did you mean 'gauge'\?\)", True),
    (GAUGE + "[{name: A, unit: ms}]\n", r"gauge\[0\]: no dimensions", True),
    (GAUGE + "[{name: A, dimensions: []}]\n", r"gauge\[0\]\.unit: expected a non-empty string: got null", True),
    (GAUGE + "[{name: 3, unit: ms, dimensions: []}]\n", r"\.name: expected a non-empty string: got int 3", True),
    (GAUGE + "[{name: A, unit: ms, dimensions: X}]\n", r"\.dimensions: expected a list of names: got str", True),
    (GAUGE + "A\n", r"model_metrics\.gauge: expected a list of metrics: got str 'A'", True),
    (GAUGE + "[A]\n", r"gauge\[0\]: expected \{name: \.\.\., unit: \.\.\., dimensions: \[\.\.\.\]\}: got str", True),
    # Only the Java frontend refuses these (SnakeYAML: unknown property); the worker starts.
    (GAUGE + "[{name: A, unit: ms, dimensions: [], units: s}]\n", r"unknown key 'units' \(did you mean 'unit'\?", False),
    (f"model_metric: {{}}\n{GAUGE}[{ENTRY}]\n", r"unknown section 'model_metric' \(did you mean 'model_metrics'", False),
    (f"ts_metrics:\n  gauge: [{{name: Q, unit: ''}}]\n{GAUGE}[{ENTRY}]\n", r"ts_metrics\.gauge\[0\]\.unit: expected", False),
]


@pytest.mark.parametrize("text, problem, worker_fails", BAD_CONFIGS)
def test_bad_configs_are_refused_with_the_reason(tmp_path, text, problem, worker_fails):
    path = tmp_path / "metrics.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=problem) as info:
        load_metrics_config(path)
    assert str(path) in info.value.message
    assert info.value.fix and "\n  fix: " in str(info.value)
    if worker_fails:  # TorchServe's worker refuses the same file
        with pytest.raises(Exception):
            ts_metrics_cache("mnist", path)
    else:
        ts_metrics_cache("mnist", path)


def test_all_problems_are_reported_together(tmp_path):
    path = tmp_path / "metrics.yaml"
    path.write_text(GAUGE + "\n    - {name: A, dimensions: []}\n    - {name: B, unit: ms}\n  summary: []\n")
    with pytest.raises(ConfigError, match="3 problems in the metrics config that TorchServe 0.12 would refuse") as info:
        load_metrics_config(path)
    assert [p.split(":")[0] for p in info.value.problems] == [
        "model_metrics.gauge[0].unit",
        "model_metrics.gauge[1]",
        "model_metrics",
    ]


def test_a_name_declared_twice_keeps_the_last_as_torchserve_does(tmp_path):
    path = tmp_path / "metrics.yaml"
    path.write_text(GAUGE + "\n    - {name: A, unit: ms, dimensions: []}\n    - {name: A, unit: s, dimensions: [X]}\n")
    with pytest.warns(HandlerkitWarning, match=r"model_metrics\.gauge declares 'A' twice; TorchServe keeps the last"):
        config = load_metrics_config(path)
    assert config.model_metrics == (MetricSpec("A", MetricType.GAUGE, "s", ("X",)),)
    assert ts_metrics_cache("mnist", path).get_metric("A", MetricTypes.GAUGE).dimension_names == ["X"]


# --------------------------------------------------------------------------------------------
# Lookups of what the config does not declare
# --------------------------------------------------------------------------------------------


def test_messages_and_fixes_name_the_config(custom_metrics_yaml):
    default = RecordingMetrics("m", config=load_metrics_config())
    expected = "Metric of type 'MetricTypes.GAUGE' and name 'RequestBatchSize' doesn't exist"
    with pytest.raises(KeyError, match=expected) as info:
        default.get_metric("RequestBatchSize", MetricTypes.GAUGE)
    assert info.value.fix == (
        "declare it under model_metrics: gauge: in a metrics YAML and pass it as metrics_config=<path> "
        "(TorchServe: metrics_config in config.properties), or add it in the handler with "
        "add_metric_to_cache('RequestBatchSize', unit, dimension_names, MetricTypes.GAUGE)"
    )
    custom = RecordingMetrics("m", config=load_metrics_config(custom_metrics_yaml))
    with pytest.raises(UndeclaredMetricError, match="name 'Nope' doesn't exist") as info:
        custom.get_metric("Nope", MetricTypes.GAUGE)
    assert f"in {custom_metrics_yaml} (metrics_config={custom_metrics_yaml})" in info.value.fix
    with pytest.raises(KeyError, match=f"doesn't exist; {re.escape(DEFAULT_SOURCE)} declares it as a gauge") as info:
        default.get_metric("HandlerTime")
    assert info.value.fix.startswith("ask for it as MetricTypes.GAUGE")
    with pytest.raises(KeyError, match=r"doesn't exist; did you mean 'RequestBatchSize'\?") as info:
        custom.get_metric("RequestBatchsize", MetricTypes.GAUGE)
    assert info.value.fix == "get_metric('RequestBatchSize', MetricTypes.GAUGE)"
    with pytest.raises(KeyError, match=r"it is a frontend metric \(ts_metrics\), which handlers cannot get"):
        custom.get_metric("QueueTime", MetricTypes.GAUGE)
