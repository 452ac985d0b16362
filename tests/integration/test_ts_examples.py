"""Fidelity on handlers shaped like pytorch/serve's own examples, with TorchServe 0.12 as the judge.

Each handler in ``tests/ts_examples/`` has the shape of one TorchServe example (micro-batching,
URL routes, custom metrics, stateful sequences, DCGAN-style noise, the profiler). It is archived
into a model dir twice: on handlerkit's BaseHandler, run by ``hk.Harness``, and on TorchServe's
BaseHandler, run by TorchServe's own worker code in-process (``ts.model_loader.TsModelLoader`` +
``ts.service.Service.predict``, fed ``Batch.to_worker_message()``). Both must agree.
"""

from __future__ import annotations

import copy
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import handlerkit as hk
from conftest import decode_predict_response, ts_imports, ts_metrics_cache, write_model_dir
from handlerkit.handlers.base import BaseHandler

EXAMPLES = Path(__file__).parents[1] / "ts_examples"
MODEL_NAME = "tiny"

#: The lines that make an example a TorchServe handler instead of a handlerkit one.
_TO_TORCHSERVE = {
    "from handlerkit.handlers.base import BaseHandler as Base": "from ts.torch_handler.base_handler import BaseHandler as Base",
    "from handlerkit.worker.metrics import MetricType": "from ts.metrics.metric_type_enum import MetricTypes as MetricType",
}

#: The examples' model: a seeded Linear(4, 3), so every input change shows in the scores (an MLP's
#: ReLU can hide one, which would blind the batch-parity tests).
LINEAR_MODEL_PY = """\
import torch


class TinyLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x)
"""

#: Five requests of 4 numbers; rows 0 and 2 have a smaller largest |value| than the batch.
ROWS = [[0.5, -1.0, 2.0, 0.0], [3.0, 1.0, -4.0, 2.0], [1.0, 1.0, 1.0, 1.0], [-0.5, 0.25, 0.0, 1.5], [2.0, 2.0, -2.0, 0.5]]


# ---------------------------------------------------------------------------------------------
# Helpers: archive an example, serve it with TorchServe's worker code, run it with the Harness
# ---------------------------------------------------------------------------------------------


def example_source(example: str, base: str) -> str:
    """The example's source, on handlerkit's BaseHandler or (``base="torchserve"``) TorchServe's."""
    text = (EXAMPLES / f"{example}.py").read_text()
    if base == "torchserve":
        for ours, theirs in _TO_TORCHSERVE.items():
            text = text.replace(ours, theirs)
        assert "from handlerkit" not in text, f"{example}.py imports more of handlerkit than the swap covers"
    return text


def archive(model_dir: Path, example: str, base: str = "handlerkit", *, model: bool = True, config: str | None = None) -> Path:
    """A model dir as torch-model-archiver unpacks it: ``<example>.py`` as the handler, TinyLinear
    (seed 0) as model.py + model.pt when ``model``, ``config`` as model-config.yaml, a MANIFEST."""
    model_dir.mkdir(parents=True)
    (model_dir / f"{example}.py").write_text(example_source(example, base))
    entry: dict[str, Any] = {"modelName": MODEL_NAME, "handler": f"{example}.py", "modelVersion": "1.0"}
    if model:
        entry.update(serializedFile="model.pt", modelFile="model.py")
    if config is not None:
        entry["configFile"] = "model-config.yaml"
    manifest = {"createdOn": "today", "runtime": "python", "model": entry, "archiverVersion": "0.12.0"}
    return write_model_dir(model_dir, LINEAR_MODEL_PY if model else None, manifest=manifest, config=config)


def ts_load(model_dir: Path, batch_size: int, metrics_cache: Any = None, envelope: str | None = None) -> Any:
    """TorchServe's worker loading the archive: handler resolution, construction, initialize
    (and the service envelope around the entry point, as ``service_envelope`` makes it)."""
    from ts.model_loader import TsModelLoader

    handler = next(p.name for p in model_dir.glob("*_handler.py"))
    cache = metrics_cache if metrics_cache is not None else ts_metrics_cache(MODEL_NAME)
    with ts_imports(model_dir):
        service = TsModelLoader().load(
            MODEL_NAME, str(model_dir), handler=handler, gpu_id=None, batch_size=batch_size, metrics_cache=cache,
            envelope=envelope,
        )
    service.set_cl_socket(None)
    return service


