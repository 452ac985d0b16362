"""handlerkit.serving.frontend: TorchServe's frontend without any engine (pure Python, a real
Service, asyncio for the serving loop).

The handlers here are a shop's price tagger (rows of ``{"sku", "cents"}`` in, a tag out), not
the fixtures': it records the size of every batch it is handed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Coroutine
from typing import Any

import pytest

import handlerkit as hk
from handlerkit.context import MockContext
from handlerkit.service import Service
from handlerkit.serving._http import WORKER_DIED, Reply
from handlerkit.serving._sequences import Admitted
from handlerkit.serving.frontend import (
    AsyncDispatch,
    BatchDispatch,
    ContinuousDispatch,
    Frontend,
    HandleThread,
    Job,
    SequenceDispatch,
    Settings,
    settings,
)
from handlerkit.streaming import send_intermediate_predict_response


class PriceTagger:
    """Tags each row ``{"sku", "cents"}`` with a price; a row with negative cents is a bug."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.release = threading.Event()
        self.release.set()

    def handle(self, data: list[Any], context: Any) -> list[Any]:
        self.sizes.append(len(data))
        self.release.wait()
        tags = []
        for row in data:
            item = row.get("body") if isinstance(row, dict) and "body" in row else row
            if context.get_request_header(0, "explain") == "True":
                tags.append({"why": item["sku"]})
                continue
            if item["cents"] < 0:
                raise ValueError(f"negative price for {item['sku']}")
            tags.append(f"{item['sku']}: ${item['cents'] / 100:.2f}")
        return tags


def _frontend(
    config: dict[str, Any] | None = None, *, handler: Any = None, envelopes: tuple[str, ...] = (), **kwargs: Any
) -> tuple[Frontend, Any]:
    handler = handler if handler is not None else PriceTagger()
    config = {"batchSize": 4, "maxBatchDelay": 20000, **(config or {})}
    service = Service(handler, MockContext(model_name="prices", model_yaml_config=config), working_dir=None)
    service.initialize()
    return Frontend(service, name="prices", settings=settings(config), envelopes=envelopes, **kwargs), handler


def _row(sku: str, cents: int, **headers: str) -> hk.Request:
    return hk.Request.json({"sku": sku, "cents": cents}).with_headers(headers)


def _run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coroutine)


def test_settings_read_the_model_config_with_torchserves_defaults() -> None:
    assert settings({}) == Settings(batch_size=1, max_batch_delay_s=0.1, response_timeout_s=120.0)
    assert settings({"batchSize": 8, "maxBatchDelay": 50, "responseTimeout": 3}) == Settings(8, 0.05, 3.0)


def test_concurrent_requests_share_one_batch_and_each_gets_its_own_answer() -> None:
    frontend, tagger = _frontend()
    assert isinstance(frontend.dispatch, BatchDispatch)

    async def four() -> list[Reply]:
        return await asyncio.gather(*(frontend.reply(_row(f"sku-{k}", 100 * k + 5)) for k in range(4)))

    replies = _run(four())
    assert tagger.sizes == [4]
    assert [r.body for r in replies] == [b"sku-0: $0.05", b"sku-1: $1.05", b"sku-2: $2.05", b"sku-3: $3.05"]
    assert frontend.stats()["batch_sizes"] == [4]


def test_predictions_and_explanations_never_share_a_batch() -> None:
    frontend, tagger = _frontend({"maxBatchDelay": 0})

    async def mixed() -> list[Reply]:
        jobs = [Job("predict"), Job("explain"), Job("predict"), Job("explain")]
        explain = ["False", "True", "False", "True"]
        return await asyncio.gather(
            *(frontend.reply(_row(f"s{k}", k, explain=e), job) for k, (job, e) in enumerate(zip(jobs, explain)))
        )

    replies = _run(mixed())
    assert sorted(tagger.sizes) == [2, 2]
    assert [json.loads(r.body) if r.body.startswith(b"{") else r.body for r in replies] == [
        b"s0: $0.00",
        {"why": "s1"},
        b"s2: $0.02",
        {"why": "s3"},
    ]


