"""handlerkit.worker.metrics: RecordingMetrics, checked against TorchServe 0.12's own MetricsCacheYamlImpl
built in-process from the same metrics YAML (the YAML itself is read by handlerkit.worker.metrics_config:
test_metrics_config.py)."""

from __future__ import annotations

import logging
import re
import socket
import warnings

import pytest
from ts.metrics.dimension import Dimension as TsDimension
from ts.metrics.metric_type_enum import MetricTypes

from conftest import ts_metrics_cache
from handlerkit.errors import HandlerkitError, HandlerkitWarning
from handlerkit.worker.metrics import Dimension, MetricRecord, MetricType, RecordingMetrics, UndeclaredMetricError
from handlerkit.worker.metrics_config import load_metrics_config

pytestmark = pytest.mark.torchserve


@pytest.fixture(params=["default", "custom"])
def pair(request, custom_metrics_yaml):
    """(TorchServe's cache, our store) built from the same config."""
    if request.param == "default":
        return ts_metrics_cache("mnist"), RecordingMetrics("mnist", config=load_metrics_config())
    return ts_metrics_cache("mnist", custom_metrics_yaml), RecordingMetrics("mnist", config=load_metrics_config(custom_metrics_yaml))


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


def test_recorded_values_are_what_torchserve_logs(custom_metrics_yaml, caplog):
    theirs = ts_metrics_cache("mnist", custom_metrics_yaml)
    ours = RecordingMetrics("mnist", config=load_metrics_config(custom_metrics_yaml))
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


def test_add_metric_to_cache_replaces_a_declared_metric_as_torchserve_does(custom_metrics_yaml):
    theirs = ts_metrics_cache("mnist", custom_metrics_yaml)
    ours = RecordingMetrics("mnist", config=load_metrics_config(custom_metrics_yaml))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same declaration again: nothing to say
        same = ours.add_metric_to_cache("PreprocessCallCount", "count", ["ModelName"], MetricTypes.COUNTER)
    assert ours.get_metric("PreprocessCallCount", MetricTypes.COUNTER) is same
    expected = (
        f"replaces the gauge that {custom_metrics_yaml} declares (unit 'count', dimensions ['ModelName']) "
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
    theirs = ts_metrics_cache("m")
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