def ts_predict(service: Any, batch: hk.Batch) -> tuple[int, list[Any]]:
    """``Service.predict`` on the batch as the frontend sends it: the status and the JSON answers."""
    with ts_imports(service.context.system_properties["model_dir"]):
        code, _message, responses = decode_predict_response(service.predict(batch.to_worker_message()))
    return code, [r.json() for r in responses] if code == 200 else []


def served_handler(service: Any) -> Any:
    """The handler object behind the worker's entry point (a bound ``handle`` or a MicroBatching)."""
    entry = service._entry_point
    return getattr(entry, "__self__", None) or entry.handler


def harness(model_dir: Path, **context_kwargs: Any) -> hk.Harness:
    """The Harness on the archive's handler, resolved from the MANIFEST as TorchServe does."""
    ctx = hk.MockContext.from_model_dir(model_dir, **context_kwargs)
    return hk.Harness(ctx.manifest["model"]["handler"], ctx)


def rows_batch(n: int) -> hk.Batch:
    return hk.batch(*(hk.Request.json(row) for row in ROWS[:n]))


def assert_close(actual: Any, expected: Any) -> None:
    torch.testing.assert_close(torch.tensor(actual), torch.tensor(expected), atol=1e-6, rtol=1e-6)


@pytest.fixture
def micro_batchings(monkeypatch) -> Any:
    """Every ts MicroBatching made during the test; their threads are stopped after it.

    MicroBatching starts three non-daemon threads that poll their queue every 0.5 s and are only
    stopped by ``shutdown()``: left running they would keep pytest from exiting. All events are
    set first, then the threads joined, so the wait is 0.5 s at most, not 0.5 s per thread.
    """
    from ts.handler_utils.micro_batching import MicroBatching

    made: list[Any] = []
    real_init = MicroBatching.__init__

    def recording_init(self: Any, *args: Any, **kwargs: Any) -> None:
        made.append(self)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(MicroBatching, "__init__", recording_init)
    yield made
    workers = [w for mb in made for group in mb.thread_groups.values() for w in group]
    for worker in workers:
        worker.event.set()
    for worker in workers:
        worker.thread.join()


# ---------------------------------------------------------------------------------------------
# 1. Micro-batching (examples/micro_batching)
# ---------------------------------------------------------------------------------------------

MICRO_CONFIG = "micro_batching:\n  micro_batch_size: 4\n"


@pytest.mark.torchserve
def test_micro_batching_runs_batches_of_4_and_1_like_torchserve(tmp_path, micro_batchings):
    """examples/micro_batching: ``self.handle = MicroBatching(self)`` in ``__init__``, size 4 from
    the config. TorchServe's worker feeds a batch of 5 to the model as 4 + 1; so must the Harness,
    and each stage's result must say it ran twice (``calls``), with per-call inputs and outputs."""
    batch = rows_batch(5)
    service = ts_load(archive(tmp_path / "ts", "micro_batching_handler", "torchserve", config=MICRO_CONFIG), 5)
    code, expected = ts_predict(service, batch)
    assert code == 200
    assert served_handler(service).seen_batches == [4, 1]

    h = harness(archive(tmp_path / "hk", "micro_batching_handler", config=MICRO_CONFIG))
    run = h.run(batch)

    assert h.handler.seen_batches == [4, 1]
    assert_close(run.output, expected)
    assert {stage: run.stages[stage].calls for stage in ("preprocess", "inference", "postprocess")} == {
        "preprocess": 2,
        "inference": 2,
        "postprocess": 2,
    }
    inference = run.stages["inference"]
    assert [tuple(x.shape) for x in inference.input] == [(4, 4), (1, 4)]
    assert [tuple(y.shape) for y in inference.output] == [(4, 3), (1, 3)]


