"""handlerkit.worker._wire: the OTF frame and the worker's decoding, proved with TorchServe 0.12's own
worker code (test-only dependency).

(a) ``Batch.encode()`` goes through ``ts.protocol.otf_message_handler.retrieve_msg`` and
``ts.service.Service.retrieve_data_for_inference``: the handler data and headers equal
``Batch.data`` and ``Batch.headers``, types included.
(b) A real ``ts.service.Service`` runs an entry point on ``Batch.to_worker_message()``: it gets
the same data, and its ``ts.context.Context`` answers like our bound ``MockContext``.
(c) ``Batch.bind`` works on TorchServe's own Context.
(d) The headers the frontend adds (``url_path``, ``explain``) travel in the frame, and
TorchServe's own ``BaseHandler`` routes on them as on the server.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from conftest import ts_metrics_cache

pytestmark = pytest.mark.torchserve

ts = pytest.importorskip("ts")
otf = pytest.importorskip("ts.protocol.otf_message_handler")
from ts.context import Context as TsContext  # noqa: E402
from ts.metrics.dimension import Dimension as TsDimension  # noqa: E402
from ts.metrics.metric_type_enum import MetricTypes  # noqa: E402
from ts.service import Service  # noqa: E402

from handlerkit.worker.batches import Batch, batch  # noqa: E402
from handlerkit.worker.context import MockContext, RecordingMetrics  # noqa: E402
from handlerkit.worker.requests import Parameter, Request  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


class FakeSocket:
    """What retrieve_msg reads from: ``recv(n)`` in small chunks, as a real socket may return."""

    def __init__(self, data: bytes, chunk: int = 7) -> None:
        self._buf = io.BytesIO(data)
        self._chunk = chunk

    def recv(self, n: int) -> bytes:
        return self._buf.read(min(n, self._chunk))

    def exhausted(self) -> bool:
        return self._buf.tell() == len(self._buf.getvalue())


class SentCollector:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.sent.append(bytes(data))


def assert_same_typed(actual: Any, expected: Any, path: str = "data") -> None:
    """Deep equality that also requires the same types (bytearray is not bytes, 1 is not 1.0)."""
    assert type(actual) is type(expected), f"{path}: {type(actual).__name__} != {type(expected).__name__}"
    if isinstance(expected, dict):
        assert list(actual) == list(expected), f"{path}: keys {list(actual)} != {list(expected)}"
        for key in expected:
            assert_same_typed(actual[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, list):
        assert len(actual) == len(expected), f"{path}: length"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same_typed(a, e, f"{path}[{i}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


@pytest.fixture(autouse=True)
def _default_decoding(monkeypatch):
    monkeypatch.delenv("TS_DECODE_INPUT_REQUEST", raising=False)


@pytest.fixture
def png_file(tmp_path):
    path = tmp_path / "kitten.png"
    path.write_bytes(PNG)
    return path


@pytest.fixture
def mixed_batch(png_file, tmp_path):
    (tmp_path / "notes.txt").write_text("zwölf")
    return batch(
        Request.from_file(png_file),
        Request.json({"instances": [[1, 2.5], None], "ok": True}),
        Request.text("the quick brown fox", headers={"X-Trace": "abc"}),
        Request.form(
            {
                "data": png_file,
                "caption": "a kitten",
                "meta": (json.dumps({"k": 1}), "application/json"),
                "blob": b"\x00\x01\x02",
                "note": tmp_path / "notes.txt",
            }
        ),
        Request.from_bytes(PNG, "image/jpeg", headers={"explain": "True"}),
        Request.from_bytes(b"raw", None),
        Request.from_bytes(b'{"a": 1}', "application/json; charset=utf-8"),
        Request.from_bytes(b"data=hello+there&n=1", "application/x-www-form-urlencoded"),
        Request.json([1, 2], name="data").with_headers({"describe": "True", "ts_request_sequence_id": "seq-7"}),
        Request.json({"prompt": "hi"}, url_path="v1/chat/completion"),
    )


def through_torchserve(b: Batch):
    """Encode, read back with TorchServe's socket decoder, turn into handler inputs with its Service."""
    sock = FakeSocket(b.encode())
    cmd, msg = otf.retrieve_msg(sock)
    assert cmd == b"I"
    assert sock.exhausted(), "retrieve_msg left bytes unread: the frame is malformed"
    processors, input_batch, req_id_map = Service.retrieve_data_for_inference(msg)
    return msg, processors, input_batch, req_id_map


