"""Streaming handlers in the Harness: chunks kept per request with their times, ``h.stream``
yielding them live, and the frontend's rules for them as contract problems.

The handlers send through TorchServe's own ``send_intermediate_predict_response``, so the bytes
decoded here are the bytes its worker writes to the frontend.
"""

from __future__ import annotations

import sys
import threading
import time

import pytest
import torch
from ts.handler_utils.utils import send_intermediate_predict_response
from ts.protocol.otf_message_handler import create_predict_response

import handlerkit as hk
from handlerkit.errors import HandlerkitError, HandlerkitWarning, StageError
from handlerkit.worker.streaming import Chunk, ChunkSocket, FrameError, RequestStream, decode_frame, encode_frame

SENT = "Intermediate Prediction success"


def _send(context, items, ids=None, code=200, message=SENT):
    send_intermediate_predict_response(items, context.request_ids if ids is None else ids, message, code, context)


def hello_three_times(data, context):
    """TorchServe's streaming test handler's behaviour, per request of the batch."""
    if data is None:
        return None
    for _ in range(3):
        _send(context, ["hello"] * len(data))
    return ["hello world "] * len(data)


def _batch(*values):
    return hk.batch(*(hk.Request.json(v, request_id=f"r{i}") for i, v in enumerate(values)))


def _drain(generator):
    """Every item a generator yields, and what it returns."""
    items = []
    try:
        while True:
            items.append(next(generator))
    except StopIteration as stop:
        return items, stop.value


# -- the frame ------------------------------------------------------------------------------------


def test_a_frame_decodes_as_the_worker_encoded_it():
    ctx = hk.MockContext()
    _batch(1, 2).bind(ctx)
    ctx.set_response_content_type(1, "application/json")
    ctx.set_response_status(206, "Partial", 1)
    frame = create_predict_response(["a", {"n": 1}], ctx.request_ids, SENT, 200, ctx, True)
    code, message, parts = decode_frame(bytes(frame))
    assert (code, message) == (200, SENT)
    assert parts[0] == ("r0", "", 200, "", {"ts_stream_next": "true"}, b"a")
    request_id, content_type, status, phrase, headers, body = parts[1]
    assert (request_id, content_type, status, phrase) == ("r1", "application/json", 206, "Partial")
    assert headers == {"content-type": "application/json", "ts_stream_next": "true"}
    assert body == b'{\n  "n": 1\n}'  # the worker's json.dumps(indent=2)


# -- handlerkit's send_intermediate_predict_response: TorchServe's bytes, no ts needed ------------


def _mock_context(size):
    ctx = hk.MockContext()
    hk.batch(*(hk.Request.json(i, request_id=f"r{i}-é") for i in range(size))).bind(ctx)
    return ctx


def _torchserve_context(size):
    """TorchServe 0.12's own Context, as its worker binds a batch to it."""
    from ts.context import Context, RequestProcessor

    ctx = Context("chars", ".", {}, size, None, "0.12.0")
    ctx.request_ids = {i: f"r{i}-é" for i in range(size)}
    ctx.request_processor = [RequestProcessor({}) for _ in range(size)]
    return ctx


def _statuses(ctx):
    ctx.set_response_content_type(1, "application/json; charset=utf-8")
    ctx.set_response_status(206, "Partial Content", 1)
    ctx.set_response_header(2, "x-tokens", "7 ✓")
    ctx.set_response_status(429, None, 2)


#: What a handler sends, and how: (ret, which requests, message, code, the context's own settings).
SENDS = {
    "every request a str": (["a", "héllo ✓", ""], None, SENT, 200, None),
    "statuses, types and headers": (["a", {"n": [1, 2.5], "é": None}, [1, "x"]], None, SENT, 200, _statuses),
    "bytes and bytearray": ([b"\x00\xff", bytearray(b"raw"), "s"], None, "bytes", 200, None),
    "a tensor": ([torch.tensor([1.5, -2.0]), torch.zeros(2, 2, dtype=torch.int64), 3], None, SENT, 200, None),
    "one request by index": ({1: {"token": "fox", "position": 3}}, {1: "r1-é"}, "token", 200, _statuses),
    "none": (None, None, "failed", 500, None),
    "no request": (["a", "b", "c"], {}, SENT, 200, None),
    "a payload without an encoding": (["a", "b", object()], None, SENT, 200, _statuses),
    "an error frame": (["x", "y", "z"], None, "the model broke", 507, None),
}


