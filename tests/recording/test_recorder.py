"""Records of each stage call (:mod:`handlerkit.recording.recorder`): one StageResult per stage,
with the warnings and logs of its own calls, however many calls there were."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import types
import warnings

import pytest

from handlerkit.recording.capture import Capture, ListHandler
from handlerkit.recording.recorder import Recorder
from handlerkit.recording.results import LogEntry

LOG = logging.getLogger("my_handler")


def preprocess(data):
    LOG.warning("got %d rows", len(data))
    return [x * 2 for x in data]


def inference(data):
    warnings.warn("slow path", UserWarning, stacklevel=1)
    return [x + 1 for x in data]


@pytest.fixture
def capture():
    with warnings.catch_warnings():  # what the capture shows again as it closes
        warnings.simplefilter("ignore")
        with Capture(contextlib.nullcontext, ListHandler(), {}) as open_capture:
            yield open_capture


def test_each_stage_gets_its_own_calls_warnings_and_logs(capture):
    recorder = Recorder(capture, None, None, track_memory=False, source="the handler")
    assert recorder.call("preprocess", preprocess, [1, 2]) == [2, 4]
    assert recorder.call("inference", inference, [2]) == [3]  # micro-batching: two calls of one stage
    assert recorder.call("inference", inference, [4]) == [5]
    results: dict = {}
    pre, inf = recorder.build(results)
    assert results == {"preprocess": pre, "inference": inf}
    assert (pre.input, pre.output, pre.calls, pre.source) == ([1, 2], [2, 4], 1, "the handler")
    assert pre.logs == [LogEntry("WARNING", "my_handler", "got 2 rows")] and pre.warnings == []
    assert (inf.input, inf.output, inf.calls) == ([[2], [4]], [[3], [5]], 2)
    assert [str(w.message) for w in inf.warnings] == ["slow path", "slow path"] and inf.logs == []
    assert inf.wall_ms == sum(lap.wall_ms for lap in recorder.laps[1:])


def test_the_call_that_raised_is_found_from_the_error_or_what_it_caused(capture):
    recorder = Recorder(capture, None, None, track_memory=False)
    recorder.call("preprocess", preprocess, [1])
    with pytest.raises(TypeError) as info:
        recorder.call("inference", inference, None)
    assert recorder.failed(info.value) is recorder.laps[1] and recorder.laps[1].error is info.value
    try:
        raise RuntimeError("handle failed") from info.value
    except RuntimeError as wrapped:
        assert recorder.failed(wrapped) is recorder.laps[1]
    assert recorder.failed(ValueError("elsewhere")) is None


def test_a_handle_that_calls_no_stage_is_one_handle_stage(capture):
    recorder = Recorder(capture, None, None, track_memory=False)
    marks = recorder.mark()
    LOG.warning("handled")
    whole = recorder.whole([1], ["ok"], 2.5, marks)
    assert (whole.stage, whole.input, whole.output, whole.wall_ms) == ("handle", [1], ["ok"], 2.5)
    assert whole.logs == [LogEntry("WARNING", "my_handler", "handled")]


def test_an_async_stage_is_recorded_when_it_is_awaited_and_a_stepped_stage_gets_its_context(capture):
    recorder = Recorder(capture, None, None, track_memory=False)

    async def postprocess(data):
        await asyncio.sleep(0)
        return [str(x) for x in data]

    awaited = recorder.call("postprocess", postprocess, [1])
    assert recorder.laps[0].output is awaited  # not run yet
    assert asyncio.run(awaited) == ["1"] and recorder.laps[0].output == ["1"]

    def with_context(data, context):
        return [context] * len(data)

    service = types.SimpleNamespace(context="ctx", worker_loop=None)
    assert recorder.step("preprocess", with_context, [1, 2], service) == ["ctx", "ctx"]
