"""handlerkit.serving._sequences: a replica's sequences as TorchServe's frontend keeps them, and
Ray Serve's model multiplexing keeping each sequence on the replica that holds it (2 replicas,
a real local Ray instance on loopback)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from _stateful_handlers import CONTINUOUS_CONFIG, SEQUENCE_CONFIG, STREAMING_SUM, model_dir
from _ts_server import HOST, free_ports

from handlerkit.serving._http import Reply
from handlerkit.serving._sequences import ROUTING_HEADER, ROUTING_SETTLE_S, Admitted, SequenceDesk

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
    (port,) = free_ports(1)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
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
def test_continuous_batching_on_ray_answers_each_request_once(base):
    """Ray runs no continuous-batching loop: an odd number, which TorchServe streams for five
    more steps (six chunks), gets its first step's answer, whole, marked ``ts_stream_next: true``."""
    status, headers, body = _post(base, "/stream/predictions/stream", b"2", {})
    sequence_id = headers[SEQ_ID]
    assert (status, body) == (200, b"2") and sequence_id.startswith("ts-seq-")
    routed = {SEQ_ID: sequence_id, ROUTING_HEADER: sequence_id}
    status, headers, body = _post(base, "/stream/predictions/stream", b"3", routed)
    assert (status, body, headers["ts_stream_next"]) == (200, b"5", "true")
    assert "transfer-encoding" not in headers or headers["transfer-encoding"] != "chunked"
    status, headers, body = _post(base, "/stream/predictions/stream", b"0", routed)
    assert (status, body, headers["ts_request_sequence_end"]) == (200, b"5", sequence_id)


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
