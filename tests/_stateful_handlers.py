"""Stateful handlers for the sequence tests, and a model dir builder.

Our own equivalents of pytorch/serve's ``examples/stateful`` handlers (their protocol, our
code; an LRU of our own in ``recent.py`` instead of the ``lru`` package, no ``ts`` import, so the same file runs under the Harness and under
TorchServe 0.12's worker):

- ``SEQUENCE_SUM`` (``sequence_batching/stateful_handler.py``): each request's body is an
  integer; the answer is the running sum of its sequence, kept in an LRU keyed by sequence id.
- ``STREAMING_SUM`` (``sequence_continuous_batching/stateful_handler.py``): the same sums, with
  the example's protocol: the sequence's first request (``ts_request_sequence_start``) opens
  its state in ``context.cache``; ``0`` ends the sequence (``ts_request_sequence_end`` response
  header), ``-1`` cancels it; an even number is answered once; an odd number streams: it stays
  in the running batch (its stopping criterion answers False) for five more steps, answering
  the sequence's sum each time. Per request the state is in ``context.cache[request_id]``.
  One difference, on purpose: the example keeps the sequence's ``start`` flag set for good, so
  its criteria end every later request after one step and nothing streams; here the flag
  belongs to the start request alone.
"""

from __future__ import annotations

import json
from pathlib import Path

#: A helper module beside the handler (TorchServe wants exactly one class in the handler's module).
RECENT = '''\
from collections import OrderedDict


class Recent(OrderedDict):
    """At most ``capacity`` entries; the least recently written goes first."""

    def __init__(self, capacity):
        super().__init__()
        self.capacity = capacity

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.capacity:
            self.popitem(last=False)


def capacity(context, default=10):
    section = (context.model_yaml_config or {}).get("handler") or {}
    return int((section.get("cache") or {}).get("capacity", default))


def number(row):
    value = row.get("data") or row.get("body")
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("utf-8")
    if isinstance(value, dict):
        value = value.get("input")
    return int(value)
'''

SEQUENCE_SUM = '''\
from recent import Recent, capacity, number

class SequenceSum:
    def initialize(self, context):
        self.context = context
        self.totals = Recent(capacity(context))
        self.initialized = True

    def handle(self, data, context):
        self.context = context
        return self.postprocess(self.inference(self.preprocess(data)))

    def preprocess(self, data):
        sums = []
        for idx, row in enumerate(data):
            sequence_id = self.context.get_sequence_id(idx)
            total = self.totals.get(sequence_id, 0) + number(row)
            self.totals[sequence_id] = total
            sums.append(total)
        return sums

    def inference(self, data):
        return data

    def postprocess(self, data):
        return data
'''

STREAMING_SUM = '''\
from recent import Recent, capacity, number

STEPS_AFTER_FIRST = 5


class StreamingSum:
    def initialize(self, context):
        context.cache = {}
        self.context = context
        self.totals = Recent(capacity(context))
        self.initialized = True

    def handle(self, data, context):
        self.context = context
        return self.postprocess(self.inference(self.preprocess(data)))

    def preprocess(self, data):
        ctx, answers = self.context, []
        for idx, row in enumerate(data):
            sequence_id = ctx.get_sequence_id(idx)
            request_id = ctx.get_request_id(idx)
            ctx.set_response_header(idx, ctx.header_key_sequence_id, sequence_id)
            if request_id in ctx.cache:  # called again: an unfinished stream
                answers.append(self.totals.get(sequence_id))
                continue
            opens = bool(ctx.get_request_header(idx, ctx.header_key_sequence_start))
            if opens:
                ctx.cache[sequence_id] = {"cancel": False, "end": False, "requests": 0}
                self.totals[sequence_id] = 0
            state = ctx.cache.setdefault(sequence_id, {"cancel": False, "end": False, "requests": 0})
            state["requests"] += 1
            mine = ctx.cache[request_id] = {"sequence": sequence_id, "start": opens, "stream": True, "left": STEPS_AFTER_FIRST}
            n = number(row)
            if n == -1:
                state["cancel"], mine["stream"] = True, False
                answers.append(n)
            elif sequence_id not in self.totals:  # never opened: close it
                state["end"], mine["stream"] = True, False
                ctx.set_response_header(idx, ctx.header_key_sequence_end, sequence_id)
                answers.append(n)
            else:
                total = self.totals[sequence_id] = self.totals[sequence_id] + n
                if n == 0:
                    state["end"], mine["stream"] = True, False
                    ctx.set_response_header(idx, ctx.header_key_sequence_end, sequence_id)
                elif n % 2 == 0:
                    mine["stream"] = False
                answers.append(total)
        return answers

    def inference(self, data):
        return data

    def postprocess(self, data):
        ids = self.context.request_ids
        self.context.stopping_criteria = [self._criterion(ids[idx]) for idx in range(len(data))]
        return data

    def _criterion(self, request_id):
        cache = self.context.cache

        def finished(answer):
            mine = cache[request_id]
            state = cache[mine["sequence"]]
            if state["end"] or state["cancel"]:
                self._forget(request_id, drop_sequence=state["end"])
                return True if mine["stream"] else None
            if mine["start"] or not mine["stream"]:
                self._forget(request_id)
                return None
            if mine["left"] == 0:
                self._forget(request_id)
                return True
            mine["left"] -= 1
            return False

        return finished

    def _forget(self, request_id, drop_sequence=False):
        cache = self.context.cache
        sequence_id = cache.pop(request_id)["sequence"]
        cache[sequence_id]["requests"] -= 1
        if drop_sequence and cache[sequence_id]["requests"] == 0:
            del cache[sequence_id]
'''


def model_dir(root: Path, name: str, handler: str, config: str) -> Path:
    """A model dir holding ``handler`` as ``handler.py`` and ``config`` as model-config.yaml."""
    path = root / name
    (path / "MAR-INF").mkdir(parents=True)
    (path / "handler.py").write_text(handler)
    (path / "recent.py").write_text(RECENT)
    (path / "model-config.yaml").write_text(config)
    model = {"modelName": name, "handler": "handler.py", "modelVersion": "1.0", "configFile": "model-config.yaml"}
    (path / "MAR-INF" / "MANIFEST.json").write_text(json.dumps({"runtime": "python", "model": model}))
    return path


SEQUENCE_CONFIG = "batchSize: 4\nsequenceMaxIdleMSec: 60000\nmaxSequenceJobQueueSize: 10\nsequenceBatching: true\nhandler:\n  cache:\n    capacity: 4\n"
CONTINUOUS_CONFIG = SEQUENCE_CONFIG + "continuousBatching: true\n"
