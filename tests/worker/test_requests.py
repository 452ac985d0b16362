"""Requests (handlerkit.worker.requests): builders, decoding, the frontend-added headers, payload()."""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import uuid

import pytest

import handlerkit as hk
from handlerkit.errors import HandlerkitWarning
from handlerkit.worker.batches import Batch, batch, payload
from handlerkit.worker.context import MockContext
from handlerkit.worker.requests import Parameter, Request, decode_enabled

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
    assert req.header_dict() == {"body": {"content-type": ""}, "url_path": "", "explain": "False"}
    assert batch(req).data == [{"body": bytearray(b"\x00\x01")}]
    assert Request.from_bytes(bytearray(b"a")).parameters[0].value == b"a"
    with pytest.raises(TypeError, match="data must be bytes: got str"):
        Request.from_bytes("text")


def test_content_type_parameters_are_stripped_like_the_frontend():
    req = Request.from_bytes(b'{"a": 1}', "application/json; charset=utf-8")
    assert req.parameters[0].content_type == "application/json"
    assert req.headers == {"Content-Type": "application/json; charset=utf-8"}
    assert batch(req).data == [{"body": {"a": 1}}]


def test_the_media_type_is_not_trimmed_like_nettys_get_mime_type():
    # HttpUtil.getMimeType cuts at ";" and keeps the space: the worker compares with
    # == "application/json", so such a body stays raw bytes.
    req = Request.from_bytes(b'{"a": 1}', "application/json ; charset=utf-8")
    assert req.parameters[0].content_type == "application/json "
    assert batch(req).data == [{"body": bytearray(b'{"a": 1}')}]
    assert batch(req).headers[0]["body"] == {"content-type": "application/json "}
    # The header value's own ends are trimmed by the HTTP decoder.
    assert Request.from_bytes(b"1", " application/json ").parameters[0].content_type == "application/json"


def test_the_body_type_comes_from_a_content_type_header_of_any_case():
    for name in ("Content-Type", "content-type", "CONTENT-TYPE"):
        req = Request.from_bytes(b'{"a": 1}', headers={name: "application/json; charset=utf-8"})
        assert req.parameters == (Parameter("body", b'{"a": 1}', "application/json"),)
        assert batch(req).data == [{"body": {"a": 1}}]
        assert dict(req.headers) == {name: "application/json; charset=utf-8"}
    urlencoded = Request.from_bytes(b"a=1", headers={"content-type": "application/x-www-form-urlencoded"})
    assert batch(urlencoded).data == [{"a": bytearray(b"1")}]
    text = Request.text("hi", headers={"content-type": "text/html"})
    assert text.parameters[0].content_type == "text/html" and batch(text).data == [{"body": "hi"}]
    assert Request.text("hi").headers == {"Content-Type": "text/plain"}


def test_content_type_and_header_must_agree():
    with pytest.raises(ValueError, match=r"^content_type 'application/json' and the Content-Type header 'text/plain' disagree; "):
        Request.from_bytes(b'{"a": 1}', "application/json", headers={"Content-Type": "text/plain"})
    with pytest.raises(ValueError, match=r"content_type 'text/plain' and the Content-Type header 'application/json' disagree"):
        Request.text("hi", headers={"content-type": "application/json"}, content_type="text/plain")
    with pytest.raises(ValueError, match=r"content_type 'application/json' and the Content-Type header 'text/plain' disagree"):
        Request.json({"a": 1}, headers={"content-type": "text/plain"})
    with pytest.raises(ValueError, match=r"several Content-Type values \['image/png', 'text/plain'\]"):
        Request.from_bytes(b"x", headers={"Content-Type": "text/plain", "content-type": "image/png"})
    with pytest.raises(ValueError, match=r"Request\.form sends multipart/form-data or application/x-www-form-urlencoded, but the Content-Type header is 'application/json'"):
        Request.form({"data": "x"}, headers={"Content-Type": "application/json"})
    # The same media type in both is fine: the header (what the frontend reads) is kept.
    req = Request.json({"a": 1}, headers={"Content-Type": "application/json; charset=utf-8"})
    assert req.headers == {"Content-Type": "application/json; charset=utf-8"}
    assert batch(req).data == [{"body": {"a": 1}}]


