"""handlerkit.serving._replica serving an async handler (``asyncCommunication: true``) on a real
local Ray instance (loopback only, 2 CPUs): requests awaited at once, as TorchServe's async
worker awaits them, each answered as the Harness answers it."""

from __future__ import annotations

import concurrent.futures
import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
import ray
from _async_handlers import SYNC_HANDLER, VLLM_STYLE, prompt, reversed_words, write_model_dir
from ray import serve

import handlerkit as hk
from handlerkit.serving.ray import app

pytestmark = pytest.mark.ray

LONG = " ".join(f"word{i}" for i in range(12))  # 12 tokens, 10 ms each: requests overlap


def _post(base: str, path: str, body: bytes) -> tuple[int, bytes]:
    request = urllib.request.Request(
        base + path, data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("async")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    # the port is picked after Ray's own processes have bound theirs, so none of them takes it
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(app(write_model_dir(root, VLLM_STYLE)), name="llm", route_prefix="/")
        serve.run(app(write_model_dir(root, SYNC_HANDLER, name="sync_llm")), name="sync", route_prefix="/sync")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def test_async_requests_are_awaited_at_once_and_answer_as_the_harness(base, tmp_path):
    texts = [f"{LONG} request{i}" for i in range(4)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda t: _post(base, "/predictions/tiny_llm", prompt(t)), texts))
    h = hk.Harness.open(write_model_dir(tmp_path, VLLM_STYLE))
    try:
        for text, (status, body) in zip(texts, answers):
            assert status == 200, body
            served = json.loads(body)
            expected = h.run(hk.batch(hk.Request.from_bytes(prompt(text)))).output[0]
            assert served["text"] == expected["text"] == reversed_words(text)
    finally:
        h.service.close()
    assert max(json.loads(body)["at_once"] for _, body in answers) >= 2  # concurrent on one replica


def test_async_failures_answer_as_torchserve(base):
    status, body = _post(base, "/predictions/tiny_llm", prompt("fail"))
    assert status == 503 and json.loads(body)["message"] == "Prediction failed"
    # a synchronous handler under asyncCommunication: TorchServe's await fails, 503 for every request
    status, body = _post(base, "/sync/predictions/sync_llm", prompt("x"))
    assert status == 503 and json.loads(body)["message"] == "Prediction failed"


def test_concurrent_async_streams_each_get_their_own_chunks(base):
    """Each request awaits with its own deep copy of the context (as TorchServe's async worker),
    so concurrent streams on one replica get only their own tokens, then their own answer."""
    from worker.test_streaming_server import _read_answer

    port = int(base.rsplit(":", 1)[1])
    texts = [f"{LONG} stream{i}" for i in range(3)]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda t: _read_answer(port, "/predictions/tiny_llm", prompt(t, stream=True), "application/json"), texts))
    for text, (status, headers, chunks, ended) in zip(texts, answers):
        assert status == 200 and headers["ts_stream_next"] == "true" and ended
        assert [c.decode() for c in chunks[:-1]] == reversed_words(text).split()
        final = json.loads(chunks[-1])
        assert final["text"] == reversed_words(text)
    assert max(json.loads(a[2][-1])["at_once"] for a in answers) >= 2  # they did overlap
