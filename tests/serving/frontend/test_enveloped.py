"""handlerkit.serving.frontend.enveloped: requests through a service envelope: a shared batch, each read and answered by its own (pure Python, no engine;
the handlers and helpers are tests/_frontend.py's)."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from _frontend import make_frontend, run_async

import handlerkit as hk
from handlerkit.serving._http import Reply
from handlerkit.serving.frontend import Job


def test_requests_through_an_envelope_share_a_batch_each_read_and_answered_by_its_own() -> None:
    frontend, tagger = make_frontend({"maxBatchDelay": 0}, envelopes=("kserve",))
    body = [{"sku": "a", "cents": 1}], [{"sku": "b", "cents": 2}, {"sku": "c", "cents": 3}], [{"sku": "d", "cents": 4}]

    async def three() -> list[Reply]:
        return await asyncio.gather(
            *(frontend.reply(hk.Request.json({"instances": b}), Job("predict", "kserve")) for b in body)
        )

    replies = run_async(three())
    assert tagger.sizes == [4]  # the four instances of three requests, in one call
    assert [json.loads(r.body) for r in replies] == [
        {"predictions": ["a: $0.01"]},
        {"predictions": ["b: $0.02", "c: $0.03"]},
        {"predictions": ["d: $0.04"]},
    ]


def test_a_request_its_envelope_cannot_read_is_named_by_its_place_in_the_batch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    frontend, tagger = make_frontend({"maxBatchDelay": 0}, envelopes=("kserve",))

    async def two() -> list[Reply]:
        good = hk.Request.json({"instances": [{"sku": "a", "cents": 1}]})
        return await asyncio.gather(
            *(frontend.reply(r, Job("predict", "kserve")) for r in (good, hk.Request.json({"rows": []})))
        )

    with caplog.at_level(logging.ERROR, logger="handlerkit.serving"):
        replies = run_async(two())
    assert [r.status for r in replies] == [400, 400] and tagger.sizes == []
    assert json.loads(replies[1].body)["message"].startswith(
        "request 1: the kserve body has no 'instances': keys ['rows']"
    )
