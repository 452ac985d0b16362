"""Streaming handlers under the real TorchServe 0.12 server and under the Ray adapter: the client
receives the same HTTP chunks.

Each client reads the raw HTTP/1.1 answer (status line, headers, every chunk of the chunked
body as framed on the wire) of the same requests to the same handlers:

- ``echo``: TorchServe's streaming test handler (three "hello" sends, then "hello world ");
- ``echo_hk``: the same, sending with handlerkit's ``send_intermediate_predict_response``;
- ``tokens``: a batch of 3 where each request streams its own tokens, statuses and headers,
  one of them ending with an empty final answer (no HTTP chunk for it), and a status and header
  set after the first chunk (not sent: the first chunk's status line and headers stand);
- ``failing``: two sends, then ``handle`` raises: the stream is cut before its terminating chunk
  (TorchServe resets the connection; Ray Serve's proxy closes it).

Headers that only one server adds (TorchServe's ``Pragma``/``Cache-Control``/``Expires`` and
``connection``, uvicorn's ``date``/``server``) and the per-request ``x-request-id`` are left
out of the comparison; everything else, the status code included, must be equal.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _serving import ray_apps
from _ts_server import HOST, missing_requirements, serving

from worker.test_streaming_torchserve import ECHO_HANDLER

_missing = missing_requirements()
pytestmark = [
    pytest.mark.torchserve,
    pytest.mark.server,
    pytest.mark.ray,
    pytest.mark.skipif(_missing is not None, reason=f"real TorchServe server: {_missing}"),
]

TOKENS = '''\
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
        context.set_response_header(idx, "x-final", "not sent")
        context.set_response_status(201, "Made", idx)
        answers.append("" if words[-1] == "EMPTY" else {"token": words[-1], "done": True})
    return answers
'''

FAILING = '''\
from ts.handler_utils.utils import send_intermediate_predict_response


def handle(data, context):
    if data is None:
        return None
    for word in ("one", "two"):
        send_intermediate_predict_response([word] * len(data), context.request_ids, "chunk", 200, context)
    raise ValueError("the generator broke")
'''

ECHO_HK = ECHO_HANDLER.replace("from ts.handler_utils.utils import", "from handlerkit import")
MODELS = {
    "echo": (ECHO_HANDLER, "batchSize: 1\n"),
    "echo_hk": (ECHO_HK, "batchSize: 1\n"),
    "tokens": (TOKENS, "batchSize: 3\nmaxBatchDelay: 5000\n"),
    "failing": (FAILING, "batchSize: 1\n"),
}
TOKEN_BODIES = (b"the quick brown fox", b"jumps over", b"lazy dog EMPTY")
ONE_SIDED = {"date", "server", "x-request-id", "pragma", "cache-control", "expires", "connection"}


def _model_dir(root: Path, name: str) -> Path:
    source, config = MODELS[name]
    directory = root / name
    (directory / "MAR-INF").mkdir(parents=True)
    (directory / "handler.py").write_text(source)
    (directory / "model-config.yaml").write_text(config)
    manifest = {"runtime": "python", "model": {"modelName": name, "handler": "handler.py", "modelVersion": "1.0",
                                               "configFile": "model-config.yaml"}}
    (directory / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest))
    return directory


def _read_answer(
    port: int, path: str, body: bytes, content_type: str = "text/plain"
) -> tuple[int, dict[str, str], list[bytes], bool]:
    """POST ``body``; the status, headers (lower-cased), each chunk of the chunked body, and
    whether the stream ended with its terminating chunk (False: the connection was cut)."""
    with socket.create_connection((HOST, port), timeout=60) as conn:
        conn.sendall(f"POST {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nContent-Type: {content_type}\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        reader = conn.makefile("rb")
        status = int(reader.readline().split()[1])
        headers = {}
        while (line := reader.readline()) not in (b"\r\n", b""):
            key, _, value = line.decode("latin-1").partition(":")
            headers[key.strip().lower()] = value.strip()
        assert headers.get("transfer-encoding") == "chunked", headers
        chunks: list[bytes] = []
        try:
            while size_line := reader.readline():
                size = int(size_line.split(b";")[0], 16)
                data = reader.read(size + 2)
                if size == 0:
                    return status, headers, chunks, True
                if len(data) < size + 2:
                    break
                chunks.append(data[:size])
        except ConnectionResetError:
            pass
        return status, headers, chunks, False


def _answers(port: int, per_app: bool = False) -> dict[str, object]:
    """Every scenario's answers from the server on ``port`` (``per_app``: each model under its own
    Ray application's route prefix, ``/<m>/predictions/<m>``)."""

    def path(model: str) -> str:
        return f"/{model}/predictions/{model}" if per_app else f"/predictions/{model}"

    out: dict[str, object] = {name: _read_answer(port, path(name), b"42") for name in ("echo", "echo_hk")}
    tokens: dict[int, object] = {}

    def token(i: int) -> None:
        tokens[i] = _read_answer(port, path("tokens"), TOKEN_BODIES[i])

    threads = [threading.Thread(target=token, args=(i,)) for i in range(3)]
    for thread in threads:  # staggered: the batch's order is the requests' order
        thread.start()
        time.sleep(0.3)
    for thread in threads:
        thread.join(60)
    out["tokens"] = [tokens[i] for i in range(3)]
    out["failing"] = _read_answer(port, path("failing"), b"x")
    return out


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("streaming_sources")
    return {name: _model_dir(root, name) for name in MODELS}