@pytest.mark.parametrize("context", [_mock_context, _torchserve_context], ids=["hk.MockContext", "ts.Context"])
@pytest.mark.parametrize("case", list(SENDS))
def test_handlerkit_s_send_writes_torchserve_s_bytes_byte_for_byte(context, case):
    ret, ids, message, code, setup = SENDS[case]
    sent = {}
    for name, send in (
        ("torchserve", send_intermediate_predict_response),
        ("handlerkit", hk.send_intermediate_predict_response),
    ):
        ctx = context(3)
        ctx.cl_socket = ChunkSocket()
        if setup is not None:
            setup(ctx)
        for _ in range(2):  # the second send finds the marks the first one set
            assert send(ret, ctx.request_ids if ids is None else ids, message, code, ctx) is None
        sent[name] = (ctx.cl_socket.sent, [dict(ctx.get_response_headers(i)) for i in range(3)])
    assert sent["handlerkit"] == sent["torchserve"]
    assert len(sent["handlerkit"][0]) == 2


def test_a_non_ascii_phrase_or_content_type_is_counted_in_bytes_as_the_frontend_reads_it():
    # TorchServe 0.12's worker writes the length of these two in characters: its frontend, which
    # reads bytes, cannot read the frame. handlerkit's send writes a frame the frontend reads.
    frames = {}
    for name, send in (
        ("torchserve", send_intermediate_predict_response),
        ("handlerkit", hk.send_intermediate_predict_response),
    ):
        ctx = _mock_context(1)
        ctx.set_response_status(200, "Très bien", 0)
        send(["ok"], ctx.request_ids, SENT, 200, ctx)
        frames[name] = ctx.cl_socket.sent[0]
    with pytest.raises(FrameError, match="does not fit in the frame's"):  # the phrase ends a byte early
        decode_frame(frames["torchserve"])
    part = ("r0-é", "", 200, "Très bien", {"ts_stream_next": "true"}, b"ok")
    assert decode_frame(frames["handlerkit"]) == (200, SENT, [part])
    # The same bytes but the phrase's length: 10 bytes, where TorchServe says 9 characters.
    assert (
        frames["handlerkit"].replace(b"\x00\x00\x00\nTr\xc3\xa8s", b"\x00\x00\x00\tTr\xc3\xa8s") == frames["torchserve"]
    )


def test_handlerkit_s_send_marks_each_request_it_sends_to_and_no_other():
    ctx = _mock_context(3)
    hk.send_intermediate_predict_response({2: "last"}, {2: "r2-é"}, "token", 200, ctx)
    assert [ctx.get_response_headers(i).get("ts_stream_next") for i in range(3)] == [None, None, "true"]
    assert decode_frame(ctx.cl_socket.sent[0]) == (
        200,
        "token",
        [("r2-é", "", 200, "", {"ts_stream_next": "true"}, b"last")],
    )


def test_only_local_rank_0_sends_as_in_the_worker(monkeypatch):
    ctx = _mock_context(1)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert hk.send_intermediate_predict_response(["x"], ctx.request_ids, SENT, 200, ctx) is None
    assert ctx.cl_socket.sent == [] and ctx.get_response_headers(0) == {}


