"""handlerkit.serving.frontend.continuous: the replica's continuous-batching loop, engine-free (a
stand-in handler answers each step; no Ray)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import pytest

import handlerkit as hk
from handlerkit.serving._http import Reply, worker_error
from handlerkit.serving.frontend.continuous import ContinuousLoop
from handlerkit.serving.frontend.sequence_desk import SequenceDesk

SEQ_ID, SEQ_END = "ts_request_sequence_id", "ts_request_sequence_end"


class Countdown:
    """A stand-in worker: a request's body ``n`` runs ``n`` steps, answering ``"<body>:<step>"``
    with ``ts_stream_next: true`` until its last; ``0`` ends its sequence. ``arrivals[i]`` are
    called while step ``i`` runs (requests sent meanwhile)."""

    def __init__(self, arrivals: Mapping[int, Callable[[], None]] | None = None, fail_at: int | None = None) -> None:
        self.arrivals = dict(arrivals or {})
        self.fail_at = fail_at
        self.batches: list[list[hk.Request]] = []
        self.left: dict[str, int] = {}
        self.streamed: list[tuple[str, bytes]] = []

    async def run(self, batch: list[hk.Request]) -> list[Reply]:
        index = len(self.batches)
        self.batches.append(batch)
        if index in self.arrivals:
            self.arrivals[index]()
        await asyncio.sleep(0)
        if index == self.fail_at:
            return [worker_error(503, "Prediction failed")] * len(batch)
        replies = []
        for request in batch:
            rid = request.request_id
            if rid not in self.left:  # the first time: its parameters hold the body
                self.left[rid] = int(bytes(request.parameters[0].value))
            body = int(bytes(request.parameters[0].value)) if request.parameters else None
            headers = {"content-type": "text/plain", SEQ_ID: request.headers[SEQ_ID]}
            if body == 0:
                headers[SEQ_END] = request.headers[SEQ_ID]
            self.left[rid] -= 1
            headers["ts_stream_next"] = "true" if self.left[rid] > 0 else "false"
            replies.append(Reply(200, None, headers, f"{rid}:{len(self.batches)}".encode()))
        return replies

    def stream(self, request_id: str, reply: Reply) -> None:
        self.streamed.append((request_id, reply.body))


def request(body: int, sequence: str) -> hk.Request:
    return hk.Request.text(str(body)).with_headers({SEQ_ID: sequence})


def new_loop(worker: Countdown, batch_size: int = 1, desk: SequenceDesk | None = None) -> ContinuousLoop:
    ended = desk.answered if desk is not None else (lambda headers: [])
    return ContinuousLoop(worker.run, worker.stream, ended, batch_size=batch_size)


def test_an_unfinished_request_streams_each_step_and_stays_until_its_last():
    async def scenario() -> tuple[Reply, Countdown, ContinuousLoop]:
        worker = Countdown()
        loop = new_loop(worker)
        first = request(3, "a")
        reply = await loop.submit(first, "a")
        return reply, worker, loop

    reply, worker, loop = asyncio.run(scenario())
    (rid,) = {r.request_id for batch in worker.batches for r in batch}
    assert worker.streamed == [(rid, f"{rid}:1".encode()), (rid, f"{rid}:2".encode())]
    assert reply.body == f"{rid}:3".encode() and reply.headers["ts_stream_next"] == "false"
    assert loop.steps == [[rid]] * 3
    # called again as the frontend re-sends it: same id and headers, no parameters
    assert [len(batch[0].parameters) for batch in worker.batches] == [1, 0, 0]
    assert {batch[0].headers[SEQ_ID] for batch in worker.batches} == {"a"}


def test_a_request_sent_while_another_streams_joins_the_running_batch():
    answers: dict[str, asyncio.Future[Reply]] = {}

    async def scenario() -> ContinuousLoop:
        worker = Countdown(arrivals={1: lambda: answers.setdefault("b", loop.submit(second, "b"))})
        loop = new_loop(worker)
        answers["a"] = loop.submit(first, "a")
        await asyncio.gather(*answers.values())
        await answers["b"]
        return loop

    first, second = request(4, "a"), request(2, "b")
    loop = asyncio.run(scenario())
    a, b = first.request_id, second.request_id
    assert loop.steps == [[a], [a], [a, b], [a, b]]  # b joins between steps, behind the running a
    assert answers["a"].result().headers["ts_stream_next"] == answers["b"].result().headers["ts_stream_next"] == "false"


def test_one_new_request_per_sequence_per_step_up_to_twice_the_batch_size():
    async def scenario() -> ContinuousLoop:
        loop = new_loop(Countdown(), batch_size=1)
        futures = [loop.submit(r, seq) for r, seq in sent]
        await asyncio.gather(*futures)
        return loop

    sent = [(request(1, "a"), "a"), (request(1, "a"), "a"), (request(1, "b"), "b"), (request(1, "c"), "c")]
    loop = asyncio.run(scenario())
    ids = [r.request_id for r, _ in sent]
    assert loop.steps == [[ids[0], ids[2]], [ids[1], ids[3]]]  # capacity 2 = 2 x batchSize 1


def test_a_sequence_ended_by_the_handler_drops_its_queued_requests_with_503():
    desk = SequenceDesk("m")

    async def scenario() -> list[Reply]:
        loop = new_loop(Countdown(), batch_size=2, desk=desk)
        desk.open["a"] = 0.0
        futures = [loop.submit(request(0, "a"), "a"), loop.submit(request(1, "a"), "a")]
        return list(await asyncio.gather(*futures))

    ended, dropped = asyncio.run(scenario())
    assert (ended.status, ended.headers[SEQ_END]) == (200, "a") and "a" not in desk.open
    assert dropped.status == 503
    assert b"sequence a ended before this request ran" in dropped.body and b"send it again" in dropped.body


def test_a_failed_step_ends_every_request_in_it():
    async def scenario() -> list[Reply]:
        loop = new_loop(Countdown(fail_at=1), batch_size=2)
        return list(await asyncio.gather(loop.submit(request(5, "a"), "a"), loop.submit(request(5, "b"), "b")))

    replies = asyncio.run(scenario())
    assert [(r.status, r.failed) for r in replies] == [(503, True), (503, True)]


def test_a_client_that_went_away_leaves_at_the_next_step():
    async def scenario() -> tuple[ContinuousLoop, str, str]:
        worker = Countdown(arrivals={1: lambda: gone.cancel()})
        loop = new_loop(worker, batch_size=2)
        gone = loop.submit(leaving, "a")
        await loop.submit(staying, "b")
        return loop, leaving.request_id, staying.request_id

    leaving, staying = request(9, "a"), request(4, "b")
    loop, a, b = asyncio.run(scenario())
    assert loop.steps == [[a, b], [a, b], [b], [b]]


def test_a_loop_that_breaks_answers_its_requests_503_and_says_why(caplog: pytest.LogCaptureFixture):
    async def broken(batch: list[Any]) -> list[Reply]:
        raise RuntimeError("stand-in failure")

    async def scenario() -> Reply:
        return await ContinuousLoop(broken, lambda rid, reply: None, lambda h: [], batch_size=1).submit(
            request(1, "a"), "a"
        )

    reply = asyncio.run(scenario())
    assert reply.status == 503 and b"RuntimeError: stand-in failure" in reply.body
    assert "the continuous-batching loop stopped" in caplog.text
