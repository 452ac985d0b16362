"""Async handlers for the tests of TorchServe's ``asyncCommunication: true`` (test_async_worker.py,
test_service.py, cli/test_run.py, test_serving_ray_async.py): model dirs written on demand.

``VLLM_STYLE`` is shaped as TorchServe 0.12's ``ts/torch_handler/vllm_handler.py``: its
``initialize`` starts an engine with ``asyncio.get_event_loop().run_until_complete(...)`` and its
``async def handle`` awaits ``preprocess``, ``inference`` and ``postprocess``, which are coroutines
too; a streaming request sends each token with ``send_intermediate_predict_response`` before the
final answer. Its engine is a stand-in for vLLM's ``AsyncLLMEngine`` in a few lines: bound to the
loop it started on (it refuses to run on another, as an engine holding loop-bound queues fails),
it "generates" a prompt's words reversed, one per step, yielding to the loop between steps.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

ENGINE = '''
import asyncio


class TinyEngine:
    """A stand-in for vLLM's AsyncLLMEngine: started on one event loop, usable only there."""

    def __init__(self):
        self.loop = None
        self.running = 0  # requests generating right now (several at once on one loop)
        self.most_at_once = 0

    async def start(self):
        self.loop = asyncio.get_running_loop()
        return {"max_model_len": 64}

    async def generate(self, prompt, max_tokens):
        if asyncio.get_running_loop() is not self.loop:
            raise RuntimeError("TinyEngine used on another event loop than the one it started on")
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            for word in prompt.split()[:max_tokens]:
                await asyncio.sleep(0.01)
                yield word[::-1]
        finally:
            self.running -= 1
'''

VLLM_STYLE = """
import asyncio
import json

from engine import TinyEngine


class TinyVLLMHandler:
    def __init__(self):
        self.engine = None
        self.model_config = None
        self.initialized = False

    def initialize(self, ctx):
        self.engine = TinyEngine()
        loop = asyncio.get_event_loop()
        self.model_config = loop.run_until_complete(self.engine.start())
        self.initialized = True

    async def handle(self, data, context):
        prompts = await self.preprocess(data, context)
        output = await self.inference(prompts, context)
        return await self.postprocess(output)

    async def preprocess(self, requests, context):
        assert len(requests) == 1, "Expecting batch_size = 1"
        data = requests[0].get("data") or requests[0].get("body")
        if isinstance(data, (bytes, bytearray)):
            data = json.loads(data.decode("utf-8"))
        return [data]

    async def inference(self, input_batch, context):
        request = input_batch[0]
        if request.get("prompt") == "fail":
            raise ValueError("the engine refused the prompt")
        tokens = []
        async for token in self.engine.generate(request["prompt"], request.get("max_tokens", 16)):
            tokens.append(token)
            if request.get("stream"):
                from ts.handler_utils.utils import send_intermediate_predict_response

                send_intermediate_predict_response([token], context.request_ids, "Result", 200, context)
        return [{"text": " ".join(tokens), "tokens": len(tokens), "at_once": self.engine.most_at_once}]

    async def postprocess(self, inference_outputs):
        return inference_outputs
"""

SYNC_HANDLER = """
class SyncHandler:
    def initialize(self, context):
        pass

    def handle(self, data, context):
        return ["sync" for _ in data]
"""

UNAWAITED = """
class ForgetfulHandler:
    def initialize(self, context):
        pass

    async def handle(self, data, context):
        return [self.generate(row) for row in data]  # no await

    async def generate(self, row):
        return "never"
"""


def write_model_dir(root: Path, source: str, *, name: str = "tiny_llm", asynchronous: bool = True) -> Path:
    """A model dir: ``handler.py`` holding ``source``, ``engine.py`` (the stand-in engine), a manifest naming it, and a
    ``model-config.yaml`` with ``asyncCommunication`` as asked."""
    directory = root / name
    (directory / "MAR-INF").mkdir(parents=True)
    (directory / "handler.py").write_text(textwrap.dedent(source), encoding="utf-8")
    (directory / "engine.py").write_text(textwrap.dedent(ENGINE), encoding="utf-8")
    config = "minWorkers: 1\nmaxWorkers: 1\n" + ("asyncCommunication: true\n" if asynchronous else "")
    (directory / "model-config.yaml").write_text(config, encoding="utf-8")
    manifest = {
        "createdOn": "01/01/2026 00:00:00",
        "runtime": "python",
        "model": {"modelName": name, "handler": "handler.py", "modelVersion": "1.0", "configFile": "model-config.yaml"},
        "archiverVersion": "0.12.0",
    }
    (directory / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest), encoding="utf-8")
    return directory


def prompt(text: str, *, stream: bool = False, max_tokens: int = 16) -> bytes:
    """A request body as a vLLM completion client sends it."""
    return json.dumps({"prompt": text, "stream": stream, "max_tokens": max_tokens}).encode()


def reversed_words(text: str, max_tokens: int = 16) -> str:
    """What the stand-in engine answers for ``text``."""
    return " ".join(word[::-1] for word in text.split()[:max_tokens])