@pytest.mark.torchserve
def test_micro_batching_assigned_in_initialize_is_ignored_as_by_torchserve(tmp_path, micro_batchings):
    """A MicroBatching assigned to ``self.handle`` inside ``initialize`` is never called by the
    worker: ts/model_loader.py returns ``model_service.handle, model_service.initialize`` (0.12,
    line 192) and only then runs ``initialize_fn(service.context)`` (line 143), so the bound
    BaseHandler.handle it took runs the whole batch of 5 at once. The Harness must do the same."""
    batch = rows_batch(5)
    service = ts_load(archive(tmp_path / "ts", "late_micro_batching_handler", "torchserve"), 5)
    code, expected = ts_predict(service, batch)
    assert code == 200
    assert served_handler(service).seen_batches == [5]

    h = harness(archive(tmp_path / "hk", "late_micro_batching_handler"))
    with pytest.warns(hk.HandlerkitWarning, match="takes handle before initialize runs, so the server ignores it"):
        run = h.run(batch)  # runs initialize first, which sets self.handle: the harness says so

    assert h.handler.seen_batches == [5]
    assert_close(run.output, expected)
    assert run.stages["inference"].calls == 1


# ---------------------------------------------------------------------------------------------
# 2. Raw data, as TorchServe's own unit tests pass it
# ---------------------------------------------------------------------------------------------


@pytest.mark.torchserve
@pytest.mark.parametrize("base", ["handlerkit", "torchserve"])
def test_raw_list_data_is_delivered_as_is(argmax_dir, base):
    """ts/torch_handler/unit_tests/test_base_handler.py calls ``handle([[1.0, 2.0]], ctx)``: data
    that is a plain list of rows, not request dicts. ``h.run`` and ``h.preprocess`` take such a
    list and hand it to the handler unchanged, one request per item."""
    from ts.torch_handler.base_handler import BaseHandler as TsBaseHandler
    from ts.torch_handler.unit_tests.test_utils.mock_context import MockContext as TsMockContext

    data = [[1.0, 2.0], [4.0, 3.0]]
    ts_ctx = TsMockContext(model_dir=str(argmax_dir), model_file="model.py", gpu_id=None)
    ground_truth = TsBaseHandler()
    with ts_imports(argmax_dir):
        ground_truth.initialize(ts_ctx)
        expected = ground_truth.handle(copy.deepcopy(data), ts_ctx)
    assert expected == [1, 0]

    handler = BaseHandler() if base == "handlerkit" else TsBaseHandler()
    h = hk.Harness(handler, hk.MockContext(model_dir=argmax_dir, gpu_id=None))
    run = h.run(copy.deepcopy(data))
    assert run.output == expected
    assert run.batch_size == 2
    assert run.stages["preprocess"].input == data

    pre = h.preprocess([[1.0, 2.0]])
    assert pre.input == [[1.0, 2.0]]
    assert pre.output.tolist() == [[1.0, 2.0]]
    assert len(h.context.request_ids) == 1


@pytest.mark.parametrize("value", [torch.tensor([[1.0, 2.0]]), "text"], ids=["tensor", "str"])
def test_data_that_is_not_a_list_is_refused_with_the_fix(argmax_dir, value):
    """``handle(data, context)`` always gets a list (one item per request); anything else is
    refused before the handler runs, with a message that says to pass a list."""
    h = hk.Harness(BaseHandler(), hk.MockContext(model_dir=argmax_dir, gpu_id=None))
    with pytest.raises(TypeError, match="list"):
        h.run(value)
    with pytest.raises(TypeError, match="list"):
        h.preprocess(value)


# ---------------------------------------------------------------------------------------------
# 3. Headers the frontend adds (test/pytest/test_url_path.py)
# ---------------------------------------------------------------------------------------------

# What TorchServe 0.12's frontend does for POST /predictions/{model}/{version}/{more...}:
# frontend/server/src/main/java/org/pytorch/serve/http/api/rest/InferenceRequestHandler.java
# (tag v0.12.0), handlePredictions: line 168 adds header url_path "", line 177 adds url_path =
# the segments after the version joined by "/", line 180 adds explain "False" (line 182 "True"
# for /explanations). parseRequest (lines 320-321) copies every header with
# RequestInput.updateHeaders (util/messages/RequestInput.java line 44: headers.put), so the last
# value wins and the worker sees url_path "v1/sum" and explain "False".


