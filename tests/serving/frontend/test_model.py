"""handlerkit.serving.frontend.model: the Frontend: settings, batches formed, answers and streams (pure Python, no engine;
the handlers and helpers are tests/_frontend.py's)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from _frontend import make_frontend, priced, run_async

import handlerkit as hk
from handlerkit.serving._http import Reply
from handlerkit.serving.frontend import BatchDispatch, Job, Settings, settings
from handlerkit.worker.streaming import send_intermediate_predict_response


def test_settings_read_the_model_config_with_torchserves_defaults() -> None:
    assert settings({}) == Settings(batch_size=1, max_batch_delay_s=0.1, response_timeout_s=120.0)
    assert settings({"batchSize": 8, "maxBatchDelay": 50, "responseTimeout": 3}) == Settings(8, 0.05, 3.0)


def test_concurrent_requests_share_one_batch_and_each_gets_its_own_answer() -> None:
    frontend, tagger = make_frontend()
    assert isinstance(frontend.dispatch, BatchDispatch)

    async def four() -> list[Reply]:
        return await asyncio.gather(*(frontend.reply(priced(f"sku-{k}", 100 * k + 5)) for k in range(4)))

    replies = run_async(four())
    assert tagger.sizes == [4]
    assert [r.body for r in replies] == [b"sku-0: $0.05", b"sku-1: $1.05", b"sku-2: $2.05", b"sku-3: $3.05"]
    assert frontend.stats()["batch_sizes"] == [4]


def test_predictions_and_explanations_never_share_a_batch() -> None:
    frontend, tagger = make_frontend({"maxBatchDelay": 0})

    async def mixed() -> list[Reply]:
        jobs = [Job("predict"), Job("explain"), Job("predict"), Job("explain")]
        explain = ["False", "True", "False", "True"]
        return await asyncio.gather(
            *(frontend.reply(priced(f"s{k}", k, explain=e), job) for k, (job, e) in enumerate(zip(jobs, explain)))
        )

    replies = run_async(mixed())
    assert sorted(tagger.sizes) == [2, 2]
    assert [json.loads(r.body) if r.body.startswith(b"{") else r.body for r in replies] == [
        b"s0: $0.00",
        {"why": "s1"},
        b"s2: $0.02",
        {"why": "s3"},
    ]


def test_a_handlers_intermediate_sends_stream_to_its_client() -> None:
    class Spelling:
        def handle(self, data: list[Any], context: Any) -> list[Any]:
            word = data[0]["body"]
            for letter in word:
                send_intermediate_predict_response([letter], {0: context.get_request_id(0)}, "ok", 200, context)
            return ["!"]

    frontend, _ = make_frontend({"batchSize": 1}, handler=Spelling())

    async def spell() -> tuple[list[bytes], Reply]:
        opened = await frontend.answer(hk.Request.text("tag"))
        assert opened.body is not None
        chunks = [chunk async for chunk in opened.body]
        whole = await frontend.reply(hk.Request.text("no"))  # reply(): the sends reach no client
        return chunks, whole

    chunks, whole = run_async(spell())
    assert chunks == [b"t", b"a", b"g", b"!"] and whole.body == b"!"
    assert frontend.router.dropped == 2
