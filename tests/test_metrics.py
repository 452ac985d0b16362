"""The metrics config (handlerkit.metrics_config) and RecordingMetrics built from it, checked
against TorchServe 0.12's own MetricsCacheYamlImpl built in-process from the same YAML."""

from __future__ import annotations

import logging
import pickle
import re
import socket
import warnings
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest
import ts
import yaml
from ts.metrics.dimension import Dimension as TsDimension
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
from ts.metrics.metric_type_enum import MetricTypes

from handlerkit.errors import ConfigError, HandlerkitError, HandlerkitWarning
from handlerkit.metrics import Dimension, MetricRecord, MetricType, RecordingMetrics, UndeclaredMetricError
from handlerkit.metrics_config import (
    DEFAULT_SOURCE,
    MetricSpec,
    load_metrics_config,
    parse_metrics_config,
)

pytestmark = pytest.mark.torchserve

TS_DEFAULT_YAML = Path(ts.__file__).parent / "configs" / "metrics.yaml"

# Like pytorch/serve's examples/custom_metrics config: every type, anchors, a metric with no
# dimensions, one with a single dimension and one with three.
CUSTOM_YAML = """\
dimensions:
  - &model_name "ModelName"
  - &level "Level"
ts_metrics:
  gauge:
    - {name: QueueTime, unit: Milliseconds, dimensions: [*level, "Hostname"]}
model_metrics:
  counter:
    - {name: InferenceRequestCount, unit: count, dimensions: []}
    - {name: InitializeCallCount, unit: count, dimensions: [*model_name, *level]}
    - {name: PreprocessCallCount, unit: count, dimensions: [*model_name]}
  gauge:
    - {name: HandlerTime, unit: ms, dimensions: [*model_name, *level]}
    - {name: PredictionTime, unit: ms, dimensions: [*model_name, *level]}
    - {name: RequestBatchSize, unit: count, dimensions: ["ModelName"]}
    - {name: SizeOfImage, unit: kB, dimensions: [*model_name, *level]}
    - {name: HandlerMethodTime, unit: ms, dimensions: ["MethodName", *model_name, *level]}
  histogram:
    - {name: ExamplePercentMetric, unit: percent, dimensions: [*model_name, *level]}
"""


