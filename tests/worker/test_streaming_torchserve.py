"""Streaming handlers under the Harness give the chunks and final answers TorchServe 0.12's worker
gives, frame by frame.

TorchServe's worker (``ts.model_loader`` loading the model dir, ``ts.service.Service.predict``
answering a batch off a socket stand-in) and the Harness run the same handler file on the same
batch. Each intermediate frame the worker writes to its socket is decoded as the frontend reads
it and compared, request part by request part (id, content type, status, phrase, headers,
payload), with the Harness's chunks; the worker's final frame with the Harness's output and the
statuses and headers the handler left.

``ECHO_HANDLER`` behaves as the handler of pytorch/serve's
``test/pytest/test_send_intermediate_prediction_response.py`` (three "hello" chunks, then the
final "hello world "), written our way and for any batch size.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import handlerkit as hk
from conftest import ts_imports, ts_metrics_cache
from handlerkit.worker.streaming import ChunkSocket, decode_frame

pytestmark = pytest.mark.torchserve

ECHO_HANDLER = '''\
from ts.handler_utils.utils import send_intermediate_predict_response


def handle(data, context):
    if data is None:  # the worker initialises a function handler with handle(None, context)
        return None
    for _ in range(3):
        send_intermediate_predict_response(
            ["hello"] * len(data), context.request_ids, "Intermediate Prediction success", 200, context
        )
    return ["hello world "] * len(data)
'''

#: A generator's pattern: each request streams its own number of JSON tokens on its own
#: (``{idx: id}``), with a content type, a header and a status of its own; the last token is
#: the final answer.
TOKEN_HANDLER = '''\
from ts.handler_utils.utils import send_intermediate_predict_response


def handle(data, context):
    if data is None:
        return None
    answers = []
    for idx, row in enumerate(data):
        words = str(row.get("body") or row.get("data")).split()
        context.set_response_content_type(idx, "application/json")
        context.set_response_header(idx, "x-tokens", str(len(words)))
        if idx == 1:
            context.set_response_status(206, "Partial Content", idx)
        for position, word in enumerate(words[:-1]):
            send_intermediate_predict_response(
                {idx: {"token": word, "position": position}}, {idx: context.get_request_id(idx)}, "token", 200, context
            )
        answers.append({"token": words[-1], "position": len(words) - 1, "done": True})
    return answers
'''


#: Stopping criteria decide the final answer's mark: None for request 0 (the mark the chunks left,
#: "true", stays), True for the others ("false"), as the worker's create_predict_response sets it.
CRITERIA_HANDLER = '''\
from ts.handler_utils.utils import send_intermediate_predict_response


def handle(data, context):
    if data is None:
        return None
    context.stopping_criteria = [(lambda answer, i=i: None if i == 0 else True) for i in range(len(data))]
    send_intermediate_predict_response(["part"] * len(data), context.request_ids, "Intermediate Prediction success", 200, context)
    return ["whole"] * len(data)
'''


def _model_dir(root: Path, name: str, handler: str) -> Path:
    model_dir = root / name
    (model_dir / "MAR-INF").mkdir(parents=True)
    (model_dir / "handler.py").write_text(handler)
    manifest = {"runtime": "python", "model": {"modelName": name, "handler": "handler.py", "modelVersion": "1.0"}}
    (model_dir / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest))
    return model_dir


def _torchserve(model_dir: Path, batch: hk.Batch) -> tuple[list[bytes], bytes]:
    """TorchServe's worker answering ``batch``: the frames written before the answer, and the answer's."""
    from ts.model_loader import TsModelLoader

    socket = ChunkSocket()  # any object with sendall: the worker only writes to it
    with ts_imports(model_dir):
        service = TsModelLoader().load(
            model_dir.name, str(model_dir), handler="handler.py", gpu_id=None, batch_size=len(batch),
            metrics_cache=ts_metrics_cache(model_dir.name),
        )
        service.set_cl_socket(socket)
        final = service.predict(batch.to_worker_message())
    return socket.sent, bytes(final)


def _worker_body(item):
    """An answer item as ``create_predict_response`` encodes it."""
    if isinstance(item, (bytes, bytearray)):
        return bytes(item)
    return item.encode("utf-8") if isinstance(item, str) else json.dumps(item, indent=2).encode("utf-8")


def _assert_same_as_torchserve(model_dir: Path, batch: hk.Batch) -> hk.Run:
    frames, final = _torchserve(model_dir, batch)
    with hk.Service.open(model_dir) as service:
        h = hk.Harness(service)
        run = h.run(batch)
        # Intermediate frames: the same sends, each carrying the same request parts.
        theirs = [(position, part) for position, frame in enumerate(frames) for part in decode_frame(frame)[2]]
        ours = [(c.frame, (c.request_id, c.content_type, c.code, c.phrase, c.headers, c.body)) for c in run.chunks]
        assert ours == theirs
        assert {decode_frame(frame)[:2] for frame in frames} == {(c.frame_code, c.frame_message) for c in run.chunks}
        # The final frame: the answers, statuses and headers (ts_stream_next "false" ends each stream).
        code, message, parts = decode_frame(final)
        assert (code, message) == (200, "Prediction success")
        responses = h.context.responses()
        assert [(p[0], p[2], p[3], p[4], p[5]) for p in parts] == [
            (rid, r.code, r.phrase or "", r.headers, _worker_body(item))
            for rid, r, item in zip(batch.request_ids.values(), responses, run.output, strict=True)
        ]
    return run


@pytest.mark.parametrize("size", [1, 3])
def test_torchserve_s_streaming_test_handler_streams_the_same_under_the_harness(tmp_path, size):
    batch = hk.batch(*(hk.Request.json(42 + i) for i in range(size)))
    run = _assert_same_as_torchserve(_model_dir(tmp_path, "tp_model", ECHO_HANDLER), batch)
    # What TorchServe's own test reads over HTTP from one request: four chunks, in this order.
    first = [c.text for c in run.chunks if c.index == 0] + [run.output[0]]
    assert "".join(first) == "hellohellohellohello world " and len(first) == 4
    assert [len(s.chunks) for s in run.streams] == [3] * size and run.problems == []


def test_a_token_generator_streams_the_same_under_the_harness(tmp_path):
    batch = hk.batch(hk.Request.text("the quick brown fox"), hk.Request.text("jumps"), hk.Request.json("over the dog"))
    run = _assert_same_as_torchserve(_model_dir(tmp_path, "tokens", TOKEN_HANDLER), batch)
    assert [(s.index, [c.json()["token"] for c in s.chunks]) for s in run.streams] == [
        (0, ["the", "quick", "brown"]), (2, ["over", "the"]),
    ]
    assert run.chunks[0].headers == {"content-type": "application/json", "x-tokens": "4", "ts_stream_next": "true"}


def test_stopping_criteria_set_the_final_mark_as_the_worker_does(tmp_path):
    batch = hk.batch(hk.Request.text("a"), hk.Request.text("b"))
    run = _assert_same_as_torchserve(_model_dir(tmp_path, "criteria", CRITERIA_HANDLER), batch)
    assert [len(s.chunks) for s in run.streams] == [1, 1]


def test_handlerkit_s_send_streams_the_same_under_torchserve_s_worker(tmp_path):
    """A character GRU sending with ``from handlerkit import send_intermediate_predict_response``:
    TorchServe's worker writes the same frames as with its own function, and the Harness the same
    chunks as the worker."""
    from _new_users import char_stream_dir

    batch = hk.batch(hk.Request.text("the cat"), hk.Request.text("a dog"))
    ours = char_stream_dir(tmp_path / "handlerkit_send", send_from="handlerkit")
    theirs = char_stream_dir(tmp_path / "torchserve_send")
    assert "from handlerkit import send_intermediate_predict_response" in (ours / "handler.py").read_text()
    assert _torchserve(ours, batch) == _torchserve(theirs, batch)
    run = _assert_same_as_torchserve(ours, batch)
    assert [len(s.chunks) for s in run.streams] == [8, 8] and run.problems == []
    assert ["".join(c.text for c in s.chunks) for s in run.streams] == run.output
