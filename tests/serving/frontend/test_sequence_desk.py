"""handlerkit.serving.frontend.sequence_desk: a replica's sequences as TorchServe's frontend keeps them, and
Ray Serve's model multiplexing keeping each sequence on the replica that holds it (2 replicas,
a real local Ray instance on loopback)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _stateful_handlers import CONTINUOUS_CONFIG, SEQUENCE_CONFIG, STREAMING_SUM, model_dir
from _ts_server import HOST, free_ports

from handlerkit.serving._http import Reply
from handlerkit.serving.frontend.sequence_desk import ROUTING_HEADER, ROUTING_SETTLE_S, Admitted, SequenceDesk

SEQ_ID = "ts_request_sequence_id"

#: SEQUENCE_SUM that also says which process answered and names the sequence in its answer's
#: headers (so its client can continue a sequence the frontend opened).
PID_SUM = """\
import os

from recent import Recent, capacity, number


class PidSum:
    def initialize(self, context):
        self.totals = Recent(capacity(context))

    def handle(self, data, context):
        answers = []
        for idx, row in enumerate(data):
            sequence_id = context.get_sequence_id(idx)
            context.set_response_header(idx, context.header_key_sequence_id, sequence_id)
            total = self.totals[sequence_id] = self.totals.get(sequence_id, 0) + number(row)
            if total > 100:
                context.set_response_header(idx, context.header_key_sequence_end, sequence_id)
            answers.append({"sum": total, "pid": os.getpid()})
        return answers
