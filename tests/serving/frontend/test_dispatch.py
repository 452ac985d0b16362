"""handlerkit.serving.frontend.dispatch: the dispatch strategies: sequences, continuous batching, an engine's own batching (pure Python, no engine;
the handlers and helpers are tests/_frontend.py's)."""

from __future__ import annotations

import asyncio
from typing import Any

from _frontend import PriceTagger, make_frontend, priced, run_async

import handlerkit as hk
from handlerkit.serving._http import Reply
from handlerkit.serving.frontend import ContinuousDispatch, HandleThread, Job, SequenceDispatch
from handlerkit.serving.frontend.sequence_desk import Admitted


def test_sequences_are_admitted_and_closed_by_the_answer_that_ends_them() -> None:
    class Ending(PriceTagger):
        def handle(self, data: list[Any], context: Any) -> list[Any]:
            for idx in range(len(data)):
                sequence = context.get_request_header(idx, "ts_request_sequence_id")
                context.set_response_header(idx, "ts_request_sequence_end", sequence)
            return super().handle(data, context)

    frontend, _ = make_frontend({"sequenceBatching": True, "batchSize": 1}, handler=Ending())
    assert isinstance(frontend.dispatch, SequenceDispatch) and frontend.desk is not None
    admitted = frontend.admit([])
    assert isinstance(admitted, Admitted) and admitted.opened and admitted.sequence_id in frontend.desk.open
    request = priced("seq", 7, **admitted.headers)
    reply = run_async(frontend.reply(request, Job(sequence_id=admitted.sequence_id)))
    assert reply.body == b"seq: $0.07" and admitted.sequence_id not in frontend.desk.open
    plain, _ = make_frontend()
    assert plain.admit([]) is None and plain.desk is None


def test_continuous_batching_streams_each_unfinished_step_and_calls_again() -> None:
    class Counter:
        """Counts down from the body: ``ts_stream_next: true`` until 0."""

        def handle(self, data: list[Any], context: Any) -> list[Any]:
            out = []
            for idx, row in enumerate(data):
                rid = context.get_request_id(idx)
                self.left[rid] = self.left.get(rid, row.get("body", 0) if isinstance(row, dict) else 0) - 1
                out.append(str(self.left[rid]))
            # As TorchServe's continuous-batching handlers: the worker asks, per answer, whether it is the last.
            context.stopping_criteria = [lambda answer: answer == "0" for _ in data]
            return out

        def __init__(self) -> None:
            self.left: dict[str, int] = {}

    frontend, _ = make_frontend({"sequenceBatching": True, "continuousBatching": True, "batchSize": 2}, handler=Counter())
    assert isinstance(frontend.dispatch, ContinuousDispatch)

    async def stream() -> list[bytes]:
        admitted = frontend.admit([])
        assert isinstance(admitted, Admitted)
        request = hk.Request.json(3).with_headers(admitted.headers)
        opened = await frontend.answer(request, Job(sequence_id=admitted.sequence_id))
        assert opened.reply is None and opened.body is not None
        return [chunk async for chunk in opened.body]

    assert run_async(stream()) == [b"2", b"1", b"0"]
    assert len(frontend.stats()["steps"]) == 3


def test_an_engine_brings_its_own_batching_strategy() -> None:
    class OneByOne:
        """Every request its own batch, at once (no queue)."""

        def __init__(self, thread: HandleThread) -> None:
            self.thread, self.seen = thread, 0

        async def submit(self, request: hk.Request, job: Job) -> Reply:
            self.seen += 1
            (reply,) = await self.thread.gather([request], job.envelope)
            return reply

        @property
        def pending(self) -> int:
            return 0

    frontend, tagger = make_frontend(base=OneByOne)

    async def two() -> list[Reply]:
        return await asyncio.gather(frontend.reply(priced("a", 1)), frontend.reply(priced("b", 2)))

    assert [r.body for r in run_async(two())] == [b"a: $0.01", b"b: $0.02"]
    assert tagger.sizes == [1, 1] and isinstance(frontend.dispatch, OneByOne) and frontend.dispatch.seen == 2
