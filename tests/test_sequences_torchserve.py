"""hk.Sequences against TorchServe 0.12's own worker code.

The same stateful handler file runs under hk.Sequences and under TorchServe's worker
(``ts.model_loader`` loading the model dir, ``ts.service.Service.predict`` answering each
batch). On TorchServe's side a small frontend, written here from ``SequenceContinuousBatching``
/ ``ContinuousBatching.java`` and independent of handlerkit's, forms each batch (requests still
running first, then at most one new request per sequence, up to ``2 * batchSize``), re-sends a
running request without parameters, and decides who stays from the worker's own final frame
(``ts_stream_next: "true"``) and which sequences end (``ts_request_sequence_end``). Both sides
get the same requests at the same steps; every step's batch and every request's answer, status
and headers must agree.
"""

from __future__ import annotations

import dataclasses
import json
from collections import deque
from pathlib import Path

import pytest
from _stateful_handlers import CONTINUOUS_CONFIG, SEQUENCE_CONFIG, SEQUENCE_SUM, STREAMING_SUM, model_dir

import handlerkit as hk
from conftest import ts_imports, ts_metrics_cache
from handlerkit.sequences import Sequence
from handlerkit.worker.streaming import ChunkSocket, decode_frame

pytestmark = pytest.mark.torchserve

END = "ts_request_sequence_end"

#: When each request arrives (before which step), in which sequence (a letter), with what body.
SCRIPT = {
    0: [("a", 2), ("b", 4)],
    1: [("a", 3), ("b", 6)],  # a's 3 streams for five more steps
    2: [("c", 1)],  # joins the running batch
    3: [("c", 5), ("b", 0)],  # b ends
    4: [("c", -1)],  # c cancelled: its stream stops
    6: [("a", 8)],
}


def _harness_side(root: Path, handler: str, config: str, continuous: bool):
    seqs = hk.Sequences(hk.Harness.open(model_dir(root / "hk", "stateful", handler, config)))
    assert seqs.continuous is continuous
    opened: dict[str, Sequence] = {}
    arrivals: dict[int, list[tuple[str, hk.Request]]] = {}
    for index in range(40):
        for name, body in SCRIPT.get(index, []):
            request = hk.Request.text(str(body))
            if name in opened:
                job = opened[name].send(request)
            else:
                opened[name] = seqs.start(request)
                job = opened[name].jobs[0]
            arrivals.setdefault(index, []).append((job.sequence_id, job.request))
        if seqs.step() is None and index > max(SCRIPT):
            break
    return seqs, arrivals


def _torchserve_side(root: Path, handler: str, config: str, arrivals, continuous: bool, batch_size: int = 4):
    """TorchServe's worker answering the batches a frontend written from the Java forms."""
    from ts.model_loader import TsModelLoader

    path = model_dir(root / "ts", "stateful", handler, config)
    queues: dict[str, deque[hk.Request]] = {}
    running: list[hk.Request] = []
    steps = []
    with ts_imports(path):
        service = TsModelLoader().load(
            path.name, str(path), handler="handler.py", gpu_id=None, batch_size=batch_size,
            metrics_cache=ts_metrics_cache(path.name),
        )
        service.set_cl_socket(ChunkSocket())
        for index in range(40):
            for sequence_id, request in arrivals.get(index, []):
                queues.setdefault(sequence_id, deque()).append(request)
            capacity = 2 * batch_size if continuous else batch_size
            joining = []
            for queue in queues.values():
                if queue and len(running) + len(joining) < capacity:
                    joining.append(queue.popleft())
            batch = [dataclasses.replace(r, parameters=()) for r in running] + joining
            if not batch:
                if index > max(arrivals):
                    break
                continue
            code, _, parts = decode_frame(bytes(service.predict(hk.Batch(batch).to_worker_message())))
            assert code == 200
            steps.append(parts)
            running = [r for r, part in zip(batch, parts, strict=True) if part[4].get("ts_stream_next") == "true"]
            for part in parts:
                for ended in filter(None, part[4].get(END, "").split(";")):
                    queues.pop(ended.strip(), None)  # queued requests of an ended sequence are dropped
    return steps


def _answer_bytes(item) -> bytes:
    return item.encode("utf-8") if isinstance(item, str) else json.dumps(item, indent=2).encode("utf-8")


@pytest.mark.parametrize(
    ("handler", "config", "continuous"),
    [(STREAMING_SUM, CONTINUOUS_CONFIG, True), (SEQUENCE_SUM, SEQUENCE_CONFIG, False)],
    ids=["sequence_continuous_batching", "sequence_batching"],
)
def test_steps_batches_and_answers_are_torchserves(tmp_path, handler, config, continuous):
    seqs, arrivals = _harness_side(tmp_path, handler, config, continuous)
    theirs = _torchserve_side(tmp_path, handler, config, arrivals, continuous)
    ours = [
        [(rid, 200, "", headers, _answer_bytes(answer)) for rid, headers, answer in zip(s.request_ids, s.headers, s.answers, strict=True)]
        for s in seqs.steps
    ]
    assert ours == [[(p[0], p[2], p[3], p[4], p[5]) for p in parts] for parts in theirs]
    if continuous:  # the script exercised what it means to: streams, joins, an end, a cancel
        assert max(len(s.continued) for s in seqs.steps) >= 1 and any(s.joined and s.continued for s in seqs.steps)
        assert any(s.ended for s in seqs.steps) and len(seqs.steps) >= 7
        assert any(job.state == "done" and len(job.steps) == 6 for job in seqs.jobs)


def test_chunks_sent_before_each_answer_are_kept_across_steps(tmp_path):
    """A streaming handler under continuous batching: its chunks and answers are those TorchServe's worker sends."""
    handler = '''\
from ts.handler_utils.utils import send_intermediate_predict_response


def handle(data, context):
    if data is None:
        return None
    context.cache = getattr(context, "cache", {})
    for idx in range(len(data)):
        rid = context.get_request_id(idx)
        context.cache[rid] = context.cache.get(rid, 0) + 1
    send_intermediate_predict_response(
        [f"tick {context.cache[context.get_request_id(i)]}" for i in range(len(data))],
        context.request_ids, "tick", 200, context,
    )
    counts = [context.cache[context.get_request_id(i)] for i in range(len(data))]
    context.stopping_criteria = [lambda answer, n=n: n >= 2 for n in counts]
    return [f"answer {n}" for n in counts]
'''
    seqs = hk.Sequences(hk.Harness.open(model_dir(tmp_path / "hk", "ticks", handler, CONTINUOUS_CONFIG)))
    job = seqs.start(hk.Request.text("1")).jobs[0]
    steps = seqs.run()
    assert [c.text for c in job.chunks] == ["tick 1", "tick 2"] and job.answers == ["answer 1", "answer 2"]
    assert [len(s.request_ids) for s in steps] == [1, 1]
    theirs = _torchserve_side(tmp_path, handler, CONTINUOUS_CONFIG, {0: [(job.sequence_id, job.request)]}, True)
    assert [[(p[0], p[4], p[5]) for p in parts] for parts in theirs] == [
        [(job.request_id, headers, answer.encode())] for headers, answer in zip([s.headers[0] for s in steps], job.answers, strict=True)
    ]
