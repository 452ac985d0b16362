"""Running the requests of a failed batch one at a time (:mod:`handlerkit.recording.alone`): the
one at fault is found in few runs, and the handler and context are left as the failure left them."""

from __future__ import annotations

import contextlib

import torch

import handlerkit as hk
from handlerkit.recording.alone import ENOUGH_FAILING, Alone, run_alone


class Reads:
    """Reads each request's ``x``; keeps what it saw, as a handler's own state."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def preprocess(self, data):
        self.seen.append(len(data))
        self.last = data
        return [row["body"]["x"] for row in data]

    def inference(self, xs):
        return [x * 2 for x in xs]


def bound(*bodies: dict) -> tuple[hk.Batch, hk.MockContext]:
    batch, context = hk.batch(*(hk.Request.json(b) for b in bodies)), hk.MockContext()
    batch.bind(context)
    return batch, context


def test_the_request_at_fault_is_found_in_two_runs_and_the_handler_is_put_back():
    batch, context = bound({"x": 1}, {"y": 2}, {"x": 3}, {"x": 4})
    ids = dict(context.request_ids)
    handler = Reads()
    handler.seen.append(99)
    found = run_alone(batch, context, contextlib.nullcontext, handler, stages=[handler.preprocess, handler.inference])
    assert found == Alone(failing=1, passing=0, tried=2) and found.one_at_fault and found.ran
    assert handler.seen == [99] and not hasattr(handler, "last")  # as the failure left it
    assert context.request_ids == ids  # bound to the whole batch again


def test_when_the_first_few_each_fail_no_more_are_tried():
    batch, context = bound(*({"y": i} for i in range(6)))
    handler = Reads()
    found = run_alone(batch, context, contextlib.nullcontext, handler, stages=[handler.preprocess])
    assert found == Alone(failing=0, passing=None, tried=ENOUGH_FAILING) and found.all_fail


def test_a_function_handler_runs_whole_for_each_request():
    batch, context = bound({"x": 1}, {"x": 2})
    calls = []

    def handle(data, context):
        calls.append(data)
        return [row["body"]["x"] for row in data]

    found = run_alone(batch, context, contextlib.nullcontext, handle, handle=handle)
    assert found == Alone(failing=None, passing=0, tried=2) and not found.one_at_fault
    assert len(calls) == 2  # none failed: both were run


def test_a_model_in_training_mode_or_an_async_stage_is_not_run_again():
    batch, context = bound({"x": 1}, {"x": 2})
    handler = Reads()
    handler.model = torch.nn.BatchNorm1d(3)  # training mode, with running statistics
    found = run_alone(batch, context, contextlib.nullcontext, handler, stages=[handler.preprocess, handler.inference])
    assert found == Alone(
        why_not="self.model is in training mode (call .eval() in initialize), so running it again would change it"
    )
    assert not found.ran and handler.seen == []

    async def preprocess(data):
        return data

    found = run_alone(batch, context, contextlib.nullcontext, Reads(), stages=[preprocess])
    assert found.why_not == "its preprocess is async (a coroutine), which is not run again here"
