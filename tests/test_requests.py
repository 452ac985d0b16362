"""Request builders and batches (handlerkit.requests)."""

from __future__ import annotations

import dataclasses
import json
import struct
import uuid

import pytest

import handlerkit as hk
from handlerkit.context import MockContext
from handlerkit.errors import HandlerkitWarning
from handlerkit.requests import Batch, Parameter, Request, batch, decode_enabled

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))


@pytest.fixture(autouse=True)
def _default_decoding(monkeypatch):
    monkeypatch.delenv("TS_DECODE_INPUT_REQUEST", raising=False)


@pytest.fixture
def png_file(tmp_path):
    path = tmp_path / "circle.png"
    path.write_bytes(PNG)
    return path


def test_public_names_are_exported():
    assert hk.Request is Request and hk.Batch is Batch and hk.batch is batch


# --------------------------------------------------------------------------------------------
# Constructors → what handle() gets
# --------------------------------------------------------------------------------------------


def test_from_file_image_is_bytearray(png_file):
    req = Request.from_file(png_file)
    assert req.parameters == (Parameter("body", PNG, "image/png"),)
    assert req.headers == {"Content-Type": "image/png"}
    (entry,) = batch(req).data
    assert list(entry) == ["body"]
    assert type(entry["body"]) is bytearray
    assert entry["body"] == PNG


def test_from_file_guesses_json_and_text(tmp_path):
    (tmp_path / "x.json").write_text('{"a": [1, 2]}')
    (tmp_path / "x.txt").write_text("héllo")
    (tmp_path / "x.unknownext").write_bytes(b"??")
    data = batch(
        Request.from_file(tmp_path / "x.json"),
        Request.from_file(tmp_path / "x.txt"),
        Request.from_file(tmp_path / "x.unknownext"),
    ).data
    assert data[0] == {"body": {"a": [1, 2]}}
    assert data[1] == {"body": "héllo"} and type(data[1]["body"]) is str
    assert data[2] == {"body": bytearray(b"??")} and type(data[2]["body"]) is bytearray


def test_from_file_overrides_and_missing(tmp_path, png_file):
    req = Request.from_file(png_file, "application/octet-stream", request_id="r1", headers={"explain": "True"})
    assert req.parameters[0].content_type == "application/octet-stream"
    assert req.request_id == "r1"
    assert req.headers == {"Content-Type": "application/octet-stream", "explain": "True"}
    with pytest.raises(FileNotFoundError, match="nope.png"):
        Request.from_file(tmp_path / "nope.png")


def test_from_file_as_form_field(png_file):
    req = Request.from_file(png_file, name="data")
    assert req.parameters == (Parameter("data", PNG, "image/png"),)
    assert req.headers["Content-Type"].startswith("multipart/form-data")
    assert batch(req).data == [{"data": bytearray(PNG)}]
    typed = Request.from_file(png_file, "image/x-custom", name="data")
    assert typed.parameters[0].content_type == "image/x-custom"


def test_from_bytes():
    req = Request.from_bytes(b"\x00\x01")
    assert req.parameters == (Parameter("body", b"\x00\x01", None),)
    assert req.headers == {}  # no Content-Type: none was sent
    assert batch(req).headers == [{"body": {"content-type": ""}}]
    assert batch(req).data == [{"body": bytearray(b"\x00\x01")}]
    assert Request.from_bytes(bytearray(b"a")).parameters[0].value == b"a"
    with pytest.raises(TypeError, match="data must be bytes: got str"):
        Request.from_bytes("text")


def test_content_type_parameters_are_stripped_like_the_frontend():
    req = Request.from_bytes(b'{"a": 1}', "application/json; charset=utf-8")
    assert req.parameters[0].content_type == "application/json"
    assert req.headers == {"Content-Type": "application/json; charset=utf-8"}
    assert batch(req).data == [{"body": {"a": 1}}]


def test_json_request_is_parsed():
    req = Request.json({"instances": [[1.0, 2.0]]})
    assert req.parameters[0].content_type == "application/json"
    data = batch(req).data
    assert data == [{"body": {"instances": [[1.0, 2.0]]}}]
    assert type(data[0]["body"]) is dict
    assert batch(Request.json([1, 2])).data == [{"body": [1, 2]}]
    assert batch(Request.json(3)).data == [{"body": 3}]
    assert batch(Request.json("s")).data == [{"body": "s"}]


