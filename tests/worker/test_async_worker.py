"""handlerkit.worker.async_worker: the worker loop, and what TorchServe's async worker requires of a
handler; the vLLM-style handler run by TorchServe 0.12's own ``ts/async_service.py`` and by
handlerkit, the same answers and the same streamed chunks."""

from __future__ import annotations

import asyncio
import copy
import gc
import threading
import time
import warnings

import pytest
from _async_handlers import VLLM_STYLE, prompt, reversed_words, write_model_dir

import handlerkit as hk
from conftest import decode_predict_response, ts_metrics_cache
from handlerkit.errors import HandlerkitError, HandlerkitWarning
from handlerkit.service import Service
from handlerkit.worker.async_worker import WorkerLoop, awaiting, is_async_config, refusing_coroutines, unawaited

# -- the loop --------------------------------------------------------------------------------


@pytest.fixture
def worker_loop():
    loop = WorkerLoop("test-loop")
    yield loop
    loop.close()


def test_call_runs_in_the_loop_thread_with_the_loop_set_and_not_running(worker_loop):
    def look():
        loop = asyncio.get_event_loop()  # what vllm_handler.initialize does
        return loop, loop.is_running(), threading.current_thread().name

    loop, running, thread = worker_loop.call(look)
    assert loop is worker_loop.loop and not running and thread == "test-loop"
    # and run_until_complete works there, as in the worker's main thread before it serves
    assert worker_loop.call(lambda: asyncio.get_event_loop().run_until_complete(asyncio.sleep(0, "set up"))) == "set up"


def test_coroutines_run_concurrently_on_the_loop_and_survive_a_call_in_between(worker_loop):
    started, together = [], []

    async def job(i):
        started.append(i)
        await asyncio.sleep(0.05)
        together.append(len(started))
        return asyncio.get_running_loop(), i

    futures = [worker_loop.submit(job(i)) for i in range(3)]
    assert worker_loop.call(lambda: "between") == "between"  # stops the loop, runs, resumes it
    results = [f.result(timeout=5) for f in futures]
    assert [i for _, i in results] == [0, 1, 2]
    assert all(loop is worker_loop.loop for loop, _ in results)
    assert together == [3, 3, 3]  # all three were in flight at once


def test_run_works_with_no_loop_and_inside_a_running_loop_as_in_a_notebook(worker_loop):
    async def answer():
        return 42

    assert worker_loop.run(answer()) == 42

    async def notebook_cell():  # a notebook's own loop runs in this thread: asyncio.run would refuse
        with pytest.raises(RuntimeError, match="cannot be called from a running event loop"):
            coroutine = answer()
            try:
                asyncio.run(coroutine)
            finally:
                coroutine.close()
        return worker_loop.run(answer())

    assert asyncio.run(notebook_cell()) == 42


def test_errors_come_out_as_raised_and_waiting_on_itself_is_refused(worker_loop):
    async def fail():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        worker_loop.run(fail())
    with pytest.raises(ZeroDivisionError):
        worker_loop.call(lambda: 1 / 0)

    async def inside():
        with pytest.raises(RuntimeError, match="would wait for itself: await the coroutine there"):
            worker_loop.run(asyncio.sleep(0))
        with pytest.raises(RuntimeError, match="call from inside its own loop would wait for itself"):
            worker_loop.call(lambda: None)
        return "refused"

    assert worker_loop.submit(inside()).result(timeout=5) == "refused"


def test_setup_runs_first_in_the_thread_and_its_error_comes_out(tmp_path):
    seen = []
    loop = WorkerLoop("with-setup", setup=lambda: seen.append(threading.current_thread().name))
    assert loop.call(lambda: seen[:]) == ["with-setup"]
    loop.close()
    broken = WorkerLoop("broken", setup=lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        broken.call(lambda: None)


def test_close_cancels_what_still_runs_and_refuses_more():
    loop = WorkerLoop("closing")
    future = loop.submit(asyncio.sleep(60))
    time.sleep(0.05)
    loop.close()
    assert future.cancelled()
    assert "closed" in repr(loop)
    coroutine = asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="closing is closed"):
        loop.submit(coroutine)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the refused coroutine was closed: no "never awaited"
        del coroutine
        gc.collect()


# -- the worker's rules ------------------------------------------------------------------------


def test_is_async_config_reads_async_communication():
    assert is_async_config({"asyncCommunication": True})
    assert not is_async_config({"asyncCommunication": False})
    assert not is_async_config({}) and not is_async_config(None)


def test_a_sync_handle_under_async_communication_fails_as_the_worker_does():
    entry = awaiting(lambda data, ctx: ["sync"], "SyncHandler")
    with pytest.raises(HandlerkitError, match=r"SyncHandler.handle returned list, not an awaitable.*503") as info:
        asyncio.run(entry([{}], None))
    assert "async def handle" in info.value.fix and "remove asyncCommunication" in info.value.fix


def test_an_answer_never_awaited_is_an_error_naming_it():
    async def generate(row):
        return "never"

    async def handle(data, ctx):
        return [generate(row) for row in data]

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the forgotten coroutines are closed: no RuntimeWarning later
        with pytest.raises(HandlerkitError, match=r"request 0 with a coroutine .*generate.* never awaited") as info:
            asyncio.run(awaiting(handle, "Forgetful")([{}, {}], None))
        gc.collect()
    assert info.value.fix.startswith("await it")


