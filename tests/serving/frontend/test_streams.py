"""handlerkit.serving.frontend.streams: frames from a handler's thread routed to each request's answer, as
TorchServe's frontend routes them (no Ray here; tests/worker/test_streaming_server.py compares the bytes
a client receives with the real server's)."""

from __future__ import annotations

import asyncio
import threading

import pytest

import handlerkit as hk
from handlerkit.serving._http import Reply, worker_error
from handlerkit.serving.frontend.streams import StreamBroken, StreamRouter

STREAMING = """
from ts.handler_utils.utils import send_intermediate_predict_response


def handle(data, context):
    if data is None:
        return None
    context.set_response_content_type(0, "text/plain")
    context.set_response_status(206, "Partial Content", 0)
    for word in ("one", "", "two"):
        send_intermediate_predict_response([word] * len(data), context.request_ids, "chunk", 200, context)
    context.set_response_status(201, "Made", 0)  # the status line is sent already: ignored
    if data[0].get("body") == b"fail":
        raise ValueError("broke mid-stream")
    return ["end"] * len(data)
"""


def _serve(model_dir, body: bytes) -> tuple[int | None, dict, list[bytes], BaseException | None]:
    """One request through a StreamRouter wired as the replica wires it (the handler on a thread)."""

    async def main():
        service = hk.Service.open(model_dir)
        service.initialize()
        router = StreamRouter()
        service.context.cl_socket = router
        request = hk.Request.from_bytes(body)
        queue = router.open(request.request_id)
        loop = asyncio.get_running_loop()

        def run() -> Reply:
            from handlerkit.serving._http import replies

            try:
                output = service.handle(hk.batch(request))
            except ValueError:
                return worker_error(503, "Prediction failed")
            return replies(output, service.context, 1)[0]

        answer = loop.run_in_executor(None, run)
        opened = await router.answer(request.request_id, queue, answer)
        assert opened.reply is None and opened.body is not None
        chunks, error = [], None
        try:
            async for chunk in opened.body:
                chunks.append(chunk)
        except StreamBroken as exc:
            error = exc
        service.close()
        assert router._channels == {}  # the request's channel is gone with its stream
        return opened.status, opened.headers, chunks, error

    return asyncio.run(main())


@pytest.fixture
def model_dir(tmp_path):
    from worker.test_streaming_torchserve import _model_dir

    return _model_dir(tmp_path, "streaming", STREAMING)


def test_a_stream_opens_with_its_first_chunk_and_ends_with_the_final_answer(model_dir):
    status, headers, chunks, error = _serve(model_dir, b"go")
    assert status == 206 and error is None
    assert headers == {"ts_stream_next": "true", "content-type": "text/plain"}
    assert chunks == [b"one", b"two", b"end"]  # an empty send is no HTTP chunk


def test_a_failure_after_the_first_chunk_cuts_the_stream(model_dir):
    status, _, chunks, error = _serve(model_dir, b"fail")
    assert status == 206 and chunks == [b"one", b"two"]
    assert isinstance(error, StreamBroken)
    assert "failed after its stream began (503" in str(error) and "cut, as TorchServe's" in str(error)


def test_handlerkit_s_send_streams_under_handlerkit_serve_as_torchserve_s_does(tmp_path):
    from _new_users import char_stream_dir

    ours = _serve(char_stream_dir(tmp_path / "ours", base="handlerkit", send_from="handlerkit"), b"hello")
    theirs = _serve(char_stream_dir(tmp_path / "theirs", base="handlerkit"), b"hello")
    assert ours == theirs
    status, headers, chunks, error = ours
    assert (status, headers, error) == (200, {"ts_stream_next": "true"}, None)
    assert [len(c) for c in chunks] == [1] * 8 + [8] and b"".join(chunks[:8]) == chunks[8]  # then the text


def test_an_answer_without_chunks_is_one_full_reply_and_strays_are_dropped():
    async def main():
        router = StreamRouter()
        queue = router.open("r1")
        reply = asyncio.get_running_loop().create_future()
        opened = asyncio.ensure_future(router.answer("r1", queue, reply))
        from ts.handler_utils.utils import send_intermediate_predict_response

        from handlerkit.worker.context import MockContext

        ctx = MockContext()
        ctx.cl_socket = router
        hk.batch(hk.Request.text("x")).bind(ctx)
        thread = threading.Thread(
            target=send_intermediate_predict_response, args=(["x"], {0: "nobody"}, "chunk", 200, ctx)
        )
        thread.start()
        thread.join()
        router.sendall(b"not a frame")  # logged and dropped
        reply.set_result(Reply(200, None, {}, b"whole"))
        return await opened, router

    opened, router = asyncio.run(main())
    assert opened.reply == Reply(200, None, {}, b"whole") and opened.body is None
    assert router.dropped == 1 and router._channels == {}


def test_a_continuous_batching_steps_answer_is_sent_as_one_chunk_of_its_stream():
    """StreamRouter.send: an unfinished step's answer (``ts_stream_next: true``) opens the stream
    with its status and headers; the final answer is the last chunk; a send for nobody is dropped."""

    async def main():
        router = StreamRouter()
        queue = router.open("r1")
        reply = asyncio.get_running_loop().create_future()
        step = Reply(200, None, {"Content-Type": "text/plain", "ts_stream_next": "true"}, b"5")
        router.send("r1", step)
        router.send("r1", step)
        router.send("nobody", step)
        opened = await router.answer("r1", queue, reply)
        reply.set_result(Reply(200, None, {"ts_stream_next": "false"}, b"9"))
        return opened, [chunk async for chunk in opened.body], router

    opened, chunks, router = asyncio.run(main())
    assert (opened.reply, opened.status, opened.headers) == (
        None,
        200,
        {"content-type": "text/plain", "ts_stream_next": "true"},
    )
    assert chunks == [b"5", b"5", b"9"] and router.dropped == 1 and router._channels == {}