def test_a_failed_batch_answers_every_request_as_torchserve_and_logs_its_stage_error_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    frontend, _ = _frontend({"maxBatchDelay": 0})  # the requests are queued at once: no wait to fill

    async def two() -> list[Reply]:
        return await asyncio.gather(frontend.reply(_row("ok", 1)), frontend.reply(_row("bad", -1)))

    with caplog.at_level(logging.ERROR, logger="handlerkit.serving"):
        replies = _run(two())
    assert [(r.status, json.loads(r.body)["message"], r.failed) for r in replies] == [
        (503, "Prediction failed", True)
    ] * 2
    [record] = [r for r in caplog.records if r.name == "handlerkit.serving"]
    assert record.getMessage().startswith('prices answered 503 "Prediction failed" to requests ')
    assert "ValueError: negative price for bad" in record.getMessage()
    assert _run(frontend.reply(_row("next", 250))).body == b"next: $2.50"  # the handler keeps working


def test_a_batch_past_response_timeout_is_answered_worker_died_and_the_frontend_is_stuck(
    caplog: pytest.LogCaptureFixture,
) -> None:
    frontend, tagger = _frontend({"batchSize": 1, "responseTimeout": 1})
    tagger.release.clear()  # the handler hangs until the test releases it
    try:
        with caplog.at_level(logging.ERROR, logger="handlerkit.serving"):
            assert _run(frontend.reply(_row("slow", 1))) == WORKER_DIED
        assert frontend.stuck is not None and "ran past responseTimeout (1 s)" in frontend.stuck
        after = _run(frontend.reply(_row("next", 1)))  # answered at once, not queued behind the stuck batch
        assert (after.status, json.loads(after.body)["type"]) == (503, "ServiceUnavailableException")
        assert 'prices answered 500 "Worker died."' in caplog.text and "handle failed in PriceTagger" in caplog.text
        assert "test_serving_frontend.py:48: self.release.wait()" in caplog.text  # where it hung
    finally:
        tagger.release.set()
        frontend.close()
    assert tagger.sizes == [1]  # the second request never reached the handler


def test_requests_through_an_envelope_share_a_batch_each_read_and_answered_by_its_own() -> None:
    frontend, tagger = _frontend({"maxBatchDelay": 0}, envelopes=("kserve",))
    body = [{"sku": "a", "cents": 1}], [{"sku": "b", "cents": 2}, {"sku": "c", "cents": 3}], [{"sku": "d", "cents": 4}]

    async def three() -> list[Reply]:
        return await asyncio.gather(
            *(frontend.reply(hk.Request.json({"instances": b}), Job("predict", "kserve")) for b in body)
        )

    replies = _run(three())
    assert tagger.sizes == [4]  # the four instances of three requests, in one call
    assert [json.loads(r.body) for r in replies] == [
        {"predictions": ["a: $0.01"]},
        {"predictions": ["b: $0.02", "c: $0.03"]},
        {"predictions": ["d: $0.04"]},
    ]


def test_a_request_its_envelope_cannot_read_is_named_by_its_place_in_the_batch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    frontend, tagger = _frontend({"maxBatchDelay": 0}, envelopes=("kserve",))

    async def two() -> list[Reply]:
        good = hk.Request.json({"instances": [{"sku": "a", "cents": 1}]})
        return await asyncio.gather(
            *(frontend.reply(r, Job("predict", "kserve")) for r in (good, hk.Request.json({"rows": []})))
        )

    with caplog.at_level(logging.ERROR, logger="handlerkit.serving"):
        replies = _run(two())
    assert [r.status for r in replies] == [400, 400] and tagger.sizes == []
    assert json.loads(replies[1].body)["message"].startswith(
        "request 1: the kserve body has no 'instances': keys ['rows']"
    )