def test_urlencoded_content_type_is_matched_ignoring_case():
    # InferenceRequestHandler: APPLICATION_X_WWW_FORM_URLENCODED.contentEqualsIgnoreCase(type).
    req = Request.from_bytes(b"a=1&b=2", "Application/X-WWW-Form-Urlencoded")
    assert batch(req).data == [{"a": bytearray(b"1"), "b": bytearray(b"2")}]


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


URLENCODED = {"Content-Type": "application/x-www-form-urlencoded"}


def test_an_urlencoded_form_arrives_as_the_frontend_splits_it():
    # curl -d / requests.post(url, data={...}) / mlflow-torchserve: InferenceRequestHandler hands
    # the body to Netty's HttpPostRequestDecoder; NettyUtils.getFormData makes each field an
    # untyped parameter, so the worker hands the handler a bytearray, whatever the value was.
    req = Request.form({"data": "hello wörld & more", "n": "3", "raw": b"\x00\xff+%", "plain": ("x", None)}, headers=URLENCODED)
    assert req.parameters == (
        Parameter("data", "hello wörld & more".encode(), None),
        Parameter("n", b"3", None),
        Parameter("raw", b"\x00\xff+%", None),
        Parameter("plain", b"x", None),
    )
    (entry,) = batch(req).data
    assert entry == {"data": bytearray("hello wörld & more".encode()), "n": bytearray(b"3"), "raw": bytearray(b"\x00\xff+%"), "plain": bytearray(b"x")}
    assert all(type(v) is bytearray for v in entry.values())
    (headers,) = batch(req).headers
    assert headers["data"] == {"content-type": ""} and headers["Content-Type"] == "application/x-www-form-urlencoded"
    # The same request as its body sent raw: the form is what a client puts on the wire.
    body = b"data=hello+w%C3%B6rld+%26+more&n=3&raw=%00%FF%2B%25&plain=x"
    assert Request.from_bytes(body, "application/x-www-form-urlencoded").parameters == req.parameters


def test_a_repeated_urlencoded_name_is_a_parameter_each_time_and_the_worker_keeps_the_last():
    # ts/service.py retrieve_data_for_inference: model_in.update({name: value}) per parameter.
    req = Request.form([("tag", "a"), ("tag", "b"), ("k", "1")], headers=URLENCODED)
    assert [(p.name, p.value) for p in req.parameters] == [("tag", b"a"), ("tag", b"b"), ("k", b"1")]
    assert batch(req).data == [{"tag": bytearray(b"b"), "k": bytearray(b"1")}]
    multipart = Request.form([("tag", "a"), ("tag", "b")])  # multipart repeats the same way
    assert batch(multipart).data == [{"tag": bytearray(b"b")}]


@pytest.mark.parametrize("body, fields", [
    # What TorchServe 0.12's frontend (Netty 4.1.53, run on these bodies) makes of each.
    (b"a=1&b=hello+world", [("a", b"1"), ("b", b"hello world")]),
    (b"a&b=1", [("a", b""), ("b", b"1")]),  # a name without "=" then "&": an empty value
    (b"a=1&b", [("a", b"1")]),  # ... but at the end of the body: dropped
    (b"a=1&", [("a", b"1")]),
    (b"", []),
    (b"a==b", [("a", b"=b")]),
    (b"a=1;b=2", [("a", b"1;b=2")]),  # only "&" separates
    (b"a=%FF%00", [("a", b"\xff\x00")]),  # values are bytes, percent-decoded byte-wise
    (b"a=\xff\xfe", [("a", b"\xff\xfe")]),
    (b"k%C3%A9y=v%C3%A9", [("kéy", b"v\xc3\xa9")]),  # names are text
    (b"k%FF=1", [("k\ufffd", b"1")]),
    (b"+a+=1", [("a", b"1")]),  # a name's ends are stripped, its LFs dropped
    (b"a%0Ab=1", [("ab", b"1")]),
    (b"a=1\r\nb=2", [("a", b"1")]),  # a line end ends the body
    (b"a=1\nb=2", [("a", b"1")]),
])
def test_an_urlencoded_body_is_split_by_nettys_rules(body, fields):
    req = Request.from_bytes(body, "application/x-www-form-urlencoded")
    assert [(p.name, p.value, p.content_type) for p in req.parameters] == [(n, v, None) for n, v in fields]