@pytest.mark.torchserve
def test_url_path_and_explain_headers_reach_the_handler_as_from_the_frontend(tmp_path):
    """test/pytest/test_url_path.py: a handler reads ``get_request_header(i, "url_path")`` to
    route. ``Request.json(obj, url_path=...)`` and ``req.with_url_path(...)`` build what the
    frontend sends for /predictions/tiny/1.0/<path>: the path, and ``explain: "False"``. Served
    by TorchServe's Service from the wire message, the handler answers the same."""
    batch = hk.batch(hk.Request.json([1, 5, 2], url_path="v1/sum"), hk.Request.json([1, 5, 2]).with_url_path("v1/max"))
    expected = [
        {"url_path": "v1/sum", "explain": "False", "result": 8},
        {"url_path": "v1/max", "explain": "False", "result": 5},
    ]

    h = harness(archive(tmp_path / "hk", "url_path_handler", model=False))
    assert h.run(batch).output == expected
    assert [h.context.get_request_header(i, "url_path") for i in range(2)] == ["v1/sum", "v1/max"]

    service = ts_load(archive(tmp_path / "ts", "url_path_handler", "torchserve", model=False), 2)
    assert ts_predict(service, batch) == (200, expected)


# ---------------------------------------------------------------------------------------------
# 4. Custom metrics (examples/custom_metrics)
# ---------------------------------------------------------------------------------------------

METRICS_YAML = """\
dimensions:
  - &model_name "ModelName"

model_metrics:
  counter:
    - name: InferenceRequestCount
      unit: count
      dimensions: []
  gauge:
    - name: RequestBatchSize
      unit: count
      dimensions: [*model_name]
"""
DECLARED = ("InferenceRequestCount", "RequestBatchSize")


def _metric_line(text: str) -> str:
    """``[METRICS]name.unit:value|#dims|#type:KIND`` — a metric log line without host, time, id."""
    return "|".join(text.split("|")[:3])


@pytest.mark.torchserve
def test_metrics_declared_in_a_metrics_yaml_are_emitted_like_torchserve(tmp_path, caplog):
    """examples/custom_metrics: ``get_metric`` finds the metrics the metrics.yaml declares.
    ``MockContext.from_model_dir(..., metrics_config=path)`` declares them as TorchServe's
    ``MetricsCacheYamlImpl`` does from the same file, and the values come out the same."""
    from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl

    config = tmp_path / "metrics.yaml"
    config.write_text(METRICS_YAML)
    batch = rows_batch(3)

    cache = MetricsCacheYamlImpl(config_file_path=str(config))
    cache.initialize_cache()
    cache.model_name = MODEL_NAME
    caplog.set_level(logging.INFO, logger="ts.metrics.caching_metric")
    service = ts_load(archive(tmp_path / "ts", "metrics_handler", "torchserve"), 3, metrics_cache=cache)
    code, expected = ts_predict(service, batch)
    assert code == 200
    theirs = [_metric_line(r.getMessage()) for r in caplog.records if r.getMessage().startswith(tuple(f"[METRICS]{n}." for n in DECLARED))]
    assert theirs == ["[METRICS]InferenceRequestCount.Count:3|#|#type:COUNTER", "[METRICS]RequestBatchSize.Count:3|#ModelName:tiny|#type:GAUGE"]

    h = harness(archive(tmp_path / "hk", "metrics_handler"), metrics_config=config)
    run = h.run(batch)
    assert_close(run.output, expected)
    ours = [_metric_line(str(r)) for r in run.stages["preprocess"].metrics if r.name in DECLARED]
    assert ours == theirs


@pytest.mark.torchserve
@pytest.mark.parametrize("n", [1, 2], ids=["one request", "two requests"])
def test_undeclared_metric_fails_like_torchserve_and_blames_no_request(tmp_path, n):
    """With the default metrics config (TorchServe's ts/configs/metrics.yaml declares only
    HandlerTime and PredictionTime) ``get_metric("InferenceRequestCount", ...)`` raises a KeyError;
    the worker answers 503. The Harness fails the stage too, but the fault is the metrics config,
    not a request: no ``request_index``, and a ``fix`` that points at the metrics."""
    batch = rows_batch(n)
    service = ts_load(archive(tmp_path / "ts", "metrics_handler", "torchserve"), n)
    assert ts_predict(service, batch) == (503, [])

    h = harness(archive(tmp_path / "hk", "metrics_handler"))
    with pytest.raises(hk.StageError) as caught:
        h.run(batch)
    error = caught.value
    assert error.stage == "preprocess"
    assert isinstance(error.original, KeyError)
    assert "InferenceRequestCount" in str(error.original)
    assert error.request_index is None
    assert error.fix is not None and "metrics" in error.fix


