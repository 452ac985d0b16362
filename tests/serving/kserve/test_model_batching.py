"""The KServe adapter batches as model-config.yaml says, and streams a v1 answer, on a live
local KServe model server (``handlerkit.serving.kserve`` on ``handlerkit.serving.frontend``).

TorchServe's ``kserve``/``kservev2`` envelopes read only the first request of a batch, so
TorchServe-on-KServe runs batches of one; here each request of a batch is read by its own
envelope and the handler gets them all in one call.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _new_users import char_stream_dir

from handlerkit.serving.kserve import KServeServer, start

#: Records the size of every batch it is handed; answers each row with (call number, batch size, row).
COUNTING_HANDLER = """\
class Counting:
    def initialize(self, context):
        self.sizes = []

    def handle(self, data, context):
        self.sizes.append(len(data))
        if context.get_request_header(0, "explain") == "True":
            return [{"explained": row} for row in data]
        # a v1 row is an instance; a v2 row is an input, whose data is a list
        return [[len(self.sizes), len(data), *(row["data"] if isinstance(row, dict) else [row])] for row in data]
"""


def _post(port: int, path: str, body: Any) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", path, body=json.dumps(body).encode("utf-8"), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _at_once(port: int, path: str, bodies: list[Any]) -> list[tuple[int, dict[str, str], bytes]]:
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda body: _post(port, path, body), bodies))


@pytest.fixture(scope="module")
def counting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KServeServer]:
    model_dir = tmp_path_factory.mktemp("counting")
    (model_dir / "counting.py").write_text(COUNTING_HANDLER)
    # A generous delay: the batch closes when its fourth request arrives, however slow the machine.
    (model_dir / "model-config.yaml").write_text("batchSize: 4\nmaxBatchDelay: 20000\n")
    (model_dir / "MAR-INF").mkdir()
    manifest = {
        "runtime": "python",
        "model": {"modelName": "counting", "handler": "counting.py", "configFile": "model-config.yaml"},
    }
    (model_dir / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest))
    with start(model_dir, timeout=120) as running:
        yield running


def test_four_concurrent_v1_requests_share_one_batch(counting: KServeServer) -> None:
    answers = _at_once(counting.port, "/v1/models/counting:predict", [{"instances": [k]} for k in range(4)])
    assert [status for status, _, _ in answers] == [200] * 4, answers
    predictions = [json.loads(raw)["predictions"] for _, _, raw in answers]
    # One handle call for the four (call 1, a batch of 4), and each request gets its own row back.
    assert predictions == [[[1, 4, k]] for k in range(4)]


def test_v2_requests_share_a_batch_and_v1_explanations_are_batched_apart(counting: KServeServer) -> None:
    v2 = [{"id": f"r{k}", "inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [k]}]} for k in range(4)]
    answers = _at_once(counting.port, "/v2/models/counting/infer", v2)
    assert [status for status, _, _ in answers] == [200] * 4, answers
    docs = [json.loads(raw) for _, _, raw in answers]
    assert [doc["id"] for doc in docs] == ["r0", "r1", "r2", "r3"]  # each request's own id
    calls = {tuple(doc["outputs"][0]["data"][:2]) for doc in docs}
    assert len(calls) == 1 and next(iter(calls))[1] == 4, docs  # one call, a batch of 4
    assert [doc["outputs"][0]["data"][2:] for doc in docs] == [[0], [1], [2], [3]]
    explained = _at_once(counting.port, "/v1/models/counting:explain", [{"instances": [k]} for k in range(4)])
    assert [json.loads(raw) for _, _, raw in explained] == [{"explanations": [{"explained": k}]} for k in range(4)]


@pytest.fixture(scope="module")
def chars(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KServeServer]:
    model_dir = char_stream_dir(tmp_path_factory.mktemp("chars") / "chars")
    with start(model_dir, timeout=120) as running:
        yield running


def test_a_v1_answer_is_streamed_one_chunk_per_send(chars: KServeServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", chars.port, timeout=60)
    try:
        body = json.dumps({"instances": [{"data": "hello"}]}).encode("utf-8")
        conn.request("POST", "/v1/models/chars:predict", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("transfer-encoding") == "chunked"
        chunks = []
        while piece := resp.read1():  # each HTTP chunk as it comes
            chunks.append(piece)
    finally:
        conn.close()
    streamed = b"".join(chunks)
    text = streamed[:8].decode("utf-8")  # 8 characters, one send each, then the final answer
    assert json.loads(streamed[8:]) == {"predictions": [text]}


def test_the_server_writes_past_a_pipes_worth_of_access_log(counting: KServeServer) -> None:
    """Its stdout after the listening line goes to the log: nobody reads the pipe, and a full
    pipe (64 KiB, ~600 access-log lines) would block the server for good."""
    status, _, _ = _post(counting.port, "/v1/models/counting:predict", {"instances": [9]})
    assert status == 200
    assert '"POST /v1/models/counting%3Apredict HTTP/1.1" 200' in counting.log.read_text()