def test_a_streaming_handler_runs_with_torchserve_not_installed(tmp_path, monkeypatch):
    from _new_users import char_stream_dir

    for name in [n for n in sys.modules if n == "ts" or n.startswith("ts.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ts", None)  # every `import ts...` fails, as without torchserve
    with pytest.raises(ModuleNotFoundError, match="'ts' is not a package"):
        import ts.handler_utils.utils  # noqa: F401
    model_dir = char_stream_dir(tmp_path / "chars", base="handlerkit", send_from="handlerkit")
    h = hk.Harness.open(model_dir)
    chunks = list(h.stream(hk.batch(hk.Request.text("hello"), hk.Request.text("the end"))))
    run = h.last_run
    assert [(c.index, len(c.body)) for c in chunks[:4]] == [(0, 1), (1, 1), (0, 1), (1, 1)]  # a character each
    assert ["".join(c.text for c in chunks if c.index == i) for i in (0, 1)] == run.output
    assert [len(s.chunks) for s in run.streams] == [8, 8] and run.problems == []


def test_encode_frame_is_decode_frame_s_inverse():
    parts = [("r0", "text/plain", 200, "", {"ts_stream_next": "true"}, b"a"), ("r1", "", 206, "Partial", {}, b"")]
    assert decode_frame(encode_frame(200, SENT, parts)) == (200, SENT, parts)
    assert encode_frame(503, "", []) == b"\x00\x00\x01\xf7\x00\x00\x00\x00\xff\xff\xff\xff"


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"\x00\x00", "inside a length field"),
        (b"\x00\x00\x00\xc8\x00\x00\x00\x09ok", "does not fit"),
        (b"\x00\x00\x00\xc8\x00\x00\x00\x00\xff\xff\xff\xffjunk", "4 bytes follow the frame's end"),
    ],
)
def test_bytes_that_are_no_frame_are_refused(data, match):
    with pytest.raises(FrameError, match=match):
        decode_frame(data)


def test_the_socket_times_each_frame_from_the_run_start():
    socket = ChunkSocket()
    socket.begin(time.perf_counter_ns())
    ctx = hk.MockContext()
    ctx.cl_socket = socket
    _batch(1).bind(ctx)
    _send(ctx, ["x"])
    (chunk,) = socket.chunks(0, {0: "r0"})
    assert chunk.index == 0 and chunk.text == "x" and 0 <= chunk.time_ms < 5000
    assert socket.chunks(0, {0: "other"})[0].index is None
    socket.begin(0)
    assert socket.sent == [] and socket.times_ns == [] and repr(socket) == "<intermediate responses: 0 sent>"


def test_inter_chunk_percentiles_interpolate_and_count_the_final_answer():
    chunks = [Chunk("r0", 0, b"", 200, "", "", {}, t, i) for i, t in enumerate([5.0, 6.0, 8.0, 11.0])]
    stream = RequestStream(0, "r0", chunks, final_ms=15.0)
    assert stream.first_chunk_ms == 5.0
    assert stream.gaps_ms == [1.0, 2.0, 3.0, 4.0]
    assert stream.inter_chunk_p50_ms == pytest.approx(2.5)
    assert stream.inter_chunk_p99_ms == pytest.approx(3.97)
    unfinished = RequestStream(0, "r0", chunks[:1])
    assert unfinished.gaps_ms == [] and unfinished.inter_chunk_p50_ms is None and unfinished.inter_chunk_p99_ms is None


# -- h.run ----------------------------------------------------------------------------------------