@pytest.mark.torchserve
def test_default_metrics_config_declares_what_torchserve_declares():
    """The other side of the default config: what ts/configs/metrics.yaml declares under
    ``model_metrics`` (HandlerTime, PredictionTime gauges) ``get_metric`` finds, with the same
    dimension names, on a default MockContext."""
    cache = ts_metrics_cache(MODEL_NAME)
    declared = [(kind, metric) for kind, metrics in cache.cache.items() for metric in metrics.values()]
    assert {m.metric_name for _, m in declared} >= {"HandlerTime", "PredictionTime"}
    ctx = hk.MockContext(gpu_id=None)
    for kind, theirs in declared:
        ours = ctx.metrics.get_metric(theirs.metric_name, kind)
        assert list(ours.dimension_names) == list(theirs.dimension_names), theirs.metric_name


# ---------------------------------------------------------------------------------------------
# 5. State and randomness under h.check (examples/stateful, examples/dcgan_fashiongen)
# ---------------------------------------------------------------------------------------------


def in_sequence(sequence: str, value: int) -> hk.Request:
    """A request of sequence ``sequence``: the frontend puts its id in ``ts_request_sequence_id``
    (ConfigManager.getTsHeaderKeySequenceId's default; ``Context.get_sequence_id`` reads it)."""
    return hk.Request.json(value).with_headers(ts_request_sequence_id=f"seq-{sequence}")


@pytest.mark.torchserve
def test_running_sums_per_sequence_match_torchserve_across_calls(tmp_path):
    """examples/stateful: a running total per sequence id survives from one batch to the next,
    under TorchServe's Service and under the Harness alike."""
    batches = [
        hk.batch(in_sequence("a", 3), in_sequence("b", 10)),
        hk.batch(in_sequence("a", 4)),
        hk.batch(in_sequence("b", 1), in_sequence("a", 2)),
    ]
    service = ts_load(archive(tmp_path / "ts", "stateful_handler", "torchserve", model=False), 2)
    theirs = [ts_predict(service, b)[1] for b in batches]
    h = harness(archive(tmp_path / "hk", "stateful_handler", model=False))
    ours = [h.run(b).output for b in batches]
    assert ours == theirs == [[3, 10], [7], [11, 9]]


def _cannot_judge(text: str) -> bool:
    return re.match(r"cannot judge: \S", text) is not None


def test_check_cannot_judge_batch_parity_of_a_stateful_handler(tmp_path):
    """examples/stateful under ``h.check``: every run changes the totals, so "alone" and "in the
    batch" give different sums without any batch dependence. check must see state it cannot
    reset and say "cannot judge: ...", not report a batch-parity error."""
    h = harness(archive(tmp_path / "hk", "stateful_handler", model=False))
    report = h.check(hk.batch(in_sequence("a", 3), in_sequence("b", 10)))
    assert report.ok, report
    assert [p for p in report.problems if p.check == "batch-parity"] == []
    assert len(report.parity) == 2
    assert all(_cannot_judge(text) for _, text in report.parity), report.parity


def test_check_cannot_judge_batch_parity_of_a_handler_that_samples_noise(tmp_path):
    """examples/dcgan_fashiongen under ``h.check``: noise drawn per request in a loop. check seeds
    the RNG the same way for the "alone" and "together" runs, yet request 1 alone draws what
    request 0 draws in the batch; check must say "cannot judge: ..." for it, not report an error."""
    h = harness(archive(tmp_path / "hk", "noise_handler"))
    report = h.check(rows_batch(3))
    assert report.ok, report
    assert [p for p in report.problems if p.check == "batch-parity"] == []
    texts = [text for _, text in report.parity]
    assert len(texts) == 3
    assert any(_cannot_judge(t) for t in texts), texts
    assert all(_cannot_judge(t) or t == "same alone and in the batch" for t in texts), texts