def ts_cache(path: Path | str, model_name: str = "mnist") -> MetricsCacheYamlImpl:
    """The cache TorchServe's worker builds (model_service_worker.py)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # ts leaves the YAML file open
        cache = MetricsCacheYamlImpl(config_file_path=str(path))
    cache.initialize_cache()
    cache.model_name = model_name
    return cache


@pytest.fixture
def custom_yaml(tmp_path: Path) -> Path:
    path = tmp_path / "metrics.yaml"
    path.write_text(CUSTOM_YAML)
    return path


@pytest.fixture(params=["default", "custom"])
def pair(request, custom_yaml):
    """(TorchServe's cache, our store) built from the same config."""
    if request.param == "default":
        return ts_cache(TS_DEFAULT_YAML), RecordingMetrics("mnist", config=load_metrics_config())
    return ts_cache(custom_yaml), RecordingMetrics("mnist", config=load_metrics_config(custom_yaml))


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
def test_declared_metrics_are_those_torchserve_declares(which, custom_yaml):
    path = TS_DEFAULT_YAML if which == "default" else custom_yaml
    theirs = ts_cache(path)
    ours = load_metrics_config(None if which == "default" else custom_yaml)
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


def test_config_is_small_frozen_data(custom_yaml):
    config = load_metrics_config(custom_yaml)
    assert config.source == str(custom_yaml) and not config.is_default
    assert config.get("RequestBatchSize", MetricTypes.GAUGE) == MetricSpec(
        "RequestBatchSize", MetricType.GAUGE, "count", ("ModelName",)
    )
    assert config.get("RequestBatchSize", "gauge") is config.get("RequestBatchSize", MetricType.GAUGE)
    assert config.get("RequestBatchSize") is None  # a counter by default, as in get_metric
    assert config.names()[:3] == ["InferenceRequestCount", "InitializeCallCount", "PreprocessCallCount"]
    assert [s.name for s in config.ts_metrics] == ["QueueTime"]
    assert pickle.loads(pickle.dumps(config)) == config and hash(config) == hash(load_metrics_config(custom_yaml))
    with pytest.raises(FrozenInstanceError):
        config.source = "other"  # type: ignore[misc]
    assert repr(config).startswith(f"MetricsConfig({str(custom_yaml)!r}: counter InferenceRequestCount")
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
        ts_cache(path)


def test_invalid_yaml_says_where(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model_metrics:\n  gauge: [\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml, line 3, column 1: not valid YAML") as info:
        load_metrics_config(path)
    assert "indent with spaces" in info.value.fix
    with pytest.raises(yaml.YAMLError):  # MetricsCachePyYamlError
        ts_cache(path)


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
            ts_cache(path)
    else:
        ts_cache(path)


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
    assert ts_cache(path).get_metric("A", MetricTypes.GAUGE).dimension_names == ["X"]


# --------------------------------------------------------------------------------------------
# get_metric: the same successes and failures as TorchServe's cache
# --------------------------------------------------------------------------------------------

LOOKUPS = [
    ("HandlerTime", MetricTypes.GAUGE),  # declared in both configs
    ("HandlerTime", MetricTypes.COUNTER),  # declared, other type
    ("HandlerTime", MetricTypes.HISTOGRAM),
    ("RequestBatchSize", MetricTypes.GAUGE),  # the custom config only
    ("PreprocessCallCount", MetricTypes.COUNTER),
    ("ExamplePercentMetric", MetricTypes.HISTOGRAM),
    ("QueueTime", MetricTypes.GAUGE),  # a frontend metric (ts_metrics)
    ("NeverDeclared", MetricTypes.COUNTER),
]


@pytest.mark.parametrize("name, kind", LOOKUPS, ids=[f"{n}-{k.value}" for n, k in LOOKUPS])
def test_get_metric_works_and_fails_where_torchserve_does(pair, name, kind):
    theirs, ours = pair
    try:
        expected = theirs.get_metric(name, kind)
    except KeyError as exc:
        ts_message = exc.args[0]
        with pytest.raises(KeyError, match=re.escape(ts_message)) as info:
            ours.get_metric(name, kind)
        assert type(exc).__name__ == "MetricsCacheKeyError"
        assert isinstance(info.value, UndeclaredMetricError) and isinstance(info.value, HandlerkitError)
        assert info.value.message.startswith(ts_message)
        assert (info.value.metric_name, info.value.metric_type.value) == (name, kind.value)
    else:
        metric = ours.get_metric(name, kind)
        assert (metric.dimension_names, metric.metric_type.value) == (expected.dimension_names, kind.value)


def test_messages_and_fixes_name_the_config(custom_yaml):
    default = RecordingMetrics("m", config=load_metrics_config())
    expected = "Metric of type 'MetricTypes.GAUGE' and name 'RequestBatchSize' doesn't exist"
    with pytest.raises(KeyError, match=expected) as info:
        default.get_metric("RequestBatchSize", MetricTypes.GAUGE)
    assert info.value.fix == (
        "declare it under model_metrics: gauge: in a metrics YAML and pass it as metrics_config=<path> "
        "(TorchServe: metrics_config in config.properties), or add it in the handler with "
        "add_metric_to_cache('RequestBatchSize', unit, dimension_names, MetricTypes.GAUGE)"
    )
    custom = RecordingMetrics("m", config=load_metrics_config(custom_yaml))
    with pytest.raises(UndeclaredMetricError, match="name 'Nope' doesn't exist") as info:
        custom.get_metric("Nope", MetricTypes.GAUGE)
    assert f"in {custom_yaml} (metrics_config={custom_yaml})" in info.value.fix
    with pytest.raises(KeyError, match=f"doesn't exist; {re.escape(DEFAULT_SOURCE)} declares it as a gauge") as info:
        default.get_metric("HandlerTime")
    assert info.value.fix.startswith("ask for it as MetricTypes.GAUGE")
    with pytest.raises(KeyError, match=r"doesn't exist; did you mean 'RequestBatchSize'\?") as info:
        custom.get_metric("RequestBatchsize", MetricTypes.GAUGE)
    assert info.value.fix == "get_metric('RequestBatchSize', MetricTypes.GAUGE)"
    with pytest.raises(KeyError, match=r"it is a frontend metric \(ts_metrics\), which handlers cannot get"):
        custom.get_metric("QueueTime", MetricTypes.GAUGE)


def test_a_handlers_except_keyerror_behaves_the_same(pair):
    def lookup(metrics):  # what a handler might write
        try:
            return metrics.get_metric("NotThere", MetricTypes.GAUGE)
        except KeyError:
            return "fallback"

    theirs, ours = pair
    assert lookup(theirs) == lookup(ours) == "fallback"


def test_type_names_are_refused_with_a_config_as_torchserve_does(pair):
    theirs, ours = pair
    ts_message = "`metric_type` must be a MetricTypes enum"
    for store in (theirs, ours):
        with pytest.raises(TypeError, match=re.escape(ts_message)):
            store.get_metric("HandlerTime", "gauge")
        with pytest.raises(TypeError, match=re.escape(ts_message)):
            store.add_metric("X", 1, "count", dimensions=[], metric_type="counter")
        with pytest.raises(TypeError, match=re.escape(ts_message)):
            store.add_metric_to_cache("X", "count", [], "counter")
        with pytest.raises(TypeError, match="`metric_name` must be a str"):
            store.get_metric(None, MetricTypes.GAUGE)
        with pytest.raises(TypeError, match="`dimension_names` should be a list"):
            store.add_metric_to_cache("X", "count", ("A",), MetricTypes.COUNTER)
    with pytest.raises(TypeError, match=r"got 'gauge', which TorchServe 0.12 refuses.*pass MetricTypes\.GAUGE"):
        ours.get_metric("HandlerTime", "gauge")
    assert len(ours) == 0


def test_without_a_config_the_store_stays_permissive():
    metrics = RecordingMetrics()
    assert metrics.config is None and metrics.cache == {}
    metrics.add_metric("B", 1, "ms", metric_type="gauge")  # a type name is fine here
    assert metrics.get_metric("B", "gauge").metric_type is MetricType.GAUGE
    assert metrics.add_metric_to_cache("T", "ms", ("A",)).dimension_names == ["A"]
    with pytest.raises(UndeclaredMetricError, match="name 'HandlerTime' doesn't exist") as info:
        metrics.get_metric("HandlerTime", MetricTypes.GAUGE)
    assert "RecordingMetrics(config=load_metrics_config(path))" in info.value.fix
    assert metrics.undeclared_names() == []


# --------------------------------------------------------------------------------------------
# Recording: the values and dimensions TorchServe logs
# --------------------------------------------------------------------------------------------

TS_LINE = re.compile(
    r"^\[METRICS\](?P<name>.+?)\.(?P<unit>[^.:]*):(?P<value>[^|]*)\|#(?P<dims>[^|]*)"
    r"\|#type:(?P<type>[A-Z]+)\|#hostname:[^,]*,\d+(?:,(?P<req>.*))?$"
)


def _untimed(line: str) -> str:
    return re.sub(r"(\|#hostname:[^,]*),\d+", r"\1,<time>", line)


def handler_calls(metrics) -> None:
    """What pytorch/serve's examples/custom_metrics handler does, plus values TorchServe drops.

    Dimensions are always passed: TorchServe's add_* methods append to a shared default list.
    """
    metrics.request_ids = {0: "r0", 1: "r1"}
    metrics.add_metric_to_cache("InferenceRequestCount", "count", [], MetricTypes.COUNTER).add_or_update(1, [])
    metrics.add_metric("InitializeCallCount", 1, "count", dimensions=[], metric_type=MetricTypes.COUNTER)
    metrics.get_metric("PreprocessCallCount", MetricTypes.COUNTER).add_or_update(1, ["mnist"])
    metrics.get_metric("RequestBatchSize", MetricTypes.GAUGE).add_or_update(2, ["mnist"])
    metrics.add_size("SizeOfImage", 0.75, None, "kB", dimensions=[])
    method_time = metrics.get_metric("HandlerMethodTime", MetricTypes.GAUGE)
    method_time.add_or_update(3.5, ["preprocess", "mnist", "Model"], "r1")
    metrics.add_time("HandlerTime", 12.5, None, "ms", dimensions=[])
    metrics.add_percent("ExamplePercentMetric", 40, idx=1, dimensions=[], metric_type=MetricTypes.HISTOGRAM)
    metrics.add_counter("AdHoc", 1, idx=1, dimensions=[TsDimension("Stage", "pre")])  # undeclared: added
    metrics.add_error("Failures", 1, dimensions=[])
    # Dropped by both: wrong number of dimension values, a negative counter, and a dimension
    # more than the YAML declares for PredictionTime.
    metrics.get_metric("RequestBatchSize", MetricTypes.GAUGE).add_or_update(2, [])
    metrics.get_metric("PreprocessCallCount", MetricTypes.COUNTER).add_or_update(-1, ["mnist"])
    metrics.add_time("PredictionTime", 4.0, idx=0, dimensions=[TsDimension("Extra", "x")])


def test_recorded_values_are_what_torchserve_logs(custom_yaml, caplog):
    theirs = ts_cache(custom_yaml)
    ours = RecordingMetrics("mnist", config=load_metrics_config(custom_yaml))
    with caplog.at_level(logging.INFO, logger="ts.metrics.caching_metric"):
        handler_calls(theirs)
    # Only the metric lines: other tests (the harness) may have set the root logger to INFO.
    records = [r for r in caplog.records if r.name == "ts.metrics.caching_metric"]
    logged = [TS_LINE.match(r.getMessage()) for r in records if r.levelno == logging.INFO]
    failed = [r.getMessage() for r in records if r.levelno == logging.ERROR]
    with pytest.warns(HandlerkitWarning, match="drops the value") as dropped:
        handler_calls(ours)

    assert all(logged) and len(logged) == len(ours.records) == 10
    for match, record in zip(logged, ours.records):
        dims = ",".join(f"{k}:{v}" for k, v in record.dimensions.items())
        ours_line = (record.name, record.unit_name, str(record.value), dims, record.metric_type.upper())
        assert ours_line + (record.request_id or None,) == match.group("name", "unit", "value", "dims", "type", "req")
        # str(record) is the very line, request id after a "," (only the time differs).
        assert _untimed(str(record)) == _untimed(match.string)
    assert len(failed) == len(dropped) == 3
    by_name = {r.name: r for r in ours.records}
    assert by_name["SizeOfImage"].dimensions == {"ModelName": "mnist", "Level": "Model"}
    assert by_name["SizeOfImage"].request_id == "r0,r1"
    assert by_name["RequestBatchSize"].dimensions == {"ModelName": "mnist"}
    assert ours.undeclared_names() == ["AdHoc", "Failures"]  # the frontend drops these by default


def test_add_metric_to_cache_replaces_a_declared_metric_as_torchserve_does(custom_yaml):
    theirs = ts_cache(custom_yaml)
    ours = RecordingMetrics("mnist", config=load_metrics_config(custom_yaml))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same declaration again: nothing to say
        same = ours.add_metric_to_cache("PreprocessCallCount", "count", ["ModelName"], MetricTypes.COUNTER)
    assert ours.get_metric("PreprocessCallCount", MetricTypes.COUNTER) is same
    expected = (
        f"replaces the gauge that {custom_yaml} declares (unit 'count', dimensions ['ModelName']) "
        "with unit 'count', dimensions ['ModelName', 'Level']"
    )
    with pytest.warns(HandlerkitWarning, match=re.escape(expected)):
        ours.add_metric_to_cache("RequestBatchSize", "count", ["ModelName", "Level"], MetricTypes.GAUGE)
    theirs.add_metric_to_cache("RequestBatchSize", "count", ["ModelName", "Level"], MetricTypes.GAUGE)
    assert (
        ours.get_metric("RequestBatchSize", MetricTypes.GAUGE).dimension_names
        == theirs.get_metric("RequestBatchSize", MetricTypes.GAUGE).dimension_names
        == ["ModelName", "Level"]
    )


def test_a_declared_metric_keeps_its_declaration_on_add_calls():
    # The YAML fixes HandlerTime's unit; add_time with "s" reuses it, as TorchServe does.
    ours = RecordingMetrics("m", {0: "r0"}, config=load_metrics_config())
    theirs = ts_cache(TS_DEFAULT_YAML, "m")
    theirs.request_ids = {0: "r0"}
    for store in (ours, theirs):
        store.add_time("HandlerTime", 1.5, idx=0, unit="s", dimensions=[])
    ts_unit = theirs.get_metric("HandlerTime", MetricTypes.GAUGE).unit
    assert ours.last("HandlerTime").unit_name == ts_unit == "Milliseconds"


# ---------------------------------------------------------------------------------------------
# The recording store's API (moved from test_context.py)
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def metrics():
    return RecordingMetrics(model_name="mnist", request_ids={0: "r0", 1: "r1"})


def test_each_api_call_is_recorded(metrics):
    metrics.add_counter("Requests", 2)
    metrics.add_time("HandlerTime", 12.5)
    metrics.add_time("Seconds", 1, unit="s", idx=1)
    metrics.add_size("Mem", 3, idx=0)
    metrics.add_size("Bytes", 3, unit="B")
    metrics.add_percent("Util", 50.0, metric_type=MetricType.HISTOGRAM)
    metrics.add_error("Failures", 1)
    metrics.add_metric(
        "Custom", 7, "widgets", idx=0, dimensions=[Dimension("Color", "red")], metric_type=MetricType.GAUGE
    )
    by_name = {r.name: r for r in metrics.records}
    model_dims = {"ModelName": "mnist", "Level": "Model"}

    assert by_name["Requests"].unit == "count"
    assert by_name["Requests"].metric_type == "counter"
    assert by_name["Requests"].request_id == "r0,r1"  # no idx: every id, as TorchServe
    assert by_name["Requests"].dimensions == model_dims
    assert (by_name["HandlerTime"].unit, by_name["HandlerTime"].metric_type) == ("ms", "gauge")
    assert (by_name["Seconds"].unit, by_name["Seconds"].request_id) == ("s", "r1")
    assert (by_name["Mem"].unit, by_name["Mem"].request_id) == ("MB", "r0")
    assert by_name["Bytes"].unit == "B"
    assert (by_name["Util"].unit, by_name["Util"].metric_type) == ("percent", "histogram")
    assert by_name["Failures"].dimensions == {"Level": "Error"}
    failures = by_name["Failures"]
    assert (failures.unit, failures.metric_type, failures.request_id) == ("", "counter", "")
    assert by_name["Custom"].dimensions == {"Color": "red", **model_dims}
    assert (by_name["Custom"].unit, by_name["Custom"].value, by_name["Custom"].metric_type) == ("widgets", 7, "gauge")
    assert all(isinstance(r, MetricRecord) and r.timestamp > 0 for r in metrics.records)
    assert len(metrics) == 8


def test_no_request_ids_means_error_level():
    m = RecordingMetrics(model_name="m")
    m.add_time("Load", 3)
    assert m.last("Load").dimensions == {"Level": "Error"}
    assert m.last("Load").request_id is None


def test_request_id_string_like_model_load():
    m = RecordingMetrics(model_name="m", request_ids="load-id")
    m.add_counter("C", 1)
    assert m.last("C").request_id == "load-id"
    assert m.last("C").dimensions == {"ModelName": "m", "Level": "Model"}


def test_dimensions_accept_dicts_pairs_and_ts_like_objects(metrics):
    class TsDim:  # duck-typed like ts.metrics.dimension.Dimension
        def __init__(self, name, value):
            self.name, self.value = name, value

    metrics.add_counter("A", 1, dimensions={"K": "v"})
    metrics.add_counter("B", 1, dimensions=[("K", "v")])
    metrics.add_counter("C", 1, dimensions=[TsDim("K", "v"), TsDim("Level", "Custom")])
    expected = {"K": "v", "ModelName": "mnist", "Level": "Model"}
    assert metrics.last("A").dimensions == metrics.last("B").dimensions == expected
    assert metrics.last("C").dimensions == {"K": "v", "Level": "Custom", "ModelName": "mnist"}
    with pytest.raises(TypeError, match="Dimension"):
        metrics.add_counter("D", 1, dimensions=["oops"])
    with pytest.raises(TypeError, match="list of Dimension"):
        metrics.add_counter("D", 1, dimensions="K=v")


def test_default_dimension_list_is_not_mutated(metrics):
    dims = [Dimension("K", "v")]
    metrics.add_counter("A", 1, dimensions=dims)
    assert dims == [Dimension("K", "v")]


def test_units_are_checked(metrics):
    with pytest.raises(ValueError, match=r"\['ms', 's'\]"):
        metrics.add_time("T", 1, unit="us")
    with pytest.raises(ValueError, match="'MB', 'kB', 'GB', 'B'"):
        metrics.add_size("S", 1, unit="TB")
    assert len(metrics) == 0


def test_bad_values_raise_type_error(metrics):
    with pytest.raises(TypeError, match="needs a number: got str"):
        metrics.add_counter("C", "1")
    with pytest.raises(TypeError, match="needs a number"):
        metrics.add_time("T", None)

    class Tensorish:
        def item(self):
            return 1.0

    with pytest.raises(TypeError, match=r"\.item\(\)"):
        metrics.add_time("T", Tensorish())
    assert len(metrics) == 0


def test_negative_counter_is_dropped_with_warning(metrics):
    with pytest.warns(HandlerkitWarning, match="cannot be decreased") as caught:
        metrics.add_counter("C", -1)
    assert caught[0].filename == __file__  # points at the caller, not at handlerkit
    assert metrics.find("C") == []
    metrics.add_time("G", -1)  # gauges may go down
    assert metrics.last("G").value == -1


def test_metric_types_from_torchserve_enum_and_strings(metrics):
    import enum

    class MetricTypes(enum.Enum):  # same shape as ts.metrics.metric_type_enum.MetricTypes
        COUNTER = "counter"
        GAUGE = "gauge"
        HISTOGRAM = "histogram"

    metrics.add_metric("A", 1, "ms", metric_type=MetricTypes.HISTOGRAM)
    metrics.add_metric("B", 1, "ms", metric_type="gauge")
    assert metrics.last("A").metric_type == "histogram"
    assert metrics.last("B").metric_type == "gauge"
    assert metrics.get_metric("A", MetricTypes.HISTOGRAM) is metrics.get_metric("A", MetricType.HISTOGRAM)
    with pytest.raises(TypeError, match="metric_type must be a MetricType"):
        metrics.add_metric("C", 1, "ms", metric_type="summary")


def test_add_metric_to_cache_and_add_or_update(metrics):
    metric = metrics.add_metric_to_cache("Latency", "ms", ["ModelName", "Stage"], MetricType.HISTOGRAM)
    assert metrics.get_metric("Latency", MetricType.HISTOGRAM) is metric
    assert len(metrics) == 0  # declaring records nothing
    metric.add_or_update(4.5, ["mnist", "pre"], request_id="r9")
    metric.add_or_update(5.5, ["mnist", "post"])
    first, second = metrics.find("Latency")
    dims = {"ModelName": "mnist", "Stage": "pre"}
    assert first == MetricRecord("Latency", 4.5, "ms", dims, "r9", "histogram", first.timestamp)
    assert (second.request_id, second.dimensions["Stage"]) == ("", "post")
    assert metrics.last("Latency") is second

    with pytest.warns(HandlerkitWarning, match=r"declared with dimensions \['ModelName', 'Stage'\]"):
        metric.add_or_update(1.0, ["only-one"])
    assert len(metrics.find("Latency")) == 2

    with pytest.raises(KeyError, match="doesn't exist"):
        metrics.get_metric("Latency")  # default type: counter
    with pytest.raises(TypeError, match="metric_name"):
        metrics.add_metric_to_cache(3, "ms")
    with pytest.raises(TypeError, match="unit"):
        metrics.add_metric_to_cache("X", None)
    with pytest.raises(TypeError, match="dimension_names"):
        metrics.add_metric_to_cache("X", "ms", "ModelName")


def test_default_metric_type_is_counter(metrics):
    metric = metrics.add_metric_to_cache("Hits", "count")
    assert metrics.get_metric("Hits") is metric
    metric.add_or_update(1)
    assert metrics.last("Hits").dimensions == {}


def test_first_call_fixes_unit_and_dimensions(metrics):
    metrics.add_time("T", 1, unit="s")
    metrics.add_time("T", 2, unit="ms")  # TorchServe reuses the cached metric: unit stays "s"
    assert [r.unit for r in metrics.find("T")] == ["s", "s"]
    with pytest.warns(HandlerkitWarning, match="drops the value"):
        metrics.add_time("T", 3, dimensions={"Extra": "x"})
    assert len(metrics.find("T")) == 2


def test_update_backwards_compat(metrics):
    metric = metrics.add_metric_to_cache("U", "count", ["A"])
    metric.update(3, "rid", [Dimension("B", "b")])
    assert metric.dimension_names == ["B"]
    assert metrics.last("U").dimensions == {"B": "b"}
    assert metrics.last("U").request_id == "rid"


def test_windowing_with_mark_and_since(metrics):
    metrics.add_counter("before", 1)
    start = metrics.mark()
    metrics.add_counter("during", 1)
    metrics.add_time("during_t", 2)
    assert [r.name for r in metrics.since(start)] == ["during", "during_t"]
    end = metrics.mark()
    assert metrics.since(end) == []
    metrics.add_counter("later", 1)
    assert [r.name for r in metrics.since(start, end)] == ["during", "during_t"]  # a window
    assert [r.name for r in metrics.since(end)] == ["later"]
    metrics.clear()
    assert len(metrics) == 0 and metrics.since(start) == []
    metrics.add_counter("after", 1)
    assert [r.name for r in metrics.since(end)] == ["after"]
    assert [r.name for r in metrics.since(0)] == ["after"]
    assert metrics.since(start, end) == []  # a window of cleared records is empty
    assert metrics.get_metric("before") is not None  # declared metrics survive clear()


def test_find_last_names_len_iter_bool_repr(metrics):
    assert metrics  # an empty store is still truthy
    assert metrics.last("x") is None and metrics.find("x") == [] and metrics.names() == []
    metrics.add_counter("a", 1)
    metrics.add_counter("b", 1)
    metrics.add_counter("a", 2)
    assert metrics.names() == ["a", "b"]
    assert [r.value for r in metrics.find("a")] == [1, 2]
    assert metrics.last("a").value == 2
    assert [r.name for r in metrics] == ["a", "b", "a"]
    assert "3 records" in repr(metrics) and "a, b" in repr(metrics)


def test_record_str_is_torchserve_log_line(metrics):
    metrics.add_time("HandlerTime", 12.5, idx=0)
    record = metrics.last("HandlerTime")
    assert record.unit_name == "Milliseconds"
    host, stamp = socket.gethostname(), int(record.timestamp)
    assert str(record) == (
        f"[METRICS]HandlerTime.Milliseconds:12.5|#ModelName:mnist,Level:Model|#type:GAUGE|#hostname:{host},{stamp},r0"
    )
    metrics.request_ids = None
    metrics.add_counter("Errors", 1)
    assert str(metrics.last("Errors")).endswith(f"|#type:COUNTER|#hostname:{host},{int(metrics.last('Errors').timestamp)}")


def test_set_request_ids(metrics):
    metrics.set_request_ids({0: "z"})
    metrics.add_counter("c", 1, idx=0)
    assert metrics.last("c").request_id == "z"