def test_a_run_keeps_every_chunk_per_request_with_its_time():
    h = hk.Harness(hello_three_times)
    run = h.run(_batch(42, 43))
    assert run.output == ["hello world ", "hello world "]  # the final answer, as before
    assert [(c.request_id, c.index, c.body, c.frame) for c in run.chunks] == [
        (f"r{i}", i, b"hello", frame) for frame in range(3) for i in range(2)
    ]
    assert all(c.code == 200 and c.headers == {"ts_stream_next": "true"} for c in run.chunks)
    assert [c.time_ms for c in run.chunks] == sorted(c.time_ms for c in run.chunks)
    assert [(s.index, s.request_id, len(s.chunks)) for s in run.streams] == [(0, "r0", 3), (1, "r1", 3)]
    for stream in run.streams:
        assert 0 < stream.first_chunk_ms == stream.chunks[0].time_ms <= run.handle_ms == stream.final_ms
        assert len(stream.gaps_ms) == 3  # two between chunks, one to the final answer
    assert run.problems == [] and h.last_run is run
    assert h.context.get_response_headers(0) == {"ts_stream_next": "false"}  # the final answer ends it
    assert "6 chunk(s), first after" in repr(run)
    table = str(run)
    assert "first chunk ms" in table and "inter-chunk p50 ms" in table and "r1" in table
    assert "first chunk ms" in run._repr_mimebundle_()["text/html"]


def test_chunk_times_follow_the_handler_s_pace():
    def paced(data, context):
        if data is None:
            return None
        time.sleep(0.03)
        for _ in range(3):
            _send(context, ["t"])
            time.sleep(0.02)
        return ["end"]

    run = hk.Harness(paced).run(_batch(1))
    (stream,) = run.streams
    assert stream.first_chunk_ms >= 30
    assert min(stream.gaps_ms) >= 20 and stream.inter_chunk_p50_ms >= 20 and stream.inter_chunk_p99_ms >= 20


def test_a_run_that_streams_nothing_has_no_chunks_and_forgets_the_last_run_s():
    h = hk.Harness(hello_three_times)
    h.run(_batch(1))
    quiet = hk.Harness(lambda data, context: None if data is None else ["x"] * len(data), h.context)
    run = quiet.run(_batch(1))
    assert run.chunks == [] and run.streams == [] and h.context.cl_socket.sent == []
    assert "chunk" not in repr(run) and "first chunk ms" not in str(run)


def test_preserved_puts_the_last_run_back():
    h = hk.Harness(hello_three_times)
    run = h.run(_batch(1))
    with h.preserved():
        h.run(_batch(1, 2))
    assert h.last_run is run


# -- h.stream -------------------------------------------------------------------------------------


def test_stream_yields_each_chunk_before_handle_goes_on():
    seen = threading.Event()
    waited = []

    def waits_for_its_reader(data, context):
        if data is None:
            return None
        _send(context, ["first"])
        waited.append(seen.wait(timeout=20))  # the reader has it before handle goes on
        _send(context, ["second"])
        return ["done"]

    h = hk.Harness(waits_for_its_reader)
    generator = h.stream(_batch(1))
    first = next(generator)
    assert first.text == "first" and first.index == 0 and waited == []
    seen.set()
    rest, run = _drain(generator)
    assert waited == [True]
    assert [first, *rest] == run.chunks and [c.text for c in rest] == ["second"]
    assert run is h.last_run and run.output == ["done"]
    assert h.context.cl_socket.listener is None


def test_a_handler_failing_mid_stream_raises_its_stage_error_from_the_generator():
    def fails_after_a_chunk(data, context):
        if data is None:
            return None
        if data[0]["body"] == "bad":
            _send(context, ["partial"])
            raise ValueError("the generator lost its state")
        return hello_three_times(data, context)

    h = hk.Harness(fails_after_a_chunk)
    chunks = []
    with pytest.raises(StageError, match="the generator lost its state"):
        for chunk in h.stream(hk.batch(hk.Request.json("bad"))):
            chunks.append(chunk)
    assert [c.text for c in chunks] == ["partial"]
    assert h.context.cl_socket.listener is None
    chunks, run = _drain(h.stream(_batch(1)))  # the harness is usable: stream again
    assert len(chunks) == 3 and run.ok


def test_breaking_out_of_a_stream_waits_for_handle():
    h = hk.Harness(hello_three_times)
    for _chunk in h.stream(_batch(1)):
        break
    assert h.last_run is not None and len(h.last_run.chunks) == 3
    assert h.context.cl_socket.listener is None