def test_check_still_reports_a_batch_dependent_handler(tmp_path):
    """The parity check keeps its teeth: a handler that scales by the batch max (deterministic,
    stateless) gives other answers alone, and that is a batch-parity error, not "cannot judge"."""
    h = harness(archive(tmp_path / "hk", "batch_max_handler"))
    report = h.check(rows_batch(3))
    assert not report.ok
    parity = [p for p in report.problems if p.check == "batch-parity"]
    assert sorted(p.request_index for p in parity) == [0, 2]  # request 1 holds the batch max
    assert all(p.severity == "error" for p in parity)
    assert not any(_cannot_judge(text) for _, text in report.parity), report.parity


# ---------------------------------------------------------------------------------------------
# 6. BaseHandler.initialize consumes pt2.compile.enable
# ---------------------------------------------------------------------------------------------

PT2_CASES = {
    # TorchServe deletes "enable" only when it is True (base_handler.py: `if compile_options["enable"]
    # == True: del compile_options["enable"]`); backend eager compiles lazily, in no time.
    "enabled": ({"compile": {"enable": True, "backend": "eager"}}, {"compile": {"backend": "eager"}}),
    "disabled": ({"compile": {"enable": False, "backend": "eager"}}, {"compile": {"enable": False, "backend": "eager"}}),
}


@pytest.mark.torchserve
@pytest.mark.parametrize("case", list(PT2_CASES))
def test_initialize_leaves_the_context_config_as_torchserve_does(mlp_dir, case):
    """TorchServe's BaseHandler.initialize deletes ``pt2.compile.enable`` from the context's
    ``model_yaml_config`` when it is true (a side effect handlers can observe, and the reason a
    second initialize on the same context fails). handlerkit's BaseHandler leaves the context's
    config exactly as TorchServe's does."""
    from ts.torch_handler.base_handler import BaseHandler as TsBaseHandler

    given, expected = PT2_CASES[case]
    after = {}
    for name, handler_class in (("torchserve", TsBaseHandler), ("handlerkit", BaseHandler)):
        ctx = hk.MockContext(model_dir=mlp_dir, gpu_id=None, model_yaml_config={"pt2": copy.deepcopy(given)})
        with ts_imports(mlp_dir):
            handler_class().initialize(ctx)
        after[name] = ctx.model_yaml_config
    assert after["torchserve"] == {"pt2": expected}
    assert after["handlerkit"] == after["torchserve"]


@pytest.mark.torchserve
@pytest.mark.parametrize("base", ["handlerkit", "torchserve"])
def test_harness_hands_each_initialize_a_fresh_config(mlp_dir, base):
    """Because initialize consumes ``pt2.compile.enable``, the Harness gives every initialize its
    own copy of the config: two ``h.initialize()`` in a row both compile the model."""
    from torch._dynamo.eval_frame import OptimizedModule
    from ts.torch_handler.base_handler import BaseHandler as TsBaseHandler

    config = {"pt2": {"compile": {"enable": True, "backend": "eager"}}}
    handler = BaseHandler() if base == "handlerkit" else TsBaseHandler()
    h = hk.Harness(handler, hk.MockContext(model_dir=mlp_dir, gpu_id=None, model_yaml_config=config))
    for _ in range(2):
        assert h.initialize().ok
        assert isinstance(h.handler.model, OptimizedModule)


# ---------------------------------------------------------------------------------------------
# 7. ENABLE_TORCH_PROFILER
# ---------------------------------------------------------------------------------------------


def _profiler_args(trace_dir: Path) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity

    return {"activities": [ProfilerActivity.CPU], "on_trace_ready": torch.profiler.tensorboard_trace_handler(str(trace_dir))}