# --------------------------------------------------------------------------------------------
# (a) the encoded message through TorchServe's decoder
# --------------------------------------------------------------------------------------------


def test_encoded_batch_decodes_to_batch_data(mixed_batch):
    msg, processors, input_batch, req_id_map = through_torchserve(mixed_batch)
    assert_same_typed(input_batch, mixed_batch.data)
    assert type(input_batch[0]["body"]) is bytearray
    assert type(input_batch[1]["body"]) is dict
    assert type(input_batch[2]["body"]) is str
    assert type(input_batch[3]["caption"]) is bytearray  # plain form fields stay bytes
    assert_same_typed([rp.get_request_properties() for rp in processors], mixed_batch.headers, "headers")
    assert req_id_map == mixed_batch.request_ids
    assert_same_typed(msg, mixed_batch.to_worker_message(), "worker message")


@pytest.mark.parametrize("flag", ["false", "False", "0"])
def test_decoding_disabled_matches_worker(mixed_batch, monkeypatch, flag):
    monkeypatch.setenv("TS_DECODE_INPUT_REQUEST", flag)
    raw = Batch.coerce(list(mixed_batch.requests))  # decode=None reads the env now
    assert raw.decode is False
    _, _, input_batch, _ = through_torchserve(raw)
    assert_same_typed(input_batch, raw.data)
    assert all(type(v) is bytearray for d in input_batch for v in d.values())


def test_decode_argument_matches_worker_env(mixed_batch, monkeypatch):
    monkeypatch.setenv("TS_DECODE_INPUT_REQUEST", "false")
    _, _, input_batch, _ = through_torchserve(mixed_batch)
    assert_same_typed(input_batch, batch(*mixed_batch.requests, decode=False).data)


def test_invalid_payloads_fall_back_like_the_worker():
    b = batch(Request.from_bytes(b"{broken", "application/json"), Request.from_bytes(b"\xff\xfe", "text/plain"))
    with pytest.warns(Warning):
        expected = b.data
    _, _, input_batch, _ = through_torchserve(b)
    assert_same_typed(input_batch, expected)


def test_an_untrimmed_media_type_stays_bytes_in_the_worker_too():
    # Netty's getMimeType keeps "application/json " (no trim); the worker then does not parse it.
    b = batch(
        Request.from_bytes(b'{"a": 1}', "application/json ; charset=utf-8"),
        Request.from_bytes(b'{"a": 1}', headers={"content-type": "application/json;charset=utf-8"}),
    )
    _, processors, input_batch, _ = through_torchserve(b)
    assert_same_typed(input_batch, b.data)
    assert_same_typed(input_batch, [{"body": bytearray(b'{"a": 1}')}, {"body": {"a": 1}}])
    assert_same_typed([rp.get_request_properties() for rp in processors], b.headers, "headers")


def test_urlencoded_forms_reach_the_worker_as_untyped_fields_the_last_of_a_repeated_name_kept():
    urlencoded = {"Content-Type": "application/x-www-form-urlencoded"}
    b = batch(
        Request.form({"data": "hello world", "raw": b"\x00\xff"}, headers=urlencoded),
        Request.form([("tag", "a"), ("tag", "b")], headers=urlencoded),
    )
    _, processors, input_batch, _ = through_torchserve(b)
    assert_same_typed(input_batch, b.data)
    assert_same_typed(input_batch, [{"data": bytearray(b"hello world"), "raw": bytearray(b"\x00\xff")}, {"tag": bytearray(b"b")}])
    assert_same_typed([rp.get_request_properties() for rp in processors], b.headers, "headers")
    assert b.headers[1]["tag"] == {"content-type": ""}


