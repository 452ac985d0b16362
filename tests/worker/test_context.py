"""MockContext (handlerkit.worker.context).

Reading a model dir (manifest, config discovery) is tested in test_modeldir.py, the request
processors in test_request_processor.py, and TorchServe's own handler unit tests run with this
MockContext swapped in (test_context_torchserve_unit_tests.py).
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import pytest

from handlerkit.errors import HandlerkitWarning, ModelLoadError
from handlerkit.worker import context as context_module
from handlerkit.worker.config import parse_config
from handlerkit.worker.context import MockContext, RecordingMetrics, ResponseInfo, bind_requests

# ---------------------------------------------------------------------------------------------
# MockContext: TorchServe's test signature and every Context method
# ---------------------------------------------------------------------------------------------


def test_mock_context_accepts_torchserve_test_signature(tmp_path):
    (tmp_path / "cfg.yaml").write_text("handler:\n  topk: 3\nbatchSize: 4\n")
    ctx = MockContext("weights.pt", str(tmp_path), "net.py", "1", "resnet", "cfg.yaml")
    assert ctx.model_name == "resnet"
    assert ctx.manifest == {
        "model": {
            "modelName": "resnet",
            "serializedFile": "weights.pt",
            "modelFile": "net.py",
            "configFile": "cfg.yaml",
        }
    }
    assert ctx.model_yaml_config == {"handler": {"topk": 3}, "batchSize": 4}
    assert type(ctx.model_yaml_config) is dict
    assert ctx.model_yaml_config["handler"]["topk"] == 3
    props = ctx.system_properties
    assert props == {
        "model_dir": str(tmp_path),
        "gpu_id": "1",
        "batch_size": 1,
        "server_name": "MMS",
        "server_version": "0.12.0",
        "limit_max_image_pixels": True,
    }


def test_mock_context_defaults(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    ctx = MockContext()
    assert ctx.system_properties["model_dir"] == str(tmp_path)
    assert os.path.isabs(ctx.system_properties["model_dir"])
    assert ctx.system_properties["gpu_id"] == "0"
    assert ctx.manifest == {"model": {"modelName": "mnist", "serializedFile": "model.pt", "modelFile": "model.py"}}
    assert ctx.model_yaml_config == {}
    assert ctx.stopping_criteria is None
    # No request before a batch is bound, as in ts.context.Context.
    assert ctx.request_ids is None and ctx.request_processor is None
    assert ctx.get_request_id() is None
    assert ctx.responses() == []
    assert isinstance(ctx.metrics, RecordingMetrics)
    assert ctx.metrics.model_name == "mnist"
    # ts.model_loader gives the metrics of the model load one fresh request id (a str).
    uuid.UUID(ctx.metrics.request_ids)


@pytest.mark.torchserve
def test_before_any_batch_responses_fail_as_in_torchserve():
    """TorchServe's Context has request_processor None until the first predict: setting or
    reading a response before a batch fails there, so it fails here too, with the fix."""
    from ts.context import Context

    ours = MockContext(gpu_id=None)
    theirs = Context("m", "/tmp", {"model": {}}, 1, None, "0.12.0")
    calls = {
        "get_response_status": lambda c: c.get_response_status(0),
        "get_response_headers": lambda c: c.get_response_headers(0),
        "get_response_content_type": lambda c: c.get_response_content_type(0),
        "set_response_header": lambda c: c.set_response_header(0, "a", "b"),
        "set_response_content_type": lambda c: c.set_response_content_type(0, "text/plain"),
        "set_all_response_status": lambda c: c.set_all_response_status(500, "x"),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError) as expected:
            call(theirs)
        with pytest.raises(TypeError, match=r"request_processor is None until a batch is bound") as got:
            call(ours)
        assert str(got.value).startswith(str(expected.value)), name
        assert "bind its data first as the worker does: hk.Batch.coerce(data).bind(ctx)" in str(got.value)
    # set_response_status keeps TorchServe's None guard; get_request_id gives None.
    for ctx in (ours, theirs):
        ctx.set_response_status(500, "x")
        assert ctx.request_ids is None and ctx.get_request_id(0) is None


@pytest.mark.torchserve
def test_before_any_batch_header_reads_answer_as_torchserves_test_mock():
    """TorchServe's handler unit tests call handle(data, ctx) on their test MockContext, whose
    get_request_header answers False for request 0: explain and describe are off. Ours answers
    as for a request without headers, whatever ``explain`` is set to (theirs reads it only for
    requests after the first)."""
    from ts.torch_handler.unit_tests.test_utils.mock_context import MockContext as TsMockContext

    ours, theirs = MockContext(gpu_id=None), TsMockContext(gpu_id=None)
    assert ours.explain is theirs.explain is False
    for ctx in (ours, theirs):
        ctx.explain = True
        for key in ("explain", "describe", "url_path"):
            assert not ctx.get_request_header(0, key), key
    assert ours.get_request_header(0, "explain") is None
    assert ours.get_request_header(3, "describe") is None  # any index: there is no batch to be out of
    assert ours.get_all_request_header(0) == {}
    assert ours.get_sequence_id(0) is None
    assert ours.request_processor is None and ours.responses() == []


def test_header_reads_are_noted_only_inside_the_block():
    ctx = MockContext()
    ctx.get_request_header(0, "before")
    with ctx.noting_header_reads() as reads:
        ctx.get_request_header(0, "explain")
        ctx.get_request_header(0, "explain")  # noted once
        ctx.get_all_request_header(1)
        with ctx.noting_header_reads() as inner:
            ctx.get_sequence_id(0)
        _bound(ctx, [{"explain": "True"}])
        assert ctx.get_request_header(0, "explain") == "True"  # bound: answered, and noted as well
    ctx.get_request_header(0, "after")
    assert inner == ["get_sequence_id(0)"]
    assert reads == ["get_request_header(0, 'explain')", "get_all_request_header(1)"]


def test_implicit_batch_is_reset_by_any_binding():
    ctx = MockContext()
    assert ctx.implicit_batch is False
    ctx.implicit_batch = True
    _bound(ctx, [{}])
    assert ctx.implicit_batch is False
    ctx.implicit_batch = True
    ctx.request_processor = None  # set directly, as TorchServe's service does
    assert ctx.implicit_batch is False


def test_mock_context_falsy_files_left_out_and_gpu_none_kept():
    ctx = MockContext(model_pt_file=None, model_file="", gpu_id=None)
    assert ctx.manifest == {"model": {"modelName": "mnist"}}
    assert ctx.system_properties["gpu_id"] is None


def test_mock_context_keyword_extras():
    metrics = RecordingMetrics()
    manifest = {"runtime": "python", "model": {"modelName": "x", "handler": "h.py"}}
    ctx = MockContext(
        manifest=manifest,
        batch_size=8,
        limit_max_image_pixels=False,
        model_yaml_config={"handler": {"a": 1}},
        metrics=metrics,
        server_version="9.9",
    )
    assert ctx.manifest is manifest
    assert ctx.system_properties["batch_size"] == 8
    assert ctx.system_properties["limit_max_image_pixels"] is False
    assert ctx.system_properties["server_version"] == "9.9"
    assert ctx.model_yaml_config == {"handler": {"a": 1}}
    assert ctx.metrics is metrics


def test_mock_context_config_object_with_raw_and_conflicts(tmp_path):
    class Cfg:
        raw = {"batchSize": 2}

    assert MockContext(model_yaml_config=Cfg()).model_yaml_config == {"batchSize": 2}
    with pytest.raises(ValueError, match="not both"):
        MockContext(model_dir=tmp_path, model_yaml_config_file="c.yaml", model_yaml_config={})
    with pytest.raises(TypeError, match="mapping"):
        MockContext(model_yaml_config=["a"])


def test_system_properties_is_read_only_property():
    ctx = MockContext()
    with pytest.raises(AttributeError):
        ctx.system_properties = {}


def _bound(ctx, headers):
    ids = {i: f"req-{i}" for i in range(len(headers))}
    return bind_requests(ctx, ids, headers)


def test_every_context_method():
    ctx = MockContext()
    _bound(
        ctx,
        [
            {"body": {"content-type": "image/png"}, "explain": "True", "ts_request_sequence_id": "seq-1"},
            {"data": {"content-type": ""}},
        ],
    )
    assert ctx.get_request_id() == "req-0"
    assert ctx.get_request_id(1) == "req-1"
    assert ctx.get_request_id(5) is None
    assert ctx.get_request_header(0, "explain") == "True"
    assert ctx.get_request_header(0, "body") == {"content-type": "image/png"}
    assert ctx.get_request_header(1, "explain") is None
    assert ctx.get_all_request_header(1) == {"data": {"content-type": ""}}
    assert ctx.get_sequence_id(0) == "seq-1"
    assert ctx.get_sequence_id(1) is None

    assert ctx.get_response_status(0) == (200, None)
    ctx.set_response_status(404, "Not Found", idx=1)
    assert ctx.get_response_status(1) == (404, "Not Found")
    ctx.set_response_status()  # TorchServe's defaults: 200, "" on request 0
    assert ctx.get_response_status(0) == (200, "")

    ctx.set_response_content_type(0, "application/json")
    assert ctx.get_response_content_type(0) == "application/json"
    assert ctx.get_response_content_type(1) is None
    ctx.set_response_header(1, "x-top", "cat")
    assert ctx.get_response_headers(1) == {"x-top": "cat"}

    assert ctx.responses() == [
        ResponseInfo(200, "", {"content-type": "application/json"}),
        ResponseInfo(404, "Not Found", {"x-top": "cat"}),
    ]
    assert ctx.responses()[0].content_type == "application/json"

    ctx.set_all_response_status(507, "Out of resources")
    assert [r[:2] for r in ctx.responses()] == [(507, "Out of resources")] * 2
    with pytest.raises(IndexError):
        ctx.get_request_header(2, "x")


def test_responses_are_snapshots():
    ctx = _bound(MockContext(), [{}])
    snapshot = ctx.responses()
    ctx.set_response_header(0, "a", "b")
    assert snapshot[0].headers == {}


def test_get_request_id_without_ids():
    ctx = MockContext()
    ctx.request_ids = None
    assert ctx.get_request_id(0) is None


def test_sequence_header_names_from_env(monkeypatch):
    monkeypatch.setenv("TS_REQUEST_SEQUENCE_ID", "x-seq")
    monkeypatch.setenv("TS_REQUEST_SEQUENCE_START", "x-start")
    monkeypatch.setenv("TS_REQUEST_SEQUENCE_END", "x-end")
    ctx = MockContext()
    assert (ctx.header_key_sequence_id, ctx.header_key_sequence_start, ctx.header_key_sequence_end) == (
        "x-seq",
        "x-start",
        "x-end",
    )
    _bound(ctx, [{"x-seq": "s-9", "ts_request_sequence_id": "wrong"}])
    assert ctx.get_sequence_id(0) == "s-9"


def test_sequence_header_defaults(monkeypatch):
    for name in ("TS_REQUEST_SEQUENCE_ID", "TS_REQUEST_SEQUENCE_START", "TS_REQUEST_SEQUENCE_END"):
        monkeypatch.delenv(name, raising=False)
    ctx = MockContext()
    assert ctx.header_key_sequence_id == "ts_request_sequence_id"
    assert ctx.header_key_sequence_start == "ts_request_sequence_start"
    assert ctx.header_key_sequence_end == "ts_request_sequence_end"


def test_intermediate_responses_are_collected():
    ctx = MockContext()
    ctx.cl_socket.sendall(bytearray(b"chunk"))
    assert ctx.cl_socket.sent == [b"chunk"]


def test_repr():
    text = repr(MockContext(model_name="shapes", gpu_id=None))
    assert "shapes" in text and "gpu_id=None" in text and "requests=0" in text
    assert "requests=2" in repr(_bound(MockContext(), [{}, {}]))


def test_model_yaml_config_file_missing(tmp_path):
    with pytest.raises(ModelLoadError, match="model config '.*nope.yaml' does not exist") as info:
        MockContext(model_dir=tmp_path, model_yaml_config_file="nope.yaml")
    assert info.value.fix == "check the name (it is relative to the model dir)"


def test_model_yaml_config_is_a_private_deep_copy():
    raw = {"pt2": {"compile": {"enable": True, "backend": "eager"}}, "handler": {"topk": 2}}
    for given in (raw, parse_config(raw)):
        ctx = MockContext(model_yaml_config=given)
        assert ctx.model_yaml_config == raw and ctx.model_yaml_config is not raw
        # TorchServe's BaseHandler.initialize does this to the dict it is handed:
        del ctx.model_yaml_config["pt2"]["compile"]["enable"]
        assert raw["pt2"]["compile"] == {"enable": True, "backend": "eager"}


def test_docstring_example_names_a_real_model_dir():
    root = Path(__file__).resolve().parents[2]
    examples = re.findall(r'from_model_dir\("([^"]+)"\)', MockContext.__doc__)
    assert examples == ["fixtures/models/image_classifier"]
    assert (root / examples[0]).is_dir()


# ---------------------------------------------------------------------------------------------
# metrics_config: TorchServe's metrics.yaml for the fresh RecordingMetrics
# ---------------------------------------------------------------------------------------------


class _ConfiguredMetrics(RecordingMetrics):
    """Records the config it was built with (RecordingMetrics(config=...))."""

    def __init__(self, *args, config=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.given_config = config


@pytest.fixture
def loads(monkeypatch):
    """The paths handed to load_metrics_config, which returns a marker per path."""
    calls = []

    def load(path):
        calls.append(path)
        return ("config of", path)

    monkeypatch.setattr(context_module, "_load_metrics_config", load)
    monkeypatch.setattr(context_module, "RecordingMetrics", _ConfiguredMetrics)
    return calls


def test_metrics_config_default_is_torchserve_default(loads):
    ctx = MockContext(model_name="m")
    assert loads == [None]  # None: TorchServe's default metrics config
    assert ctx.metrics.given_config == ("config of", None)
    assert ctx.metrics.model_name == "m"


def test_metrics_config_given_to_the_constructor(loads, tmp_path):
    ctx = MockContext(metrics_config=tmp_path / "metrics.yaml")
    assert loads == [tmp_path / "metrics.yaml"]
    assert ctx.metrics.given_config == ("config of", tmp_path / "metrics.yaml")
    with pytest.raises(ValueError, match="pass metrics or metrics_config, not both"):
        MockContext(metrics=RecordingMetrics(), metrics_config="metrics.yaml")


def test_from_model_dir_resolves_metrics_config_like_config(loads, tmp_path, monkeypatch):
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "model.pt").write_bytes(b"")
    (model_dir / "metrics.yaml").write_text("model_metrics: {}\n")
    (tmp_path / "outside.yaml").write_text("model_metrics: {}\n")
    monkeypatch.chdir(tmp_path)
    with pytest.warns(HandlerkitWarning, match="inferred the manifest"):
        MockContext.from_model_dir(model_dir, metrics_config="metrics.yaml")  # in the model dir
        MockContext.from_model_dir(model_dir, metrics_config="outside.yaml")  # then the working dir
        MockContext.from_model_dir(model_dir)
        with pytest.raises(ModelLoadError, match=r"metrics_config 'nope\.yaml' not found in the model dir"):
            MockContext.from_model_dir(model_dir, metrics_config="nope.yaml")
    assert loads == [model_dir.resolve() / "metrics.yaml", tmp_path / "outside.yaml", None]


# ---------------------------------------------------------------------------------------------
# The context's metrics (the store itself is tested in test_metrics.py)
# ---------------------------------------------------------------------------------------------


def test_context_metrics_follow_bound_requests():
    ctx = MockContext(model_name="m")
    _bound(ctx, [{}, {}])
    ctx.metrics.add_time("T", 1, idx=1)
    assert ctx.metrics.last("T").request_id == "req-1"
    assert ctx.metrics.last("T").dimensions["ModelName"] == "m"


def test_metrics_model_name_kept_when_given():
    ctx = MockContext(model_name="m", metrics=RecordingMetrics(model_name="other"))
    assert ctx.metrics.model_name == "other"