@pytest.mark.torchserve
@pytest.mark.parametrize("base", ["handlerkit", "torchserve"])
def test_enable_torch_profiler_writes_a_trace_and_keeps_stage_results(tmp_path, monkeypatch, base):
    """BaseHandler.handle runs the stages under ``torch.profiler.profile(**self.profiler_args)``
    when ENABLE_TORCH_PROFILER is set (ts/torch_handler/base_handler.py, _infer_with_profiler), so
    the handler's ``on_trace_ready`` writes a trace. ``h.run`` does so too, and still reports each
    stage."""
    monkeypatch.setenv("ENABLE_TORCH_PROFILER", "true")
    batch = rows_batch(2)
    service = ts_load(archive(tmp_path / "ts", "json_rows_handler", "torchserve"), 2)
    served_handler(service).profiler_args = _profiler_args(tmp_path / "ts_traces")
    code, expected = ts_predict(service, batch)
    assert code == 200
    assert list((tmp_path / "ts_traces").glob("*.pt.trace.json"))

    h = harness(archive(tmp_path / "hk", "json_rows_handler", base))
    h.handler.profiler_args = _profiler_args(tmp_path / "hk_traces")
    run = h.run(batch)

    assert list((tmp_path / "hk_traces").glob("*.pt.trace.json")), "h.run wrote no profiler trace"
    assert_close(run.output, expected)
    for stage in ("preprocess", "inference", "postprocess"):
        assert run.stages[stage].ok, stage
        assert run.stages[stage].wall_ms > 0, stage


# ---------------------------------------------------------------------------------------------
# 8. Service envelopes (service_envelope=json|kservev2 in config.properties)
# ---------------------------------------------------------------------------------------------


@pytest.mark.torchserve
def test_json_envelope_in_the_harness_answers_what_the_worker_answers(tmp_path):
    """With ``service_envelope=json`` the worker wraps handle: the instances of every request go to
    the handler as one flat list, and the answers come back per request as ``{"predictions": ...}``.
    ``hk.Harness(..., envelope="json")`` applies the same envelope to the same requests."""
    from handlerkit.worker.clients import request, unwrap_response

    batch = hk.batch(request("json", ROWS[:2]), request("json", ROWS[2:3]))
    service = ts_load(archive(tmp_path / "ts", "rows_handler", "torchserve"), 2, envelope="json")
    code, expected = ts_predict(service, batch)
    assert code == 200 and [len(unwrap_response("json", item)) for item in expected] == [2, 1]

    ctx = hk.MockContext.from_model_dir(archive(tmp_path / "hk", "rows_handler"))
    h = hk.Harness(ctx.manifest["model"]["handler"], ctx, envelope="json")
    run = h.run(batch)
    assert [json.loads(item) for item in run.output] == expected  # the json envelope answers JSON text
    assert run.stages["preprocess"].input == ROWS[:3]  # the envelope's flat list of instances
    assert torch.equal(h.preprocess(batch).output, torch.tensor(ROWS[:3]))  # a single step sees it too


@pytest.mark.torchserve
def test_kservev2_envelope_in_the_harness_answers_what_the_worker_answers(tmp_path):
    from handlerkit.worker.clients import request

    batch = hk.batch(request("kservev2", ROWS[:2], id="req-7"))
    service = ts_load(archive(tmp_path / "ts", "v2_rows_handler", "torchserve"), 1, envelope="kservev2")
    code, expected = ts_predict(service, batch)
    assert code == 200 and expected[0]["id"] == "req-7"

    ctx = hk.MockContext.from_model_dir(archive(tmp_path / "hk", "v2_rows_handler"))
    run = hk.Harness(ctx.manifest["model"]["handler"], ctx, envelope="kservev2").run(batch)
    assert json.loads(json.dumps(run.output, default=list)) == expected


def test_an_error_under_an_envelope_is_not_blamed_on_a_request_the_harness_cannot_tell(tmp_path):
    """Under an envelope preprocess sees the envelope's flat list, not the requests: running each
    request alone through preprocess proves nothing, so no request is named."""
    from handlerkit.worker.clients import request

    ctx = hk.MockContext.from_model_dir(archive(tmp_path / "hk", "rows_handler"))
    h = hk.Harness(ctx.manifest["model"]["handler"], ctx, envelope="json")
    batch = hk.batch(request("json", ROWS[:1]), request("json", [["not", "numbers"]]))
    with pytest.raises(hk.StageError) as info:
        h.run(batch)
    assert info.value.stage == "preprocess" and info.value.request_index is None
    assert h.run(hk.batch(request("json", ROWS[:2]))).output  # and the harness keeps working
