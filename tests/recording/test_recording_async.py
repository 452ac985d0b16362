"""handlerkit.recording with async handlers: a stage that is a coroutine function (TorchServe's
``vllm_handler.py`` awaits ``preprocess``, ``inference`` and ``postprocess`` in ``async def
handle``) is recorded with what its await gives, the time the await took and what it warned;
stepped by hand, it is awaited on the service's worker loop, with the context when it asks for it."""

from __future__ import annotations

import asyncio
import warnings

import pytest
from _async_handlers import VLLM_STYLE, prompt, reversed_words, write_model_dir

import handlerkit as hk
from handlerkit.errors import StageError
from handlerkit.recording.spy import spy_on, takes_context


@pytest.fixture
def vllm(tmp_path):
    h = hk.Harness.open(write_model_dir(tmp_path, VLLM_STYLE))
    yield h
    h.service.close()


def _prompt(text, **options):
    return hk.batch(hk.Request.from_bytes(prompt(text, **options)))


def test_a_run_records_each_awaited_stage_with_its_result_and_time(vllm):
    run = vllm.run(_prompt("three words here"))
    answer = {"text": reversed_words("three words here"), "tokens": 3, "at_once": 1}
    assert run.output == [answer]
    stages = run.stages
    assert list(stages) == ["initialize", "preprocess", "inference", "postprocess"]
    assert stages["preprocess"].output == [{"prompt": "three words here", "stream": False, "max_tokens": 16}]
    assert stages["inference"].input == stages["preprocess"].output
    assert stages["inference"].output == [answer] and stages["postprocess"].output == [answer]
    # the engine sleeps 10 ms per word: the await's time, not the ~0 ms of making the coroutine
    assert stages["inference"].wall_ms >= 27
    assert stages["preprocess"].wall_ms < stages["inference"].wall_ms
    assert all(s.ok for s in stages.values())


def test_a_failing_awaited_stage_is_the_stage_that_failed(vllm):
    with pytest.raises(StageError, match=r"inference failed in TinyVLLMHandler for request 0: ValueError: the engine"):
        vllm.run(_prompt("fail"))
    assert vllm.results["inference"].error is not None
    assert vllm.results["preprocess"].ok
    assert vllm.run(_prompt("fine again")).output[0]["text"] == reversed_words("fine again")  # still usable


def test_stepping_async_stages_by_hand_awaits_them_on_the_worker_loop(vllm):
    vllm.initialize()
    pre = vllm.preprocess(_prompt("by hand now"))  # preprocess(requests, context): given the context
    assert pre.output == [{"prompt": "by hand now", "stream": False, "max_tokens": 16}]
    # the stand-in engine refuses any loop but the one initialize started it on: the worker loop's
    inference = vllm.inference()
    assert inference.output == [{"text": reversed_words("by hand now"), "tokens": 3, "at_once": 1}]
    assert inference.wall_ms >= 27
    assert vllm.postprocess().output == inference.output

    async def notebook_cell():  # a notebook's own loop runs in this thread
        return vllm.inference([{"prompt": "inside a cell"}]).output

    assert asyncio.run(notebook_cell())[0]["text"] == reversed_words("inside a cell")


class AsyncStages:
    """Async stages that warn, log and fail per request, awaited by an async handle."""

    def initialize(self, context):
        self.initialized = True

    async def handle(self, data, context):
        return await self.postprocess(await self.inference(await self.preprocess(data)))

    async def preprocess(self, data):
        if any("n" not in row["body"] for row in data):
            raise ValueError("a request without n")
        await asyncio.sleep(0.01)
        warnings.warn("a slow tokenizer", UserWarning, stacklevel=1)
        return [row["body"]["n"] for row in data]

    async def inference(self, x):
        await asyncio.sleep(0.02)
        return [v * 2 for v in x]

    async def postprocess(self, y):
        return y


def _async_harness():
    return hk.Harness(AsyncStages, hk.MockContext(gpu_id=None, model_yaml_config={"asyncCommunication": True}))


def test_what_an_awaited_stage_warns_is_that_stages():
    h = _async_harness()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run = h.run([{"body": {"n": 1}}, {"body": {"n": 2}}])
        assert run.output == [2, 4]
        assert [str(w.message) for w in run.stages["preprocess"].warnings] == ["a slow tokenizer"]
        assert run.stages["inference"].warnings == [] and run.stages["inference"].wall_ms >= 18
    finally:
        h.service.close()


def test_an_async_preprocess_failing_for_one_request_is_not_run_alone_unawaited():
    """Failure attribution runs a synchronous preprocess on each request alone; an async one is
    not awaited there, so it tells nothing (a coroutine made is no request passing alone)."""
    h = _async_harness()
    try:
        with pytest.raises(StageError, match=r"failed in AsyncStages for the batch: ValueError: a request without n") as e:
            h.run([{"body": {"n": 1}}, {"body": {}}])
        assert "passes preprocess alone" not in (e.value.fix or "")
    finally:
        h.service.close()


def test_takes_context_reads_the_stage_a_spied_method_passes_calls_on_to():
    class Stages:
        def preprocess(self, requests, context):
            return requests

        async def inference(self, batch, context=None):
            return batch

        def postprocess(self, data):
            return data

    handler = Stages()
    assert spy_on(handler)
    assert takes_context(handler.preprocess)  # the spied method's own signature is (*args, **kwargs)
    assert not takes_context(handler.inference)  # an optional context is left to its default
    assert not takes_context(handler.postprocess)
    assert not takes_context(len)
