"""handlerkit.serving.frontend.handle_thread: the one handle() thread: failures answered and logged once, responseTimeout, async handlers (pure Python, no engine;
the handlers and helpers are tests/_frontend.py's)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from _frontend import make_frontend, priced, run_async

from handlerkit.serving._http import WORKER_DIED, Reply
from handlerkit.serving.frontend import AsyncDispatch


def test_a_failed_batch_answers_every_request_as_torchserve_and_logs_its_stage_error_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    frontend, _ = make_frontend({"maxBatchDelay": 0})  # the requests are queued at once: no wait to fill

    async def two() -> list[Reply]:
        return await asyncio.gather(frontend.reply(priced("ok", 1)), frontend.reply(priced("bad", -1)))

    with caplog.at_level(logging.ERROR, logger="handlerkit.serving"):
        replies = run_async(two())
    assert [(r.status, json.loads(r.body)["message"], r.failed) for r in replies] == [
        (503, "Prediction failed", True)
    ] * 2
    [record] = [r for r in caplog.records if r.name == "handlerkit.serving"]
    assert record.getMessage().startswith('prices answered 503 "Prediction failed" to requests ')
    assert "ValueError: negative price for bad" in record.getMessage()
    assert run_async(frontend.reply(priced("next", 250))).body == b"next: $2.50"  # the handler keeps working


def test_a_batch_past_response_timeout_is_answered_worker_died_and_the_frontend_is_stuck(
    caplog: pytest.LogCaptureFixture,
) -> None:
    frontend, tagger = make_frontend({"batchSize": 1, "responseTimeout": 1})
    tagger.release.clear()  # the handler hangs until the test releases it
    try:
        with caplog.at_level(logging.ERROR, logger="handlerkit.serving"):
            assert run_async(frontend.reply(priced("slow", 1))) == WORKER_DIED
        assert frontend.stuck is not None and "ran past responseTimeout (1 s)" in frontend.stuck
        after = run_async(frontend.reply(priced("next", 1)))  # answered at once, not queued behind the stuck batch
        assert (after.status, json.loads(after.body)["type"]) == (503, "ServiceUnavailableException")
        assert 'prices answered 500 "Worker died."' in caplog.text and "handle failed in PriceTagger" in caplog.text
        assert "_frontend.py:31: self.release.wait()" in caplog.text  # where it hung
    finally:
        tagger.release.set()
        frontend.close()
    assert tagger.sizes == [1]  # the second request never reached the handler


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

    frontend, handler = make_frontend({"asyncCommunication": True}, handler=Awaiting())
    assert isinstance(frontend.dispatch, AsyncDispatch)

    async def three() -> list[Reply]:
        return await asyncio.gather(*(frontend.reply(priced(f"s{k}", k)) for k in range(3)))

    try:
        assert [r.body for r in run_async(three())] == [b"s0", b"s1", b"s2"]
    finally:
        frontend.service.close()
    assert handler.sizes == [1, 1, 1] and handler.most == 3