def test_text_request_is_str():
    data = batch(Request.text("a cat"), Request.text("<p>", content_type="text/html")).data
    assert data == [{"body": "a cat"}, {"body": "<p>"}]
    assert all(type(d["body"]) is str for d in data)
    with pytest.raises(TypeError, match="needs a str"):
        Request.text(b"bytes")


def test_form_fields_arrive_under_their_names(png_file):
    req = Request.form(
        {
            "data": png_file,
            "raw": b"\x00\xff",
            "caption": "a circle",
            "meta": (json.dumps({"k": 1}), "application/json"),
            "note": ("plain", "text/plain"),
            "plain": ("x", None),
        }
    )
    (entry,) = batch(req).data
    assert list(entry) == ["data", "raw", "caption", "meta", "note", "plain"]
    assert entry["data"] == bytearray(PNG) and type(entry["data"]) is bytearray
    assert entry["raw"] == bytearray(b"\x00\xff")
    # A plain form field has no content type: the worker leaves it as bytearray, not str.
    assert entry["caption"] == bytearray(b"a circle") and type(entry["caption"]) is bytearray
    assert entry["meta"] == {"k": 1}
    assert entry["note"] == "plain"
    assert entry["plain"] == bytearray(b"x")
    (headers,) = batch(req).headers
    assert headers["data"] == {"content-type": "image/png"}
    assert headers["raw"] == {"content-type": "application/octet-stream"}
    assert headers["caption"] == {"content-type": ""}
    assert headers["meta"] == {"content-type": "application/json"}
    assert headers["Content-Type"].startswith("multipart/form-data")


def test_form_errors():
    with pytest.raises(ValueError, match="non-empty mapping"):
        Request.form({})
    with pytest.raises(TypeError, match="must be str, bytes, a path"):
        Request.form({"data": 3})
    with pytest.raises(TypeError, match=r"\(value, content_type\)"):
        Request.form({"data": ("a", "b", "c")})


def test_named_json_and_text_are_form_fields():
    req = Request.json({"a": 1}, name="data")
    assert req.parameters == (Parameter("data", b'{"a": 1}', "application/json"),)
    assert batch(req).data == [{"data": {"a": 1}}]


def test_urlencoded_body_is_split_into_fields():
    req = Request.from_bytes(b"data=hello+world&n=3&empty=", "application/x-www-form-urlencoded")
    assert [p.name for p in req.parameters] == ["data", "n", "empty"]
    assert batch(req).data == [{"data": bytearray(b"hello world"), "n": bytearray(b"3"), "empty": bytearray()}]
    assert req.headers == {"Content-Type": "application/x-www-form-urlencoded"}


def test_invalid_json_is_forwarded_raw_with_warning():
    req = Request.from_bytes(b"{not json", "application/json")
    expected = "request 0 parameter 'body' is declared application/json but is not valid JSON.*raw bytearray"
    with pytest.warns(HandlerkitWarning, match=expected) as caught:
        data = batch(req).data
    assert caught[0].filename == __file__
    assert data == [{"body": bytearray(b"{not json")}]


def test_non_utf8_text_is_forwarded_raw_with_warning():
    req = Request.from_bytes(b"\xff\xfe", "text/plain")
    with pytest.warns(HandlerkitWarning, match="not UTF-8"):
        assert batch(req).data == [{"body": bytearray(b"\xff\xfe")}]


def test_text_prefix_rule_is_the_workers():
    # The worker checks content_type.startswith("text"), nothing more.
    assert batch(Request.from_bytes(b"abc", "textual/odd")).data == [{"body": "abc"}]
    assert batch(Request.from_bytes(b'"a"', "application/problem+json")).data == [{"body": bytearray(b'"a"')}]


# --------------------------------------------------------------------------------------------
# Decoding switch
# --------------------------------------------------------------------------------------------