@pytest.fixture(scope="module")
def torchserve_answers(tmp_path_factory: pytest.TempPathFactory, sources: dict[str, Path]) -> dict[str, object]:
    from handlerkit.archive import build

    store = tmp_path_factory.mktemp("streaming_store")
    archives = {name: build(directory, store, force=True) for name, directory in sources.items()}
    with serving(tmp_path_factory.mktemp("streaming_ts"), archives, timeout=120) as ts:
        return _answers(ts.inference_port)


@pytest.fixture(scope="module")
def ray_answers(torchserve_answers: object, sources: dict[str, Path]) -> Iterator[dict[str, object]]:
    with ray_apps(sources) as port:
        yield _answers(port, per_app=True)


def _comparable(answer):
    status, headers, chunks, ended = answer
    return status, {k: v for k, v in headers.items() if k not in ONE_SIDED}, chunks, ended


def test_torchserve_streams_as_pinned(torchserve_answers):
    status, headers, chunks, ended = torchserve_answers["echo"]
    assert (status, chunks, ended) == (200, [b"hello"] * 3 + [b"hello world "], True)
    assert headers["ts_stream_next"] == "true"
    assert _comparable(torchserve_answers["echo_hk"]) == _comparable(torchserve_answers["echo"])  # hk's send
    statuses = [a[0] for a in torchserve_answers["tokens"]]
    assert statuses == [200, 206, 200]  # the first chunk's status; the final answer's 201 is not sent
    assert all("x-final" not in a[1] and a[1]["content-type"] == "application/json" for a in torchserve_answers["tokens"])
    assert [len(a[2]) for a in torchserve_answers["tokens"]] == [4, 2, 2]  # lazy dog EMPTY: no chunk for ""
    assert torchserve_answers["failing"][2:] == ([b"one", b"two"], False)  # cut before its end


@pytest.mark.parametrize("scenario", list(MODELS))
def test_the_ray_adapter_streams_the_same_chunks_as_torchserve(torchserve_answers, ray_answers, scenario):
    theirs, ours = torchserve_answers[scenario], ray_answers[scenario]
    if scenario == "tokens":
        assert [_comparable(a) for a in ours] == [_comparable(a) for a in theirs]
    else:
        assert _comparable(ours) == _comparable(theirs)