def test_raw_data_dicts_with_a_wire_form_round_trip():
    b = Batch.coerce([{"data": {"a": [1, 2]}, "s": "text", "img": bytearray(b"\x00\x01")}])
    _, processors, input_batch, _ = through_torchserve(b)
    assert_same_typed(input_batch, b.data)
    assert_same_typed([rp.get_request_properties() for rp in processors], b.headers, "headers")


def test_unicode_names_and_empty_values():
    b = batch(Request((Parameter("bödy", b"", "text/plain"), Parameter("x", b"", None)), {"Ü": "ä"}, "ïd"))
    msg, processors, input_batch, req_id_map = through_torchserve(b)
    assert_same_typed(input_batch, b.data)
    assert req_id_map == {0: "ïd"}
    assert processors[0].get_request_properties() == b.headers[0]


# --------------------------------------------------------------------------------------------
# (b) a real Service around a recording entry point
# --------------------------------------------------------------------------------------------


def probe_context(ctx: Any, n: int) -> dict[str, Any]:
    """Ask a context everything a handler may ask, then set statuses and headers."""
    answers: dict[str, Any] = {
        "request_ids": dict(ctx.request_ids),
        "ids": [ctx.get_request_id(i) for i in range(n)],
        "all_headers": [dict(ctx.get_all_request_header(i)) for i in range(n)],
        "explain": [ctx.get_request_header(i, "explain") for i in range(n)],
        "describe": [ctx.get_request_header(i, "describe") for i in range(n)],
        "url_path": [ctx.get_request_header(i, "url_path") for i in range(n)],
        "body": [ctx.get_request_header(i, "body") for i in range(n)],
        "sequence": [ctx.get_sequence_id(i) for i in range(n)],
        "status_before": [ctx.get_response_status(i) for i in range(n)],
        "content_type_before": [ctx.get_response_content_type(i) for i in range(n)],
    }
    ctx.set_all_response_status(202, "Accepted")
    ctx.set_response_status(404, "missing", idx=n - 1)
    ctx.set_response_content_type(0, "application/json")
    ctx.set_response_header(n - 1, "x-handler", "probe")
    answers["status_after"] = [ctx.get_response_status(i) for i in range(n)]
    answers["response_headers"] = [dict(ctx.get_response_headers(i)) for i in range(n)]
    answers["content_type_after"] = [ctx.get_response_content_type(i) for i in range(n)]
    answers["metrics_ids"] = dict(ctx.metrics.request_ids)
    return answers


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, Any]] = []
        self.answers: list[dict[str, Any]] = []

    def __call__(self, data, context):
        if data is None:  # TorchServe initialises function handlers with handle(None, ctx)
            return None
        self.calls.append((data, context))
        self.answers.append(probe_context(context, len(data)))
        return [{"n": i} for i in range(len(data))]


def make_service(tmp_path, entry_point, metrics) -> Service:
    (tmp_path / "model-config.yaml").write_text("batchSize: 9\nhandler:\n  topk: 3\n")
    model = {"modelName": "probe", "handler": "h.py", "configFile": "model-config.yaml"}
    manifest = {"runtime": "python", "model": model}
    service = Service("probe", str(tmp_path), manifest, entry_point, None, 9, True, metrics)
    service.set_cl_socket(SentCollector())
    return service


