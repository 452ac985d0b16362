"""handlerkit.diagnostics.compile.facts: what a compile report says about the pt2 settings and the
first call, from recorded decisions, the model config and caught records (no model is compiled
here: torch.compile wraps lazily; the reports on compiled models are tests/diagnostics/compile/test_report.py's)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import handlerkit as hk
from handlerkit.diagnostics.compile import CompileReport
from handlerkit.diagnostics.compile.dynamo_events import CompiledFrame
from handlerkit.diagnostics.compile.facts import (
    _HOW_TO_COMPILE,
    _TRY_AOT_EAGER,
    FELL_BACK,
    _infer_format,
    failure_fix,
    first_call_facts,
    read_settings,
    stage_ms,
)
from handlerkit.handlers.base import CompileDecision
from handlerkit.recording.results import Run, StageResult


def view_with(config):
    return SimpleNamespace(context=hk.MockContext(gpu_id=None, model_yaml_config=config))


def test_settings_come_from_the_handlers_recorded_decision():
    decision = CompileDecision(requested=True, schema="compile", options={"backend": "aot_eager", "mode": "default"},
                               reason="pt2.compile.enable: true", error=None)
    handler = SimpleNamespace(decisions=SimpleNamespace(compile=decision, model_format="eager"))
    report = CompileReport(handler="h")
    read_settings(report, view_with({"pt2": "ignored: the decision wins"}), handler)
    assert (report.pt2_schema, report.pt2_settings, report.requested) == ("compile", decision.options, True)
    assert (report.backend, report.model_format, report.reason) == ("aot_eager", "eager", "pt2.compile.enable: true")


@pytest.mark.parametrize(
    "config, schema, requested, backend",
    [
        # TorchServe's initialize deleted compile.enable when it was true: a section without it was on.
        ({"pt2": {"compile": {"backend": "eager"}}}, "compile", True, "eager"),
        ({"pt2": {"compile": {"enable": False}}}, "compile", False, None),
        ({"pt2": {"backend": "inductor", "mode": "max-autotune"}}, "legacy-dict", True, "inductor"),
        ({}, "none", False, None),
    ],
)
def test_settings_of_a_handler_that_records_none_are_read_from_the_config(config, schema, requested, backend):
    report = CompileReport(handler="theirs")
    read_settings(report, view_with(config), SimpleNamespace())
    assert (report.pt2_schema, report.requested, report.backend) == (schema, requested, backend)


def test_the_stage_time_is_device_time_else_wall_and_handle_is_the_whole_call():
    run = Run(output=[], stages={"inference": StageResult("inference", wall_ms=9.0, device_ms=4.0),
                                 "preprocess": StageResult("preprocess", wall_ms=2.0)}, batch_size=1, handle_ms=20.0)
    assert stage_ms(run, "inference") == 4.0 and stage_ms(run, "preprocess") == 2.0 and stage_ms(run, "handle") == 20.0


def test_the_format_of_a_model_a_handler_loaded_itself():
    class Session:
        def get_inputs(self):
            return []

        def run(self, *args):
            return []

    assert _infer_format(SimpleNamespace(session=Session())) == "onnx"
    assert _infer_format(torch.nn.Linear(1, 1)) is None


def test_the_fix_for_a_compile_that_failed_in_the_first_call():
    report = CompileReport(handler="h", model_format="torchscript")
    assert failure_fix(report, None).startswith("torch.compile cannot compile a TorchScript model: ")
    report.model_format = "eager"
    error = RuntimeError("Unsupported")
    error.real_stack = [SimpleNamespace(filename="model.py", lineno=12, line="x.item()")]
    assert failure_fix(report, error) == "change what Dynamo cannot trace at model.py:12 (x.item()), or set fullgraph: false"
    assert failure_fix(report, RuntimeError("no stack")) == _TRY_AOT_EAGER


class Events:
    """What DynamoEvents caught during the first call."""

    def __init__(self, frames=(), symbols=()):
        self.frames, self.symbols = list(frames), list(symbols)


def first_run(inference_input):
    return Run(output=[], stages={"inference": StageResult("inference", input=inference_input, wall_ms=30.0)}, batch_size=2)


def test_the_first_call_of_a_compiled_model():
    eager = torch.nn.Linear(3, 1)
    handler = SimpleNamespace(model=torch.compile(eager, backend="eager"))
    x = torch.ones(2, 3)
    torch._dynamo.mark_dynamic(x, 0)
    frames = [CompiledFrame("0/0", "forward", compile_s=1.0, backend_s=0.25, inductor_s=0.2, cache_hits=1),
              CompiledFrame("0/1", "forward", compile_s=0.5, backend_s=0.25, recompile_reason="size mismatch")]
    report = CompileReport(handler="h", requested=True, pt2_settings={"backend": "eager"})
    first_call_facts(report, first_run(x), Events(frames, ["L['x'].size()[1]"]), handler, compiled_at_start=True)
    assert report.applied and report.model == "Linear" and report.first_call_ms == 30.0
    assert (report.compile_s, report.backend_s, report.dynamo_s, report.inductor_s) == (1.5, 0.5, 1.0, 0.2)
    assert [r.compile_id for r in report.recompiles] == ["0/1"]
    assert report.dynamic_inputs == ["inference input 0: dim 0 (mark_dynamic in preprocess)", "x: dim 1 (made dynamic by Dynamo)"]
    assert report.cache_load_s == 1.0 and report.cold_compile_s is None  # the recompile captured no graph
    assert report.notes[0].startswith("Inductor's FX graph cache served 1 of 1 graph(s) at the first call: a cache load")
    assert report.problems == []


def test_a_warm_first_call_says_the_cost_was_not_observed():
    handler = SimpleNamespace(model=torch.compile(torch.nn.Linear(3, 1), backend="eager"))
    report = CompileReport(handler="h", requested=True)
    first_call_facts(report, first_run(torch.ones(1, 3)), Events(), handler, compiled_at_start=True)
    assert report.applied and not report.compile_observed and report.compile_s is None
    assert any(note.startswith("the first call compiled nothing") for note in report.notes)


def test_asked_for_but_not_compiled_is_a_problem_and_not_asked_is_a_note():
    handler = SimpleNamespace(model=torch.nn.Linear(3, 1))
    asked = CompileReport(handler="h", requested=True, reason="backend 'nope' is not a torch.compile backend",
                          model_format="onnx")
    first_call_facts(asked, first_run(torch.ones(1, 3)), Events(), handler, compiled_at_start=False)
    [problem] = asked.problems
    assert (problem.check, problem.stage) == ("compile", "initialize") and not asked.applied
    assert problem.message.startswith("pt2 asks for torch.compile but the model runs eagerly: backend 'nope'")
    assert problem.fix.startswith("torch.compile cannot compile an ONNX model")
    not_asked = CompileReport(handler="h")
    first_call_facts(not_asked, first_run(torch.ones(1, 3)), Events(), handler, compiled_at_start=False)
    assert not_asked.problems == [] and _HOW_TO_COMPILE in not_asked.notes


def test_a_model_that_fell_back_during_the_first_call():
    decision = CompileDecision(requested=True, applied=False, error="BackendCompilerFailed: boom", reason=FELL_BACK)
    handler = SimpleNamespace(model=torch.nn.Linear(3, 1), decisions=SimpleNamespace(compile=decision))
    report = CompileReport(handler="h", requested=True)
    first_call_facts(report, first_run(torch.ones(1, 3)), Events(), handler, compiled_at_start=True)
    [problem] = report.problems
    assert problem.message == "compiling failed at the first call: BackendCompilerFailed: boom"
    assert report.reason == FELL_BACK and problem.fix == _TRY_AOT_EAGER
