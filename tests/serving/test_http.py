"""handlerkit.serving._http: HTTP translated as TorchServe's frontend and worker do, engine-free
(no Ray here)."""

from __future__ import annotations

import json
from pathlib import Path

import handlerkit as hk
from handlerkit.serving._http import customized_metadata, parse_route, replies, to_request, worker_error

ROOT = Path(__file__).resolve().parents[2]
IMAGES = sorted(p for p in (ROOT / "fixtures" / "images").iterdir() if p.suffix in (".png", ".jpg"))


def test_http_translation_matches_the_frontend() -> None:
    assert parse_route("/predictions/m/1.0/v1/chat/") == ("predict", "m", "1.0", "v1/chat")
    assert parse_route("/explanations/m") == ("explain", "m", None, "")
    assert parse_route("/models/m") == ("describe", "m", None, "")
    assert parse_route("/models/m/2.0") == ("describe", "m", "2.0", "")
    assert parse_route("/models/m/2.0/x").kind == "unknown"
    # The frontend keeps a describe answer's JSON object, {} for anything else, nothing for None.
    assert customized_metadata(b'{"a": 1}') == {"a": 1}
    assert customized_metadata(b"[1, 2]") == {} and customized_metadata(b"not json") == {}
    assert customized_metadata(b"null") is None and customized_metadata(b"") is None
    req = to_request([("content-type", "application/json"), ("explain", "True")], b'{"a": 1}', url_path="x")
    batch = hk.batch(req)
    assert batch.data == [{"body": {"a": 1}}]
    assert batch.headers[0]["explain"] == "False" and batch.headers[0]["url_path"] == "x"  # the frontend's win
    png = IMAGES[0].read_bytes()
    body = (b"--XyZ\r\nContent-Disposition: form-data; name=\"data\"; filename=\"a.png\"\r\nContent-Type: image/png\r\n\r\n"
            + png + b"\r\n--XyZ\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nhello\r\n--XyZ--\r\n")
    req = to_request([("content-type", "multipart/form-data; boundary=XyZ")], body, query=[("k", "v")], explain=True)
    data = hk.batch(req).data[0]
    assert data == {"k": bytearray(b"v"), "data": bytearray(png), "note": bytearray(b"hello")}
    assert hk.batch(req).headers[0]["explain"] == "True"
    assert to_request([], b"x", request_id="from-the-proxy").request_id == "from-the-proxy"


def test_a_failed_batch_is_answered_with_the_frontends_error_document() -> None:
    # RestJob.sendError: InternalServerException whatever the code; a 413 becomes a 507.
    reply = worker_error(503, "Prediction failed")
    assert reply.status == 503 and json.loads(reply.body) == {
        "code": 503, "type": "InternalServerException", "message": "Prediction failed"}
    assert json.loads(worker_error(400, "bad image").body)["type"] == "InternalServerException"
    assert worker_error(413, "too large").status == 507
    ctx = hk.MockContext()
    (bad,) = replies({"not": "a list"}, ctx, 1)
    assert (bad.status, json.loads(bad.body)["type"]) == (503, "InternalServerException")


def test_worker_failure_is_the_code_and_message_the_worker_answers_a_failed_batch_with():
    from handlerkit.errors import PredictionException, RequestError
    from handlerkit.serving._http import worker_failure

    assert worker_failure(PredictionException("model busy", 429)) == (429, "model busy")
    assert worker_failure(RequestError("request 0: not an image", 0)) == (400, "request 0: not an image")
    assert worker_failure(MemoryError()) == (507, "Out of resources")
    assert worker_failure(RuntimeError("CUDA out of memory")) == (507, "Out of resources")
    assert worker_failure(ValueError("bad")) == (503, "Prediction failed")