def test_an_async_handle_without_async_communication_fails_as_the_worker_does():
    async def handle(data, ctx):
        return ["never runs"]

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(HandlerkitError, match=r"without awaiting it.*'Invalid model predict output'") as info:
            refusing_coroutines(handle, "AsyncHandler")([{}], None)
        gc.collect()
    assert "asyncCommunication: true" in info.value.fix
    assert refusing_coroutines(lambda d, c: ["plain"], "Plain")([{}], None) == ["plain"]


def test_an_async_initialize_is_never_awaited_and_warned():
    ran = []

    async def initialize():
        ran.append(True)

    with pytest.warns(HandlerkitWarning, match="initialize is a coroutine function.*never runs in the server"):
        unawaited(initialize(), "initialize", "Handler")
    assert ran == []
    unawaited(None, "initialize", "Handler")  # a plain initialize returns None: nothing said


# -- against TorchServe 0.12's own async service ------------------------------------------------


class _Socket:
    """What the worker's socket would send to the frontend."""

    def __init__(self):
        self.sent: list[bytes] = []

    def sendall(self, data):
        self.sent.append(bytes(data))


def _chunks(sent: list[bytes], request_id: str) -> list[tuple[int, dict[str, str], bytes]]:
    """The frames sent for ``request_id``, decoded: (status, headers, body) each."""
    return [
        (r.code, r.headers, r.body)
        for frame in sent
        for r in decode_predict_response(frame)[2]
        if r.request_id == request_id
    ]


def _torchserve_service(model_dir, socket=None):
    """TorchServe 0.12's worker's load (its model loader, its metrics cache), made async as its
    worker makes it with asyncCommunication (``AsyncService`` gives it the async predict)."""
    import ts.async_service as async_service
    from ts.model_loader import TsModelLoader

    service = TsModelLoader().load(
        "tiny_llm", str(model_dir), "handler.py", None, 1, metrics_cache=ts_metrics_cache("tiny_llm")
    )
    service.set_cl_socket(socket or _Socket())
    async_service.AsyncService(service)
    return service


PROMPTS = ["the quick brown fox", "jumps over", "the lazy dog said nothing at all"]


def _batches():
    return [
        hk.batch(hk.Request.from_bytes(prompt(text, stream=True), request_id=f"req-{i}"))
        for i, text in enumerate(PROMPTS)
    ]


@pytest.mark.torchserve
def test_the_vllm_style_handler_answers_as_under_torchserves_own_async_service(tmp_path):
    """The same model dir run concurrently by TorchServe 0.12's ``async_service.predict`` on a
    ``ts.service.Service`` from its own model loader, and by handlerkit's Service: the same
    streamed chunks (frames as the worker sends them) and the same final answers, per request."""
    from handlerkit.worker.isolation import model_dir_imports

    model_dir = write_model_dir(tmp_path, VLLM_STYLE)

    # TorchServe: initialize in the main thread with the loop set (not running), then every
    # batch awaited on that loop at once, one socket for the streamed frames, as its worker does.
    socket = _Socket()
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        with model_dir_imports(model_dir):
            theirs = _torchserve_service(model_dir, socket)
            frames = loop.run_until_complete(
                asyncio.gather(*[theirs.predict(b.to_worker_message()) for b in _batches()])
            )
    finally:
        asyncio.set_event_loop(None)
        loop.close()

    with Service.open(model_dir) as ours:
        assert ours.asynchronous
        ours.initialize()

        async def all_at_once():
            return await asyncio.gather(*[ours.ahandle(b, context=copy.copy(ours.context)) for b in _batches()])

        outputs = asyncio.run(all_at_once())
        our_sent = ours.context.cl_socket.sent

    for i, (text, frame, output) in enumerate(zip(PROMPTS, frames, outputs)):
        ((final,),) = [decode_predict_response(frame)[2]]
        assert (final.request_id, final.code) == (f"req-{i}", 200)
        expected = {"text": reversed_words(text), "tokens": len(text.split()), "at_once": len(PROMPTS)}
        assert final.json() == output[0] == expected
        rid = final.request_id
        theirs_chunks, our_chunks = _chunks(socket.sent, rid), _chunks(our_sent, rid)
        assert [c[2].decode() for c in theirs_chunks] == reversed_words(text).split()
        assert our_chunks == theirs_chunks  # statuses, ts_stream_next headers and bodies
        assert all(headers.get("ts_stream_next") == "true" for _, headers, _ in our_chunks)


@pytest.mark.torchserve
def test_a_failing_request_under_torchserve_is_a_503_and_here_its_own_error(tmp_path):
    from handlerkit.worker.isolation import model_dir_imports

    model_dir = write_model_dir(tmp_path, VLLM_STYLE)
    batch = hk.batch(hk.Request.from_bytes(prompt("fail"), request_id="bad"))
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        with model_dir_imports(model_dir):
            theirs = _torchserve_service(model_dir)
            frame = loop.run_until_complete(theirs.predict(batch.to_worker_message()))
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    code, message, _ = decode_predict_response(frame)
    assert (code, message) == (503, "Prediction failed")
    with Service.open(model_dir) as ours:
        ours.initialize()
        with pytest.raises(ValueError, match="the engine refused the prompt"):
            ours.handle(batch)