"""


# -- the desk, engine-free ---------------------------------------------------------------------
def test_a_request_without_a_sequence_id_opens_one_as_the_frontend_does():
    desk = SequenceDesk("m")
    admitted = desk.admit([("content-type", "text/plain")])
    assert isinstance(admitted, Admitted) and admitted.opened
    assert admitted.sequence_id.startswith("ts-seq-") and len(admitted.sequence_id) == len("ts-seq-") + 36
    assert admitted.headers == {SEQ_ID: admitted.sequence_id, "ts_request_sequence_start": "true"}
    again = desk.admit([(SEQ_ID, admitted.sequence_id)])  # held here: no routing header needed
    assert again == Admitted(admitted.sequence_id, {}, False)


def test_a_sequence_not_held_here_needs_the_routing_header():
    desk = SequenceDesk("m")
    refused = desk.admit([(SEQ_ID, "seq_0")])
    assert isinstance(refused, Reply) and refused.status == 400
    message = json.loads(refused.body)["message"]
    assert message.startswith("sequence seq_0 is not open on this replica and the request's serve_multiplexed_model_id")
    assert message.endswith(
        "send `serve_multiplexed_model_id: seq_0` with every request of the sequence after the first"
    )
    assert desk.admit([(SEQ_ID, "seq_0"), ("Serve-Multiplexed-Model-Id", "seq_0")]) == Admitted("seq_0", {}, True)


def test_max_num_sequence_refuses_one_more_with_torchserves_answer_and_an_end_frees_it():
    desk = SequenceDesk.from_config("stream", {"sequenceBatching": True, "maxNumSequence": 1})
    assert desk is not None
    first = desk.admit([])
    assert isinstance(first, Admitted)
    refused = desk.admit([])
    assert isinstance(refused, Reply) and refused.status == 503
    assert json.loads(refused.body) == {
        "code": 503,
        "type": "ServiceUnavailableException",
        "message": 'Model "stream" has no worker to serve inference request. Please use scale workers API to add '
        "workers. If this is a sequence inference, please check if it is closed, or expired; or exceeds "
        "maxSequenceJobQueueSize",
    }  # word for word what TorchServe 0.12 answers (tests/test_sequences_server.py)
    assert desk.answered({"ts_request_sequence_end": f"{first.sequence_id}; other"}) == [first.sequence_id, "other"]
    assert isinstance(desk.admit([]), Admitted)


def test_an_idle_sequence_is_forgotten_after_sequence_max_idle():
    now = [0.0]
    desk = SequenceDesk("m", max_num_sequence=1, max_idle_s=5, clock=lambda: now[0])
    assert isinstance(desk.admit([]), Admitted)
    now[0] = 4.0
    assert isinstance(desk.admit([]), Reply)
    now[0] = 10.0
    assert isinstance(desk.admit([]), Admitted) and len(desk.open) == 1


def test_only_a_stateful_model_gets_a_desk():
    assert SequenceDesk.from_config("m", {"batchSize": 4}) is None
    desk = SequenceDesk.from_config("m", {"sequenceBatching": True, "sequenceMaxIdleMSec": 250})
    assert desk is not None and (desk.max_num_sequence, desk.max_idle_s) == (None, 0.25)


# -- on Ray Serve, 2 replicas ------------------------------------------------------------------
def _post(base: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    headers = {"Content-Type": "text/plain", **headers}  # urllib's default is a form
    request = urllib.request.Request(base + path, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    ray = pytest.importorskip("ray")
    from ray import serve

    from handlerkit.serving.ray import app

    root = tmp_path_factory.mktemp("ray_sequences")
    pid_sum = model_dir(root, "pid_sum", PID_SUM, SEQUENCE_CONFIG)
    stream = model_dir(root, "stream", STREAMING_SUM, CONTINUOUS_CONFIG)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    # the port is picked after Ray's own processes have bound theirs, so none of them takes it
    (port,) = free_ports(1)
    try:
        serve.start(http_options={"host": HOST, "port": port})
        serve.run(app(pid_sum, num_replicas=2, num_cpus=0.25), name="pid_sum", route_prefix="/")
        serve.run(app(stream, num_cpus=0.25), name="stream", route_prefix="/stream")
        yield f"http://{HOST}:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.mark.ray
def test_every_step_of_a_sequence_lands_on_the_replica_that_holds_it(base):
    opened: dict[str, int] = {}  # sequence id -> the pid that answered its first request
    for name in ("seq_0", "seq_1", "seq_2", "seq_3"):  # named by their clients: routed from the first request
        status, headers, body = _post(base, "/predictions/pid_sum", b"1", {SEQ_ID: name, ROUTING_HEADER: name})
        assert status == 200 and headers[SEQ_ID] == name and json.loads(body)["sum"] == 1, body
        opened[name] = json.loads(body)[
            "pid"
        ]  # answered once Ray routes the id here: the next goes to the emptier replica
    status, headers, body = _post(base, "/predictions/pid_sum", b"1", {})  # opened by the frontend
    issued = headers[SEQ_ID]
    assert status == 200 and issued.startswith("ts-seq-")
    opened[issued] = json.loads(body)["pid"]
    assert len(set(opened.values())) == 2  # the sequences are spread over both replicas
    for step in range(2, 6):
        for sequence_id, pid in opened.items():
            status, headers, body = _post(
                base, "/predictions/pid_sum", str(step).encode(), {SEQ_ID: sequence_id, ROUTING_HEADER: sequence_id}
            )
            assert status == 200 and json.loads(body) == {"sum": sum(range(1, step + 1)), "pid": pid}


@pytest.mark.ray
def test_an_ended_sequence_is_freed_and_its_id_opens_anew(base):
    headers = {SEQ_ID: "long", ROUTING_HEADER: "long"}
    assert json.loads(_post(base, "/predictions/pid_sum", b"99", headers)[2])["sum"] == 99
    status, answered, body = _post(base, "/predictions/pid_sum", b"5", headers)
    assert status == 200 and answered["ts_request_sequence_end"] == "long" and json.loads(body)["sum"] == 104


@pytest.mark.ray
def test_continuous_batching_on_ray_streams_an_unfinished_request_step_by_step(base):
    """An odd number stays in the running batch for five more steps: six HTTP chunks of the
    sequence's sum, the first opening the answer with ``ts_stream_next: true``, as TorchServe."""
    status, headers, body = _post(base, "/stream/predictions/stream", b"2", {})
    sequence_id = headers[SEQ_ID]
    assert (status, body) == (200, b"2") and sequence_id.startswith("ts-seq-")
    assert headers.get("transfer-encoding") != "chunked"  # answered in one step: one full response
    routed = {SEQ_ID: sequence_id, ROUTING_HEADER: sequence_id}
    status, headers, reader = _open_stream(base, "/stream/predictions/stream", b"3", routed)
    assert (status, headers["transfer-encoding"], headers["ts_stream_next"]) == (200, "chunked", "true")
    assert _rest(reader) == [b"5"] * 6
    status, headers, body = _post(base, "/stream/predictions/stream", b"0", routed)
    assert (status, body, headers["ts_request_sequence_end"]) == (200, b"5", sequence_id)