@pytest.mark.parametrize("metrics_kind", ["handlerkit", "torchserve"])
def test_service_predict_delivers_batch_data(tmp_path, mixed_batch, metrics_kind):
    if metrics_kind == "handlerkit":
        metrics = RecordingMetrics(model_name="probe")
    else:
        metrics = ts_metrics_cache("probe")
    recorder = Recorder()
    service = make_service(tmp_path, recorder, metrics)

    response = service.predict(mixed_batch.to_worker_message())

    (data, ts_ctx), = recorder.calls
    assert_same_typed(data, mixed_batch.data)
    assert ts_ctx is service.context
    assert ts_ctx.model_yaml_config == {"batchSize": 9, "handler": {"topk": 3}}

    # Our MockContext, bound to the same batch, answers exactly as TorchServe's Context did.
    ours = MockContext(model_name="probe", metrics=RecordingMetrics())
    mixed_batch.bind(ours)
    assert probe_context(ours, len(mixed_batch)) == recorder.answers[0]

    # And the response TorchServe would send back is byte-identical when built from ours.
    expected = otf.create_predict_response(
        [{"n": i} for i in range(len(mixed_batch))], mixed_batch.request_ids, "Prediction success", 200, context=ours
    )
    assert bytes(response) == bytes(expected)

    if metrics_kind == "handlerkit":
        (record,) = metrics.find("PredictionTime")
        assert record.unit == "ms" and record.metric_type == "gauge"
        assert record.request_id == ",".join(mixed_batch.request_ids.values())
        assert record.dimensions == {"ModelName": "probe", "Level": "Model"}


def test_service_and_mock_context_report_errors_the_same(tmp_path):
    def entry_point(data, context):
        if data is None:
            return None
        context.set_response_status(418, "teapot", idx=0)
        return ["only one"]  # wrong length for a batch of two

    b = batch(Request.text("a"), Request.text("b"))
    service = make_service(tmp_path, entry_point, RecordingMetrics())
    response = service.predict(b.to_worker_message())
    expected = otf.create_predict_response(None, b.request_ids, "number of batch response mismatched", 503)
    assert bytes(response) == bytes(expected)


def test_metrics_api_matches_torchserve_dimensions(tmp_path):
    """Our store and TorchServe's cache declare the same metrics with the same dimension names."""
    theirs = ts_metrics_cache("m")
    ours = RecordingMetrics(model_name="m")
    for store in (theirs, ours):
        store.request_ids = {0: "r0", 1: "r1"}
        store.add_counter("C", 1, idx=0, dimensions=[TsDimension("K", "v")])
        store.add_time("T", 2.5)
        store.add_size("S", 3, unit="kB")
        store.add_percent("P", 40)
        store.add_error("E", 1)
        store.add_metric("M", 1, "widgets", idx=1, dimensions=[], metric_type=MetricTypes.HISTOGRAM)
        store.add_metric_to_cache("Cached", "ms", ["A"], MetricTypes.GAUGE)
    kinds = {"C": "COUNTER", "T": "GAUGE", "S": "GAUGE", "P": "GAUGE", "E": "COUNTER", "M": "HISTOGRAM", "Cached": "GAUGE"}
    for name, kind in kinds.items():
        theirs_metric = theirs.get_metric(name, MetricTypes[kind])
        ours_metric = ours.get_metric(name, MetricTypes[kind])
        assert ours_metric.dimension_names == theirs_metric.dimension_names, name
        assert ours_metric.metric_type.value == theirs_metric.metric_type.value
    dims = {r.name: list(r.dimensions) for r in ours.records}
    assert dims["C"] == ["K", "ModelName", "Level"]
    assert dims["E"] == ["Level"]


# --------------------------------------------------------------------------------------------
# (c) bind() on TorchServe's own Context
# --------------------------------------------------------------------------------------------


def test_bind_onto_real_ts_context(mixed_batch):
    metrics = RecordingMetrics(model_name="m")
    ctx = TsContext("m", "/tmp", {"model": {}}, 2, None, ts.__version__, True, metrics, {})
    assert mixed_batch.bind(ctx) is ctx
    assert ctx.request_ids == mixed_batch.request_ids
    assert metrics.request_ids == mixed_batch.request_ids
    assert ctx.get_request_header(4, "explain") == "True"
    assert ctx.get_request_header(0, "body") == {"content-type": "image/png"}
    assert ctx.get_sequence_id(8) == "seq-7"
    ctx.set_response_status(500, "x", idx=1)
    mixed_batch.bind(ctx)  # a new call starts clean
    assert ctx.get_response_status(1) == (200, None)
    ours = MockContext(metrics=RecordingMetrics())
    mixed_batch.bind(ours)
    assert probe_context(ctx, len(mixed_batch)) == probe_context(ours, len(mixed_batch))