@pytest.mark.parametrize("body, why", [
    (b"=x", "the field at byte 0 has no name"),
    (b"&name=J", "the field at byte 0 has no name"),
    (b"a=1&&b=2", "the field at byte 4 has no name"),
    (b"+=1", "the field at byte 0 has no name"),
    (b"a=%G1", "the value of 'a' b'%G1' has a '%' not followed by two hex digits"),
    (b"a=1%", "the value of 'a' b'1%' has a '%' not followed by two hex digits"),
    (b"a%=1", "the name b'a%' has a '%' not followed by two hex digits"),
    (b"a=1\rb", "field 'a' has a CR not followed by LF"),
])
def test_an_urlencoded_body_the_frontend_cannot_split_is_refused(body, why):
    # Netty throws ErrorDataDecoderException; HttpRequestHandler answers 500: no handler sees it.
    expected = f"^TorchServe's frontend cannot split this application/x-www-form-urlencoded body: {re.escape(why)}.*it answers 500"
    with pytest.raises(ValueError, match=expected):
        Request.from_bytes(body, "application/x-www-form-urlencoded")


def test_an_urlencoded_form_has_no_files_and_no_content_types(png_file):
    with pytest.raises(TypeError, match=r"form field 'data': an application/x-www-form-urlencoded field is text or bytes, with no content type .*got a file; send files and typed fields as multipart/form-data"):
        Request.form({"data": png_file}, headers=URLENCODED)
    with pytest.raises(TypeError, match=r"form field 'meta': .*got a typed value"):
        Request.form({"meta": ("{}", "application/json")}, headers=URLENCODED)
    with pytest.raises(TypeError, match=r"form field 'n': .*got int"):
        Request.form({"n": 3}, headers=URLENCODED)
    with pytest.raises(TypeError, match=r"needs \(name, value\) pairs: got 'tag'"):
        Request.form(["tag"], headers=URLENCODED)


def test_a_new_users_audio_handler_reads_a_wav_sent_as_an_urlencoded_form(tmp_path):
    from _new_users import audio_dir, wav_bytes

    h = hk.Harness.open(audio_dir(tmp_path / "sounds"))
    wav = wav_bytes(440.0)
    as_body = h.run(batch(Request.from_bytes(wav, "audio/wav"))).output
    as_form = h.run(batch(Request.form({"data": wav}, headers=URLENCODED))).output
    assert as_form == as_body and h.results["preprocess"].input == [{"data": bytearray(wav)}]


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
        {
            "body": {"content-type": "image/png"},
            "url_path": "",
            "explain": "True",
            "Content-Type": "image/png",
            "X-Trace": "t1",
        }
    ]


def test_request_header_overrides_parameter_entry():
    # The worker adds parameter entries first, then request headers over them.
    req = Request((Parameter("body", b"x", "text/plain"),), {"body": "header wins"})
    assert batch(req).headers == [{"body": "header wins", "url_path": "", "explain": "False"}]


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
        "url_path": "",
        "explain": "True",
    }
    copy_ = req.with_headers(describe="True")
    assert copy_.data() == req.data() and copy_.request_id != "d0"
    # A batch of it, re-batched request by request (as a harness does), still delivers it.
    assert batch(*batch(req, Request.text("t")).requests).data[0] == {"data": b"as-is", "n": [1]}
    with pytest.raises(TypeError, match=r"needs a dict: got list; .*Request\.from_item\(x\)"):
        Request.from_data([1])
    with pytest.raises(TypeError, match="parameter name"):
        Request.from_data({1: "x"})


# --------------------------------------------------------------------------------------------
# Headers TorchServe's frontend adds (InferenceRequestHandler.handlePredictions, 0.12)
# --------------------------------------------------------------------------------------------