def test_decode_false_keeps_raw_bytearray():
    b = batch(Request.json({"a": 1}), Request.text("t"), decode=False)
    assert b.data == [{"body": bytearray(b'{"a": 1}')}, {"body": bytearray(b"t")}]
    assert all(type(d["body"]) is bytearray for d in b.data)


def test_decode_none_reads_env_like_the_worker(monkeypatch):
    assert decode_enabled()
    monkeypatch.setenv("TS_DECODE_INPUT_REQUEST", "false")
    assert batch(Request.json({"a": 1})).data == [{"body": bytearray(b'{"a": 1}')}]
    monkeypatch.setenv("TS_DECODE_INPUT_REQUEST", "True")  # only exactly "true" decodes
    assert not decode_enabled()
    monkeypatch.setenv("TS_DECODE_INPUT_REQUEST", "true")
    assert batch(Request.json({"a": 1})).data == [{"body": {"a": 1}}]
    assert batch(Request.json({"a": 1}), decode=False).decode is False


# --------------------------------------------------------------------------------------------
# Headers and ids
# --------------------------------------------------------------------------------------------


def test_headers_as_the_worker_builds_them():
    req = Request.from_bytes(PNG, "image/png", headers={"explain": "True", "X-Trace": "t1"})
    assert batch(req).headers == [
        {"body": {"content-type": "image/png"}, "Content-Type": "image/png", "explain": "True", "X-Trace": "t1"}
    ]


def test_request_header_overrides_parameter_entry():
    # The worker adds parameter entries first, then request headers over them.
    req = Request((Parameter("body", b"x", "text/plain"),), {"body": "header wins"})
    assert batch(req).headers == [{"body": "header wins"}]


def test_given_content_type_header_is_kept_any_case():
    req = Request.json({}, headers={"content-type": "application/json"})
    assert dict(req.headers) == {"content-type": "application/json"}


def test_with_headers_copies():
    req = Request.json({"a": 1})
    explained = req.with_headers(explain="True")
    assert explained.headers == {"Content-Type": "application/json", "explain": "True"}
    assert req.headers == {"Content-Type": "application/json"}
    assert explained.parameters == req.parameters
    assert explained.request_id != req.request_id
    dashed = req.with_headers({"X-Request-Id": "7"}, describe="True")
    assert dashed.headers["X-Request-Id"] == "7" and dashed.headers["describe"] == "True"
    with pytest.raises(TypeError, match="pass 'True'"):
        req.with_headers(explain=True)