def test_stream_needs_a_chunk_socket():
    ctx = hk.MockContext()
    ctx.cl_socket = None
    h = hk.Harness(hello_three_times, ctx)
    with pytest.raises(HandlerkitError, match="cl_socket to be handlerkit's ChunkSocket: got NoneType") as info:
        h.stream(_batch(1))
    assert "hk.MockContext" in info.value.fix


def test_two_streams_on_one_context_are_refused():
    h = hk.Harness(hello_three_times)
    h.context.cl_socket.listener = print
    with pytest.raises(HandlerkitError, match="another stream is already reading"):
        h.stream(_batch(1))


# -- the frontend's rules -------------------------------------------------------------------------


def _run_with_problems(handle, batch):
    h = hk.Harness(handle)
    with pytest.warns(HandlerkitWarning):
        run = h.run(batch)
    return run, {p.check: p for p in run.problems}


def test_a_chunk_for_a_request_not_in_the_batch_is_a_problem():
    def wrong_ids(data, context):
        if data is None:
            return None
        _send(context, ["x"], ids={0: "someone-else"})
        return ["ok"]

    run, problems = _run_with_problems(wrong_ids, _batch(1))
    problem = problems["chunk-request"]
    assert "'someone-else', which is not in the batch (its ids: 'r0')" in problem.message
    assert "Unexpected job in sendResponse()" in problem.message
    assert "context.request_ids" in problem.fix and not run.ok
    assert run.chunks[0].index is None and run.streams == []


def test_a_chunk_payload_the_worker_cannot_encode_is_a_problem():
    def sends_an_object(data, context):
        if data is None:
            return None
        _send(context, [object()])
        return ["ok"]

    run, problems = _run_with_problems(sends_an_object, _batch(1))
    problem = problems["chunk-type"]
    assert "cannot encode" in problem.message and "503 'Unsupported model output data type.'" in problem.message
    assert "tensor.tolist()" in problem.fix and problem.request_index == 0
    assert run.chunks[0].frame_code == 503 and run.chunks[0].body == b"error"
    assert run.streams == [] and "stream-unfinished" not in problems


def test_a_chunk_frame_with_an_error_code_is_a_problem():
    def fails_by_chunk(data, context):
        if data is None:
            return None
        _send(context, ["x"], code=500, message="gave up")
        return ["ok"]

    _run, problems = _run_with_problems(fails_by_chunk, _batch(1))
    problem = problems["chunk-status"]
    assert "code 500 ('gave up')" in problem.message and "PredictionException" in problem.fix


def test_chunks_without_a_final_answer_are_a_problem_per_request():
    def returns_a_string(data, context):
        if data is None:
            return None
        _send(context, ["a", "b"])
        _send(context, ["a", "b"])
        return "a joined answer"

    run, problems = _run_with_problems(returns_a_string, _batch(1, 2))
    assert "output-type" in problems  # the final answer's own problem, beside the streams'
    unfinished = [p for p in run.problems if p.check == "stream-unfinished"]
    assert [p.request_index for p in unfinished] == [0, 1]
    assert "got 2 chunk(s) but no final answer (output-type" in unfinished[0].message
    assert "one encodable item per request" in unfinished[0].fix
    assert all(s.final_ms is None and len(s.gaps_ms) == 1 for s in run.streams)


def test_bytes_that_are_no_frame_are_a_problem_and_skipped_by_the_stream():
    def writes_raw_bytes(data, context):
        if data is None:
            return None
        context.cl_socket.sendall(b"token")
        _send(context, ["x"])
        return ["ok"]

    h = hk.Harness(writes_raw_bytes)
    with pytest.warns(HandlerkitWarning, match="send 0 to context.cl_socket is not a predict-response frame"):
        chunks, run = _drain(h.stream(_batch(1)))
    assert [c.text for c in chunks] == ["x"] and chunks == run.chunks
    (problem,) = run.problems
    assert problem.check == "chunk-frame" and "send_intermediate_predict_response" in problem.fix