def test_sequences_are_admitted_and_closed_by_the_answer_that_ends_them() -> None:
    class Ending(PriceTagger):
        def handle(self, data: list[Any], context: Any) -> list[Any]:
            for idx in range(len(data)):
                sequence = context.get_request_header(idx, "ts_request_sequence_id")
                context.set_response_header(idx, "ts_request_sequence_end", sequence)
            return super().handle(data, context)

    frontend, _ = _frontend({"sequenceBatching": True, "batchSize": 1}, handler=Ending())
    assert isinstance(frontend.dispatch, SequenceDispatch) and frontend.desk is not None
    admitted = frontend.admit([])
    assert isinstance(admitted, Admitted) and admitted.opened and admitted.sequence_id in frontend.desk.open
    request = _row("seq", 7, **admitted.headers)
    reply = _run(frontend.reply(request, Job(sequence_id=admitted.sequence_id)))
    assert reply.body == b"seq: $0.07" and admitted.sequence_id not in frontend.desk.open
    plain, _ = _frontend()
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

    frontend, _ = _frontend({"sequenceBatching": True, "continuousBatching": True, "batchSize": 2}, handler=Counter())
    assert isinstance(frontend.dispatch, ContinuousDispatch)

    async def stream() -> list[bytes]:
        admitted = frontend.admit([])
        assert isinstance(admitted, Admitted)
        request = hk.Request.json(3).with_headers(admitted.headers)
        opened = await frontend.answer(request, Job(sequence_id=admitted.sequence_id))
        assert opened.reply is None and opened.body is not None
        return [chunk async for chunk in opened.body]

    assert _run(stream()) == [b"2", b"1", b"0"]
    assert len(frontend.stats()["steps"]) == 3


def test_a_handlers_intermediate_sends_stream_to_its_client() -> None:
    class Spelling:
        def handle(self, data: list[Any], context: Any) -> list[Any]:
            word = data[0]["body"]
            for letter in word:
                send_intermediate_predict_response([letter], {0: context.get_request_id(0)}, "ok", 200, context)
            return ["!"]

    frontend, _ = _frontend({"batchSize": 1}, handler=Spelling())

    async def spell() -> tuple[list[bytes], Reply]:
        opened = await frontend.answer(hk.Request.text("tag"))
        assert opened.body is not None
        chunks = [chunk async for chunk in opened.body]
        whole = await frontend.reply(hk.Request.text("no"))  # reply(): the sends reach no client
        return chunks, whole

    chunks, whole = _run(spell())
    assert chunks == [b"t", b"a", b"g", b"!"] and whole.body == b"!"
    assert frontend.router.dropped == 2


def test_an_async_handler_runs_each_request_as_its_own_batch_concurrently() -> None:
    class Awaiting:
        def __init__(self) -> None:
            self.sizes: list[int] = []
            self.inside = 0
            self.most = 0

        async def handle(self, data: list[Any], context: Any) -> list[Any]:
            self.sizes.append(len(data))
            self.inside += 1
            self.most = max(self.most, self.inside)
            await asyncio.sleep(0.05)  # the others start meanwhile
            self.inside -= 1
            return [data[0]["body"]["sku"]]

    frontend, handler = _frontend({"asyncCommunication": True}, handler=Awaiting())
    assert isinstance(frontend.dispatch, AsyncDispatch)

    async def three() -> list[Reply]:
        return await asyncio.gather(*(frontend.reply(_row(f"s{k}", k)) for k in range(3)))

    try:
        assert [r.body for r in _run(three())] == [b"s0", b"s1", b"s2"]
    finally:
        frontend.service.close()
    assert handler.sizes == [1, 1, 1] and handler.most == 3


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

    frontend, tagger = _frontend(base=OneByOne)

    async def two() -> list[Reply]:
        return await asyncio.gather(frontend.reply(_row("a", 1)), frontend.reply(_row("b", 2)))

    assert [r.body for r in _run(two())] == [b"a: $0.01", b"b: $0.02"]
    assert tagger.sizes == [1, 1] and isinstance(frontend.dispatch, OneByOne) and frontend.dispatch.seen == 2