def test_request_is_immutable_and_validated():
    req = Request.text("x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.request_id = "y"
    with pytest.raises(TypeError):
        req.headers["a"] = "b"
    uuid.UUID(req.request_id)
    assert Request.text("x").request_id != req.request_id
    assert hash(req) == hash(req)
    coerced = Request([("body", bytearray(b"a"), None)])
    assert coerced.parameters == (Parameter("body", b"a", None),)
    with pytest.raises(TypeError, match="parameter name"):
        Request([("", b"a", None)])
    with pytest.raises(TypeError, match="must be bytes"):
        Request([("body", "a", None)])
    with pytest.raises(TypeError, match="request_id"):
        Request([("body", b"a", None)], {}, "")
    with pytest.raises(TypeError, match="strings on the wire"):
        Request([("body", b"a", None)], {"n": 1})


def test_request_helpers_and_repr(png_file):
    req = Request.from_file(png_file, headers={"explain": "True"}, request_id="abcdefgh-1234")
    assert req.size == len(PNG)
    assert req.data() == {"body": bytearray(PNG)}
    assert req.data(decode=False) == {"body": bytearray(PNG)}
    assert req.header_dict()["explain"] == "True"
    text = repr(req)
    assert "body: image/png 264 B" in text and "'explain': 'True'" in text and "abcdefgh" in text


def test_batch_request_ids_and_sequence():
    a, b = Request.text("a", request_id="id-a"), Request.text("b", request_id="id-b")
    bt = batch(a, b)
    assert bt.request_ids == {0: "id-a", 1: "id-b"}
    assert len(bt) == 2
    assert bt[0] is a and bt[-1] is b
    assert list(bt) == [a, b]
    assert bt.requests == (a, b)
    sub = bt[1:]
    assert isinstance(sub, Batch) and sub.request_ids == {0: "id-b"}
    with pytest.raises(ValueError, match="empty"):
        bt[5:]
    assert "2 requests" in repr(bt) and "text/plain 1 B" in repr(bt)


def test_batch_argument_errors():
    with pytest.raises(ValueError, match="at least one request"):
        batch()
    with pytest.raises(TypeError, match=r"batch\(\*requests\)"):
        batch([Request.text("a")])
    with pytest.raises(TypeError, match="item 0 is a int"):
        batch(3)


# --------------------------------------------------------------------------------------------
# bind() and mutation safety
# --------------------------------------------------------------------------------------------


def test_bind_onto_mock_context():
    ctx = MockContext()
    req0 = Request.from_bytes(PNG, "image/png", headers={"explain": "True"}, request_id="r0")
    req1 = Request.json({"a": 1}, request_id="r1")
    bt = batch(req0, req1)
    assert bt.bind(ctx) is ctx
    assert ctx.request_ids == {0: "r0", 1: "r1"}
    assert ctx.get_request_id(1) == "r1"
    assert ctx.get_request_header(0, "explain") == "True"
    assert ctx.get_request_header(1, "explain") is None
    assert ctx.get_request_header(0, "body") == {"content-type": "image/png"}
    assert ctx.get_request_header(1, "Content-Type") == "application/json"
    assert ctx.get_request_header(1, "content-type") is None  # names are case-sensitive
    assert ctx.metrics.request_ids == {0: "r0", 1: "r1"}
    ctx.metrics.add_time("T", 1.0, idx=1)
    assert ctx.metrics.last("T").request_id == "r1"


def test_bind_resets_statuses_from_a_previous_call():
    ctx = MockContext()
    bt = batch(Request.text("a"))
    bt.bind(ctx)
    ctx.set_response_status(500, "boom")
    ctx.get_all_request_header(0)["injected"] = "x"
    bt.bind(ctx)
    assert ctx.get_response_status(0) == (200, None)
    assert ctx.get_request_header(0, "injected") is None
    assert "injected" not in bt.headers[0]


def test_data_is_fresh_on_every_access():
    bt = batch(Request.from_bytes(PNG, "image/png"), Request.json({"k": [1]}))
    first = bt.data
    first[0]["body"][0:4] = b"XXXX"
    first[1]["body"]["k"].append(2)
    first.append({"extra": 1})
    second = bt.data
    assert second[0]["body"] == bytearray(PNG)
    assert second[1]["body"] == {"k": [1]}
    assert len(second) == 2
    assert second[0]["body"] is not first[0]["body"]
    assert bt.requests[0].parameters[0].value == PNG
    headers = bt.headers
    headers[0]["body"]["content-type"] = "changed"
    assert bt.headers[0]["body"] == {"content-type": "image/png"}


# --------------------------------------------------------------------------------------------
# coerce and raw data dicts
# --------------------------------------------------------------------------------------------


def test_coerce_variants():
    req = Request.text("a")
    bt = batch(req)
    assert Batch.coerce(bt) is bt
    assert Batch.coerce(req).requests == (req,)
    assert Batch.coerce([req, req]).requests == (req, req)
    assert len(Batch.coerce({"data": 1})) == 1
    with pytest.raises(TypeError, match="expected a Batch"):
        Batch.coerce("text")


def test_coerce_raw_data_dicts_are_delivered_as_they_are():
    class Thing:  # no HTTP form at all
        def __init__(self):
            self.n = 1

    raw = [{"data": bytearray(b"img")}, {"data": {"a": [1]}, "name": "x"}, {"tensor": Thing()}]
    bt = Batch.coerce(raw)
    data = bt.data
    assert data[:2] == raw[:2]
    assert type(data[0]["data"]) is bytearray
    assert isinstance(data[2]["tensor"], Thing) and data[2]["tensor"] is not raw[2]["tensor"]
    data[1]["data"]["a"].append(2)
    assert raw[1]["data"] == {"a": [1]} and bt.data[1]["data"] == {"a": [1]}
    assert len(bt.request_ids) == 3 and len(set(bt.request_ids.values())) == 3
    assert bt.headers == [
        {"data": {"content-type": "application/octet-stream"}},
        {"data": {"content-type": "application/json"}, "name": {"content-type": "text/plain"}},
        {"tensor": {"content-type": ""}},
    ]
    # Values with an HTTP form become the request that would deliver them ...
    assert bt[1].parameters == (
        Parameter("data", b'{"a": [1]}', "application/json"),
        Parameter("name", b"x", "text/plain"),
    )
    assert bt[1].request_id == bt.request_ids[1]
    # ... the others cannot go on the wire.
    with pytest.raises(TypeError, match="'tensor' holds a Thing, which has no HTTP form"):
        bt.encode()
    assert "as-is tensor: Thing" in repr(bt)
    assert bt[2].wire_problem() and bt[1].wire_problem() is None
    ctx = MockContext()
    bt.bind(ctx)
    assert ctx.get_request_header(1, "name") == {"content-type": "text/plain"}


def test_mixed_requests_and_dicts():
    bt = batch(Request.text("a"), {"data": "b"})
    assert bt.data == [{"body": "a"}, {"data": "b"}]


def test_from_data_requests_copy_and_travel():
    payload = {"data": bytes(b"as-is"), "n": [1]}
    req = Request.from_data(payload, headers={"explain": "True"}, request_id="d0")
    payload["n"].append(2)  # the request keeps its own copy
    assert req.data() == {"data": b"as-is", "n": [1]}
    assert type(req.data()["data"]) is bytes  # delivered as it is, not as the wire would
    assert req.request_id == "d0"
    assert req.header_dict() == {
        "data": {"content-type": "application/octet-stream"},
        "n": {"content-type": "application/json"},
        "explain": "True",
    }
    copy_ = req.with_headers(describe="True")
    assert copy_.data() == req.data() and copy_.request_id != "d0"
    # A batch of it, re-batched request by request (as a harness does), still delivers it.
    assert batch(*batch(req, Request.text("t")).requests).data[0] == {"data": b"as-is", "n": [1]}
    with pytest.raises(TypeError, match="needs a dict"):
        Request.from_data([1])
    with pytest.raises(TypeError, match="parameter name"):
        Request.from_data({1: "x"})


def test_split_keeps_ids_and_decoding():
    bt = batch(Request.json({"a": 1}, request_id="a"), {"t": object()}, decode=False)
    parts = bt.split()
    assert [len(p) for p in parts] == [1, 1]
    assert [p.request_ids for p in parts] == [{0: "a"}, {0: bt.request_ids[1]}]
    assert all(p.decode is False for p in parts)
    assert parts[0].data == [{"body": bytearray(b'{"a": 1}')}]


# --------------------------------------------------------------------------------------------
# Worker message and wire encoding (checked against TorchServe itself in test_ts_wire.py)
# --------------------------------------------------------------------------------------------


def test_to_worker_message_shape():
    req = Request.from_bytes(b"\x01", "image/png", headers={"explain": "True"}, request_id="r0")
    (msg,) = batch(req).to_worker_message()
    assert msg["requestId"] == bytearray(b"r0") and type(msg["requestId"]) is bytearray
    assert msg["headers"] == [
        {"name": bytearray(b"Content-Type"), "value": bytearray(b"image/png")},
        {"name": bytearray(b"explain"), "value": bytearray(b"True")},
    ]
    assert msg["parameters"] == [{"name": "body", "contentType": "image/png", "value": bytearray(b"\x01")}]
    (plain,) = batch(Request.from_bytes(b"x")).to_worker_message()
    assert plain["parameters"][0]["contentType"] == ""


def test_encode_frame_layout():
    req = Request((Parameter("body", b"ab", "t"),), {"h": "v"}, "id")

    def field(b: bytes) -> bytes:
        return struct.pack("!i", len(b)) + b

    end = struct.pack("!i", -1)
    headers = field(b"h") + field(b"v") + end
    params = field(b"body") + field(b"t") + field(b"ab") + end
    expected = b"I" + field(b"id") + headers + params + end
    assert batch(req).encode() == expected
    no_type = Request((Parameter("body", b"", None),), {}, "id")
    assert batch(no_type).encode() == b"I" + field(b"id") + end + field(b"body") + field(b"") + field(b"") + end + end