FRONTEND = {"url_path": "", "explain": "False"}


def test_every_request_carries_the_prediction_apis_headers(png_file):
    req = Request.json({"a": 1})
    assert req.url_path == "" and req.frontend_headers == FRONTEND
    assert req.headers == {"Content-Type": "application/json"}  # what the client sent: unchanged
    assert req.worker_headers() == {**FRONTEND, "Content-Type": "application/json"}
    assert req.header_dict() == {"body": {"content-type": "application/json"}, **FRONTEND, "Content-Type": "application/json"}
    ctx = MockContext()
    batch(req).bind(ctx)
    assert ctx.get_request_header(0, "explain") == "False"
    assert ctx.get_request_header(0, "url_path") == ""


@pytest.mark.parametrize(
    "build",
    [
        lambda f, p: Request.from_bytes(b"x", "image/png", url_path=p),
        lambda f, p: Request.from_bytes(b"x", name="data", url_path=p),
        lambda f, p: Request.from_bytes(b"a=1", "application/x-www-form-urlencoded", url_path=p),
        lambda f, p: Request.from_file(f, url_path=p),
        lambda f, p: Request.from_file(f, name="data", url_path=p),
        lambda f, p: Request.json([1], url_path=p),
        lambda f, p: Request.text("t", url_path=p),
        lambda f, p: Request.form({"data": "x"}, url_path=p),
        lambda f, p: Request.from_data({"data": [1]}, url_path=p),
    ],
    ids=["bytes", "bytes-field", "urlencoded", "file", "file-field", "json", "text", "form", "from_data"],
)
def test_every_constructor_takes_url_path(png_file, build):
    req = build(png_file, "v1/chat/completion")
    assert req.url_path == "v1/chat/completion"
    assert req.header_dict()["url_path"] == "v1/chat/completion"
    assert req.header_dict()["explain"] == "False"
    assert "url_path='v1/chat/completion'" in repr(req)
    assert build(png_file, "").header_dict()["url_path"] == ""


@pytest.mark.parametrize(
    ("given", "expected"),
    [("v1/chat/", "v1/chat"), ("v1/chat//", "v1/chat"), ("/", ""), ("v1//chat", "v1//chat"), ("v1", "v1")],
)
def test_url_path_drops_trailing_slashes_as_the_frontend_does(given, expected):
    # The frontend splits the URL path with Java's String.split("/"), which drops trailing
    # empty segments but keeps inner ones.
    assert Request.json(1, url_path=given).url_path == expected
    assert Request.json(1).with_url_path(given).header_dict()["url_path"] == expected


def test_with_url_path_copies():
    req = Request.json([1, 5], headers={"X-Trace": "t"}, request_id="r")
    routed = req.with_url_path("v1/sum")
    assert routed.url_path == "v1/sum" and req.url_path == ""
    assert routed.request_id != "r" and routed.headers == req.headers and routed.parameters == req.parameters
    assert routed.with_url_path("").header_dict()["url_path"] == ""
    with pytest.raises(TypeError, match="url_path is a str"):
        req.with_url_path(None)
    with pytest.raises(TypeError, match="url_path is a str"):
        Request.text("x", url_path=["v1"])


def test_headers_you_set_win_over_the_frontends():
    req = Request.json({"a": 1})
    explained = req.with_headers(explain="True")  # the request as /explanations delivers it
    assert explained.header_dict()["explain"] == "True"
    assert explained.worker_headers() == {"url_path": "", "explain": "True", "Content-Type": "application/json"}
    ctx = MockContext()
    batch(explained, req).bind(ctx)
    assert [ctx.get_request_header(i, "explain") for i in range(2)] == ["True", "False"]
    # A url_path header you set is what the worker sees, over the url_path argument.
    assert req.with_url_path("a").with_headers(url_path="b").header_dict()["url_path"] == "b"
    # Header names are case-sensitive: "Explain" is another header, next to the frontend's.
    other_case = req.with_headers({"Explain": "True"}).header_dict()
    assert other_case["Explain"] == "True" and other_case["explain"] == "False"


# --------------------------------------------------------------------------------------------
# Raw items (Request.from_item): TorchServe's unit-test path
# --------------------------------------------------------------------------------------------