#: Continuous batching, slowly: a request's body ``n`` runs ``n`` steps of 0.2 s, each answering
#: ``<sequence><steps left>;``; its stopping criterion ends it at 0.
SLOW_COUNT = """\
import time

from recent import number


class SlowCount:
    def initialize(self, context):
        self.left = {}

    def handle(self, data, context):
        time.sleep(0.2)
        answers, done = [], []
        for idx, row in enumerate(data):
            request_id = context.get_request_id(idx)
            if request_id not in self.left:  # its first step; later ones come without parameters
                self.left[request_id] = number(row)
            self.left[request_id] -= 1
            answers.append(f"{context.get_sequence_id(idx)}{self.left[request_id]};")
            done.append(self.left[request_id] <= 0)
        context.stopping_criteria = [lambda answer, d=d: d for d in done]
        return answers
"""


@pytest.fixture(scope="module")
def slow_count(base: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from ray import serve

    from handlerkit.serving.ray import app

    directory = model_dir(tmp_path_factory.mktemp("slow_count"), "slow", SLOW_COUNT, CONTINUOUS_CONFIG)
    return serve.run(app(directory, num_cpus=0.25), name="slow", route_prefix="/slow")


def _open_stream(base: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], Any]:
    """POST and read the status line and headers; the reader is left at the body's first HTTP chunk."""
    host, port = base.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)), timeout=60)
    head = "".join(f"{k}: {v}\r\n" for k, v in {"Content-Type": "text/plain", **headers}.items())
    conn.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
    reader = conn.makefile("rb")
    conn.close()  # the reader keeps the connection open
    status = int(reader.readline().split()[1])
    got: dict[str, str] = {}
    while (line := reader.readline()) not in (b"\r\n", b""):
        key, _, value = line.decode("latin-1").partition(":")
        got[key.strip().lower()] = value.strip()
    return status, got, reader


def _chunk(reader: Any) -> bytes | None:
    """The next HTTP chunk, or None at the terminating one."""
    size = int(reader.readline().split(b";")[0], 16)
    data = reader.read(size + 2)[:size]
    return data if size else None


def _rest(reader: Any) -> list[bytes]:
    chunks = []
    while (chunk := _chunk(reader)) is not None:
        chunks.append(chunk)
    reader.close()
    return chunks


@pytest.mark.ray
def test_a_request_sent_while_another_streams_joins_the_running_batch(slow_count, base):
    path = "/slow/predictions/slow"
    status, first, reader_a = _open_stream(base, path, b"10", {SEQ_ID: "a", ROUTING_HEADER: "a"})
    assert (status, first["transfer-encoding"]) == (200, "chunked")
    chunks_a = [_chunk(reader_a)]  # a runs: b is sent only now
    status, second, reader_b = _open_stream(base, path, b"3", {SEQ_ID: "b", ROUTING_HEADER: "b"})
    chunks_b = _rest(reader_b)
    chunks_a += _rest(reader_a)
    assert chunks_a == [f"a{n};".encode() for n in range(9, -1, -1)]  # ten steps, one chunk each
    assert chunks_b == [b"b2;", b"b1;", b"b0;"]
    a, b = first["x-request-id"], second["x-request-id"]
    steps = slow_count.stats.remote().result()["steps"]
    together = [i for i, step in enumerate(steps) if step == [a, b]]  # the running request first
    assert len(together) == 3 and together == list(range(together[0], together[0] + 3)), steps
    assert together[0] >= 1 and all(step == [a] for step in steps[: together[0]] + steps[together[-1] + 1 :])
    assert len(steps) == 10  # b joined a's running batch and left it: a took no step more


def test_only_a_stateful_model_on_several_replicas_holds_back_a_sequences_first_answer(tmp_path: Path):
    pytest.importorskip("ray")
    from handlerkit.serving.ray import app

    stateful = model_dir(tmp_path, "stateful", PID_SUM, SEQUENCE_CONFIG)
    plain = model_dir(tmp_path, "plain", PID_SUM, "batchSize: 1\n")
    settle = {
        (path.name, replicas): app(path, num_replicas=replicas)._bound_deployment.init_args[4]["sequence_settle_s"]
        for path in (stateful, plain)
        for replicas in (1, 2)
    }
    assert settle == {("stateful", 1): 0.0, ("stateful", 2): ROUTING_SETTLE_S, ("plain", 1): 0.0, ("plain", 2): 0.0}


def test_sequence_headers_are_named_as_torchserves(tmp_path: Path):
    import handlerkit as hk

    context = hk.MockContext.from_model_dir(model_dir(tmp_path, "m", STREAMING_SUM, CONTINUOUS_CONFIG))
    assert (context.header_key_sequence_id, context.header_key_sequence_end) == (SEQ_ID, "ts_request_sequence_end")
