"""The worker's rules for handle's output (handlerkit.worker.contract), as Problem data with a fix."""

from __future__ import annotations

import types

import pytest
import torch

import handlerkit as hk
from handlerkit.worker.contract import (
    HANDLER_STAGES,
    STAGES,
    HeaderReads,
    Problem,
    check_output,
    check_statuses,
    header_reads_in_initialize,
    response_statuses,
    skipped_stages,
)


def test_the_stages_are_defined_once():
    assert STAGES == ("initialize", *HANDLER_STAGES) and HANDLER_STAGES == ("preprocess", "inference", "postprocess")


@pytest.mark.parametrize(
    "item, check",
    [
        ({"a": 1.0, "b": [1, 2, {"c": None}]}, None),
        ({"a": float("inf")}, "item-nan"),
        ([[1.0, float("nan")]], "item-nan"),
        ({("tuple", "key"): 1}, "item-serialisable"),
        ({"a": {1, 2}}, "item-serialisable"),
        ({1: "int keys are fine", 2.5: "float keys too", None: True}, None),
        (torch.tensor([1.0]), "item-type"),
    ],
)
def test_output_items_are_judged_as_json_dumps_would(item, check):
    problems = check_output([item], 1)
    assert [p.check for p in problems] == ([check] if check else [])


def test_a_problem_is_data_with_where_what_and_the_fix():
    (count,) = check_output([{"a": 1}], 3, stage="postprocess")
    assert (count.check, count.stage, count.request_index, count.severity) == ("output-count", "postprocess", None, "error")
    assert "got 1 item(s) for a batch of 3" in count.message and "503" in count.message
    assert count.fix == "build the output list from the batch, one entry for every request in data"
    assert str(count) == f"postprocess: {count.message}; fix: {count.fix}"
    (kind,) = check_output({"a": 1}, 1)
    assert kind.check == "output-type" and kind.fix.startswith("return one item per request")
    (nan,) = check_output([{"ok": 1.0}, {"bad": float("nan")}], 2)
    assert nan.check == "item-nan" and nan.request_index == 1 and nan.message.endswith("not valid JSON")


@pytest.mark.parametrize(
    ("output", "fix"),
    [
        ("cat\ndog", "return a list with one str per request (the answers themselves, not one str joined from them)"),
        (b"\x89PNG", "return a list with one bytes per request (the answers themselves, not one bytes joined from them)"),
        (({"a": 1}, {"b": 2}), "return a list, not a tuple: list(output), one item per request"),
    ],
)
def test_the_fix_for_an_output_that_is_no_list_fits_what_it_is(output, fix):
    (kind,) = check_output(output, 2, stage="postprocess")
    assert kind.check == "output-type" and kind.fix == fix


def test_skipped_stages_only_for_handlers_that_have_stage_methods():
    class OnlyHandle:
        def handle(self, data, context):
            return data

    class WithStages(OnlyHandle):
        def preprocess(self, data):
            return data

    assert skipped_stages(OnlyHandle()) == []
    (problem,) = skipped_stages(WithStages())
    assert isinstance(problem, Problem) and problem.check == "skipped-stages" and problem.severity == "warning"
    assert problem.message.startswith("WithStages.handle() never called preprocess")


@pytest.mark.parametrize("code, ok", [(200, True), (100, True), (599, True), (99, False), (600, False),
                                      ("200", False), (True, False), (None, False), (404.0, False)])
def test_a_status_must_be_an_http_code(code, ok):
    problems = check_statuses([(200, None), (code, "phrase")])
    if ok:
        assert problems == []
    else:
        [problem] = problems
        assert (problem.check, problem.stage, problem.request_index) == ("status", "handle", 1)
        assert problem.message == f"response status {code!r} is not an HTTP status code"
        assert problem.fix == "use context.set_response_status(code, phrase, idx) with 100..599"


def test_response_statuses_read_what_the_handler_set():
    ctx = hk.MockContext()
    hk.batch(hk.Request.text("a"), hk.Request.text("b")).bind(ctx)
    ctx.set_response_status(413, "Payload Too Large", 1)
    statuses = response_statuses(ctx, 2)
    assert statuses == [(200, None), (413, "Payload Too Large")]
    assert check_statuses(statuses, stage="postprocess") == []


def test_header_reads_in_initialize_are_one_problem_naming_each_read():
    assert header_reads_in_initialize([]) == []
    [problem] = header_reads_in_initialize(["get_request_header(0, 'explain')", "get_sequence_id(0)"])
    assert (problem.check, problem.stage, problem.severity) == ("header-in-initialize", "initialize", "error")
    assert "(context.get_request_header(0, 'explain'), context.get_sequence_id(0))" in problem.message
    assert "the read raises TypeError and the model fails to load" in problem.message
    assert problem.fix.startswith("read request headers per request in preprocess or handle")
    assert str(problem).startswith("initialize: read request headers (")


def test_header_reads_note_a_mock_contexts_reads_inside_the_block_only():
    ctx = hk.MockContext()
    result = types.SimpleNamespace(problems=[])
    with HeaderReads(ctx) as reads:
        ctx.get_request_header(0, "mode")
        assert reads.add_to(None) == []  # no result to add to (initialize never got one)
        [problem] = reads.add_to(result)
    ctx.get_request_header(0, "later")
    assert result.problems == [problem] and reads.reads == ["get_request_header(0, 'mode')"]

    class TheirContext:  # TorchServe's Context has no notes: it raises on such a read itself
        pass

    with HeaderReads(TheirContext()) as none:
        pass
    assert none.add_to(types.SimpleNamespace(problems=[])) == []