def test_from_item_is_delivered_as_it_is_with_no_headers():
    row = [1.0, 2.0]
    req = Request.from_item(row, request_id="i0")
    row.append(3.0)  # the request keeps its own copy
    assert req.data() == [1.0, 2.0] and req.item and req.request_id == "i0"
    first = req.data()
    first.append(9.0)
    assert req.data() == [1.0, 2.0]  # and every delivery is a fresh copy
    assert req.parameters == () and req.size == 0
    assert req.header_dict() == {} and req.frontend_headers == {} and req.worker_headers() == {}
    assert "request 0" not in repr(req) and "Request(item list, id=i0" in repr(req)
    assert "unit-test path" in req.wire_problem()
    assert req.with_headers(X="y").header_dict() == {"X": "y"}
    assert Request.from_item(None).data() is None
    assert Request.from_item("text").data() == "text"
    assert Request.from_item({1: "a"}).data() == {1: "a"}  # any dict, no parameter entries
    with pytest.raises(ValueError, match="raw item never came through the frontend"):
        req.with_url_path("v1")
    with pytest.raises(TypeError, match="got a Request: use it as it is"):
        Request.from_item(req)


def test_from_item_copies_tensors_and_keeps_what_cannot_be_copied():
    import torch

    t = torch.tensor([[1.0, 2.0]])
    req = Request.from_item(t)
    got = req.data()
    assert torch.equal(got, t) and got is not t
    got.add_(1)
    assert torch.equal(req.data(), t)
    lock = threading.Lock()  # deepcopy refuses it: delivered as the same object
    assert Request.from_item(lock).data() is lock


# --------------------------------------------------------------------------------------------
# payload(): the one way handlers read a request's payload
# --------------------------------------------------------------------------------------------

PAYLOAD_CASES = [
    ({"data": b"x"}, b"x"),
    ({"body": bytearray(b"x")}, bytearray(b"x")),
    ({"data": b"x", "body": b"y"}, b"x"),  # data first
    ({"data": b"", "body": b"y"}, b"y"),  # an empty data falls through, as with `or`
    ({"data": None, "body": "t"}, "t"),
    ({"data": {}, "body": [1]}, [1]),
    ({"data": 0, "body": 5}, 5),
    ({"data": 3}, 3),
    ({"body": bytearray()}, bytearray()),  # an empty body is empty, not None
    ({"body": ""}, ""),
    ({"body": 0}, 0),
    ({"data": bytearray()}, bytearray()),  # TorchServe's expression gives None here
    ({"data": 0}, 0),
    ({"data": "", "body": None}, ""),
    ({"caption": b"x"}, None),  # neither key
    ({"body": None}, None),  # a JSON null body
    ({}, None),
]


@pytest.mark.parametrize("row, expected", PAYLOAD_CASES)
def test_payload_rule(row, expected):
    got = payload(row)
    assert got == expected and type(got) is type(expected)
    ts_expression = row.get("data") or row.get("body")
    if ts_expression is not None:  # wherever TorchServe's handlers get a value, it is the same
        assert got is ts_expression


def test_payload_of_raw_items_and_tensors():
    import torch

    raw = [1.0, 2.0]
    assert payload(raw) is raw  # a raw item is its own payload
    t = torch.ones(2, 2)  # bool(t) would raise: a tensor always counts as a value
    assert payload({"data": t, "body": b"y"}) is t
    assert payload(t) is t


def test_payload_of_empty_bodies_as_the_worker_decodes_them():
    empty = batch(
        Request.from_bytes(b"", "application/octet-stream"),
        Request.from_bytes(b"", "text/plain"),
        Request.from_bytes(b""),
        Request.form({"data": b""}),
        Request.form({"caption": "x"}),
    ).data
    assert [payload(row) for row in empty] == [bytearray(), "", bytearray(), bytearray(), None]
    with pytest.warns(Warning, match="not valid JSON"):  # an empty JSON body is no JSON
        (row,) = batch(Request.from_bytes(b"", "application/json")).data
    assert payload(row) == bytearray()