def test_bind_onto_ts_context_without_metrics():
    ctx = TsContext("m", "/tmp", {"model": {}}, 1, None, ts.__version__)
    batch(Request.text("a", request_id="r")).bind(ctx)
    assert ctx.get_request_id(0) == "r"


def test_torchserve_test_mock_context_signature_is_accepted(tmp_path):
    """Arguments written for ts' own test MockContext work for ours."""
    mock_module = pytest.importorskip("ts.torch_handler.unit_tests.test_utils.mock_context")
    (tmp_path / "cfg.yaml").write_text("handler: {a: 1}\n")
    args = ("m.pt", str(tmp_path), "m.py", "0", "net", "cfg.yaml")
    theirs = mock_module.MockContext(*args)
    ours = MockContext(*args)
    for key, value in theirs.manifest["model"].items():
        assert ours.manifest["model"][key] == value
    assert ours.model_yaml_config == theirs.model_yaml_config
    assert ours.system_properties["model_dir"] == theirs.system_properties["model_dir"]


def test_streaming_intermediate_responses_are_collected():
    """TorchServe's streaming helper runs against our MockContext and its collecting socket."""
    from ts.handler_utils.utils import send_intermediate_predict_response

    ctx = MockContext()
    b = batch(Request.text("a", request_id="r0"))
    b.bind(ctx)
    send_intermediate_predict_response(["partial"], ctx.request_ids, "Intermediate Prediction success", 200, ctx)
    (sent,) = ctx.cl_socket.sent
    assert b"partial" in sent and b"r0" in sent
    assert ctx.get_response_headers(0) == {"ts_stream_next": "true"}


# --------------------------------------------------------------------------------------------
# (d) the headers the frontend adds, through TorchServe's decoder and its BaseHandler's routing
# --------------------------------------------------------------------------------------------


def test_frontend_headers_travel_in_the_frame_as_torchserve_reads_them():
    b = batch(
        Request.json([1], url_path="v1/chat/completion"),
        Request.text("t").with_headers(explain="True"),  # as /explanations delivers it
        Request.from_bytes(b"x").with_headers({"Explain": "True"}),  # another header: case counts
        Request.from_data({"data": [1.0]}, url_path="v1/models"),
    )
    _, processors, input_batch, _ = through_torchserve(b)
    seen = [rp.get_request_properties() for rp in processors]
    assert_same_typed(seen, b.headers, "headers")
    assert [(h["url_path"], h["explain"]) for h in seen] == [
        ("v1/chat/completion", "False"),
        ("", "True"),
        ("", "False"),
        ("v1/models", "False"),
    ]
    assert seen[2]["Explain"] == "True"
    assert_same_typed(input_batch, b.data)


@pytest.mark.parametrize("explain", [False, True])
def test_torchserve_base_handler_routes_on_the_explain_header(tmp_path, explain):
    """ts.torch_handler.base_handler.BaseHandler._is_explain, on the Context a real Service
    built from our frame: a plain request is a prediction, ``with_headers(explain="True")`` an
    explanation."""
    from ts.torch_handler.base_handler import BaseHandler as TsBaseHandler

    req = Request.json([1.0, 2.0])
    b = batch(req.with_headers(explain="True") if explain else req)
    routed = []

    def entry_point(data, context):
        if data is None:
            return None
        handler = TsBaseHandler()
        handler.context = context
        routed.append((handler._is_explain(), context.get_request_header(0, "explain"), context.get_request_header(0, "url_path")))
        return ["ok"]

    service = make_service(tmp_path, entry_point, RecordingMetrics())
    service.predict(b.to_worker_message())
    assert routed == [(explain, "True" if explain else "False", "")]
    ours = MockContext()
    b.bind(ours)
    handler = TsBaseHandler()
    handler.context = ours
    assert handler._is_explain() is explain
