"""Harness.compile_report: settings, first-call cost, graph breaks, recompiles, the gate, bad input.

Tiny models with the ``eager``/``aot_eager`` backends compile in well under a second; one
Inductor compile runs under ``slow``. No test calls ``torch._dynamo.reset()`` around a report
it checks: what the report must leave alone includes the compiled caches.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._dynamo.eval_frame import OptimizedModule

import handlerkit as hk
from conftest import BREAK_LINE, BREAK_MODEL_PY, MLP_MODEL_PY, eager_manifest, format_context, write_model_dir
from handlerkit.diagnostics.compile import CompileReport, compile_report
from handlerkit.errors import HandlerkitError, HandlerkitWarning, StageError
from handlerkit.handlers.base import BaseHandler

BATCH = [[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 2.0, 0.0]]


def harness(model_dir: Path, pt2: Any = None, handler: Any = BaseHandler, **config: Any) -> hk.Harness:
    yaml_config = dict(config)
    if pt2 is not None:
        yaml_config["pt2"] = copy.deepcopy(pt2)
    ctx = hk.MockContext(model_dir=model_dir, gpu_id=None, manifest=eager_manifest(), model_yaml_config=yaml_config)
    return hk.Harness(handler, ctx)


def eager_pt2(**options: Any) -> dict:
    return {"compile": {"enable": True, "backend": "eager", **options}}


def report_of(h: hk.Harness, data: Any, **options: Any) -> CompileReport:
    """compile_report with the options the Harness method does not pass on (repeat, warmup)."""
    return compile_report(h, hk.Batch.coerce(data), **options)


def unique(source: str, request: pytest.FixtureRequest) -> str:
    """The model source with the test's name in a trailing comment: Dynamo's profile-guided
    dynamic shapes remember a code's sizes by the file's content across models in a process, so
    a model compiled by an earlier test would make this one's batch dimension dynamic already."""
    return f"{source}\n# {request.node.nodeid}\n"


@pytest.fixture
def break_dir(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    return write_model_dir(tmp_path / "breaky", unique(BREAK_MODEL_PY, request))


@pytest.fixture
def mlp_dir(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """TinyMLP (conftest's), its source unique to the test (see :func:`unique`)."""
    return write_model_dir(tmp_path / "mlp", unique(MLP_MODEL_PY, request))


# ---------------------------------------------------------------------------- the report
def test_graph_break_is_reported_with_reason_file_line_and_source(break_dir):
    h = harness(break_dir, eager_pt2())
    report = report_of(h, BATCH, repeat=3)

    assert isinstance(report, CompileReport)
    assert (report.requested, report.applied, report.pt2_schema, report.backend) == (True, True, "compile", "eager")
    assert report.pt2_settings == {"backend": "eager"}
    assert report.model == "Breaky"
    [brk] = report.graph_breaks
    assert "Tensor.item()" in brk.reason
    assert os.path.realpath(brk.file) == os.path.realpath(break_dir / "model.py")
    assert brk.line == BREAK_LINE
    assert brk.source == "if y.sum().item() > 0:"
    assert "capture_scalar_outputs" in brk.hint
    assert brk.code == "GB0124"  # torch 2.14 ships torch/_dynamo/graph_break_registry.json
    assert brk.doc_url.endswith("/gb0124.html")
    # The graph before the break and the code resumed after it were compiled by the first call.
    assert report.compile_observed
    # Two frames, each compiled once ("<frame>/0"); frame numbers count every compile in the process.
    first, resumed = (int(f.compile_id.split("/")[0]) for f in report.frames[:2])
    assert resumed == first + 1 and [f.compile_id.split("/")[1] for f in report.frames[:2]] == ["0", "0"]
    assert any("resumed at line 11" in f.function for f in report.frames)
    assert report.compile_s > 0 and report.dynamo_s > 0 and report.backend_s is not None
    assert report.dynamo_s + report.backend_s == pytest.approx(report.compile_s)
    assert report.first_call_ms > 0
    assert report.steady_compiled.n == report.steady_eager.n == 3
    assert report.speedup > 0
    assert report.gate == [] and report.gate_ok is None
    text, html = str(report), report._repr_mimebundle_()["text/html"]
    assert f"model.py:{BREAK_LINE}" in text and "if y.sum().item() &gt; 0:" in html
    data = json.loads(json.dumps(report.to_dict()))  # plain data for front ends
    assert data["graph_breaks"][0]["line"] == BREAK_LINE and data["speedup"] == report.speedup


def test_dynamos_own_graph_break_warning_is_not_said_again_on_stderr(break_dir, capfd):
    """The report says the break with its line and fix; torch's stderr copy would say it twice."""
    h = harness(break_dir, eager_pt2())
    capfd.readouterr()
    report = report_of(h, BATCH, repeat=1)
    assert [b.line for b in report.graph_breaks] == [BREAK_LINE]
    assert "Graph break" not in capfd.readouterr().err
    handlers = logging.getLogger("torch._dynamo").handlers
    assert handlers and not any(h.filters for h in handlers)  # torch's logging left as it was


def test_report_leaves_the_handler_as_it_was(break_dir):
    h = harness(break_dir, eager_pt2())
    run = h.run(BATCH[:1])
    compiled = h.handler.model
    report_of(h, BATCH, batch_sizes=[1, 2], repeat=2)
    assert h.handler.model is compiled  # the eager model was swapped in for timing and put back
    assert len(h.batch) == 1 and h.results["inference"] is run.stages["inference"]  # results are back
    assert h.track_memory is True


def test_first_call_is_the_handlers_first_compile_and_is_not_repeated(mlp_dir):
    h = harness(mlp_dir, eager_pt2())
    first = report_of(h, BATCH, repeat=2)
    again = report_of(h, BATCH, repeat=2)
    assert first.compile_observed and first.frames
    assert not again.compile_observed and again.frames == [] and again.compile_s is None
    assert any("compile cost was not" in n and "observed" in n for n in again.notes)


def test_not_initialized_handler_is_initialized_first(mlp_dir):
    h = harness(mlp_dir, eager_pt2())
    assert "initialize" not in h.results
    report = report_of(h, BATCH, repeat=1)
    assert h.results["initialize"].ok and report.applied


def test_no_pt2_section_says_so_and_times_nothing(mlp_dir):
    h = harness(mlp_dir)
    report = h.compile_report(BATCH, batch_sizes=[1, 2])
    assert (report.requested, report.applied) == (False, False)
    assert "no pt2" in report.reason
    assert report.steady_compiled is None and report.gate == []
    assert any("add pt2: {compile: {enable: true" in n for n in report.notes)
    assert "not compiled" in repr(report)


def test_legacy_schema_and_aot_eager(mlp_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HandlerkitWarning)  # the legacy-schema note
        report = report_of(harness(mlp_dir, {"backend": "aot_eager"}), BATCH, repeat=2)
    assert (report.pt2_schema, report.backend, report.applied) == ("legacy-dict", "aot_eager", True)
    assert report.backend_s > 0  # aot_eager runs AOTAutograd: a real backend step
    assert "legacy" in str(report)


# ---------------------------------------------------------------------------- the gate
def test_gate_catches_a_batch_size_recompile_and_compiles_nothing(mlp_dir):
    h = harness(mlp_dir, eager_pt2())
    report = report_of(h, BATCH, batch_sizes=[1, 2, 4, 8], repeat=2)
    assert report.recompiling_sizes == [1, 4, 8] and report.gate_ok is False
    outcome = {g.batch_size: g for g in report.gate}
    assert outcome[2].outcome == "no recompile"
    assert "size mismatch at index 0" in outcome[4].reason and "actual 4" in outcome[4].reason
    assert "dynamic: true" in outcome[4].fix and "mark_dynamic" in outcome[4].fix
    [problem] = [p for p in report.problems if p.check == "recompile"]
    assert problem.severity == "warning" and "1, 4, 8" in problem.message and "dynamic: true" in problem.fix
    assert "gate: batch 1, 4, 8 recompile" in repr(report)
    # The gate refused the recompiles instead of making them: size 4 still is not compiled.
    with pytest.raises(StageError, match="fail_on_recompile"), torch.compiler.set_stance("fail_on_recompile"):
        h.run(BATCH * 2)


def test_gate_passes_with_dynamic_true_except_the_size_one_specialisation(mlp_dir):
    report = report_of(harness(mlp_dir, eager_pt2(dynamic=True)), BATCH, batch_sizes=[1, 2, 4, 8], repeat=1)
    assert report.recompiling_sizes == [1]  # Dynamo compiles size-1 dimensions apart, even when dynamic
    assert "mark_unbacked" in report.gate[0].fix
    assert [g.outcome for g in report.gate[1:]] == ["no recompile"] * 3
    assert "every dimension (pt2 dynamic: true)" in report.dynamic_inputs


class MarkDynamicHandler(BaseHandler):
    def preprocess(self, data):
        batch = super().preprocess(data)
        torch._dynamo.mark_dynamic(batch, 0)
        return batch


def test_mark_dynamic_in_preprocess_is_reported_and_passes_the_gate(mlp_dir):
    report = report_of(harness(mlp_dir, eager_pt2(), MarkDynamicHandler), BATCH, batch_sizes=[2, 4, 8], repeat=1)
    assert "inference input 0: dim 0 (mark_dynamic in preprocess)" in report.dynamic_inputs
    assert any(d.endswith(": dim 0 (made dynamic by Dynamo)") for d in report.dynamic_inputs)
    assert report.gate_ok is True and not report.recompiling_sizes


#: A forward that pins a dynamic batch dimension: ``x.shape[0] == 2`` on line 10 of model.py (2, not the
#: feature width 4: Dynamo gives equal sizes one symbol, and the guard would pin both).
PINNING_MODEL_PY = '''\
import torch


class Pinning(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        if x.shape[0] == 2:
            return self.fc(x) * 2
        return self.fc(x)
'''
PINNING_LINE = 10


def test_a_specialised_batch_dimension_names_the_users_line(tmp_path, request):
    model_dir = write_model_dir(tmp_path / "pinning", unique(PINNING_MODEL_PY, request))
    report = report_of(harness(model_dir, eager_pt2(dynamic=True)), BATCH, repeat=1)  # a batch of 2
    batch_dim, width = report.specialisations  # the Linear pins the feature width (4) too, a line below
    assert (batch_dim.dimension, batch_dim.value) == ("x: dim 0", "2") and batch_dim.guard.endswith(" == 2 (range_refined_to_singleton)")
    assert batch_dim.where == f"{model_dir / 'model.py'}:{PINNING_LINE}" and batch_dim.code == "if x.shape[0] == 2:"
    assert (width.dimension, width.value, width.line) == ("x: dim 1", "4", PINNING_LINE + 1)
    assert f"model.py:{PINNING_LINE}" in str(report) and report.to_dict()["specialisations"][0]["line"] == PINNING_LINE


def test_recompile_during_the_report_is_listed_with_its_reason(mlp_dir):
    h = harness(mlp_dir, eager_pt2())
    h.run(BATCH[:1] * 3)  # compiled for a batch of 3
    report = report_of(h, BATCH, repeat=1)  # a batch of 2 recompiles: the first call shows it
    [recompile] = report.recompiles
    assert recompile.compile_id.endswith("/1") and "size mismatch" in recompile.reason
    assert report.compile_observed


def test_the_compiled_model_is_put_back_when_the_eager_timing_is_interrupted(mlp_dir, monkeypatch):
    from handlerkit.diagnostics.compile import report as compile_module

    real, summaries = compile_module.summarize, []

    def interrupted(samples):
        summaries.append(samples)
        if len(summaries) == 2:  # the eager model's timing: the user presses stop
            raise KeyboardInterrupt
        return real(samples)

    monkeypatch.setattr(compile_module, "summarize", interrupted)
    h = harness(mlp_dir, eager_pt2())
    with pytest.raises(KeyboardInterrupt):
        report_of(h, BATCH, repeat=2)
    assert isinstance(h.handler.model, OptimizedModule) and h.track_memory is True
    assert len(h.run(BATCH).output) == 2


def test_without_structured_records_the_report_has_fewer_fields(break_dir, monkeypatch):
    from handlerkit.diagnostics.compile import dynamo_events as _dynamo_events

    # As with a torch that writes no torch.__trace records: get_compilation_metrics() remains.
    monkeypatch.setattr(_dynamo_events, "_trace_logger", lambda: logging.getLogger("handlerkit.tests.silent"))
    report = report_of(harness(break_dir, eager_pt2()), BATCH, repeat=1)
    assert report.applied and report.compile_observed and report.compile_s > 0
    [brk] = report.graph_breaks
    assert brk.reason.startswith("Unsupported Tensor.item() call") and brk.code == "GB0124"
    assert brk.file is None and brk.line is None  # the metrics say why, not where
    assert report.dynamic_inputs == []


# ---------------------------------------------------------------------------- global state
class OtherModel(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(x) + 1


def _logging_state() -> list[Any]:
    names = ["torch", "torch._dynamo", "torch.__trace", "torch._inductor"]
    return [(n, logging.getLogger(n).level, list(logging.getLogger(n).handlers)) for n in names]


def test_counters_config_logging_and_other_models_cache_are_left_alone(mlp_dir):
    from torch._dynamo.utils import counters

    other = torch.compile(OtherModel(), backend="eager")
    other(torch.ones(2, 2))
    h = harness(mlp_dir, eager_pt2())
    h.run(BATCH)  # compiled and warm: the report has no compile of its own to make
    before = copy.deepcopy({k: dict(v) for k, v in counters.items()})
    config, logs = torch._dynamo.config.get_config_copy(), _logging_state()

    report = report_of(h, BATCH, batch_sizes=[1, 2, 4], repeat=2)

    assert report.recompiling_sizes == [1, 4]
    assert {k: dict(v) for k, v in counters.items()} == before
    assert torch._dynamo.config.get_config_copy() == config
    assert _logging_state() == logs
    with torch.compiler.set_stance("fail_on_recompile"):  # the other model's compiled code is still there
        other(torch.ones(2, 2))
    assert {k: dict(v) for k, v in counters.items()} == before


def test_a_cold_report_adds_to_counters_and_clears_nothing(break_dir):
    from torch._dynamo.utils import counters

    before = copy.deepcopy({k: dict(v) for k, v in counters.items()})
    report_of(harness(break_dir, eager_pt2()), BATCH, batch_sizes=[1, 2], repeat=1)
    after = {k: dict(v) for k, v in counters.items()}
    assert all(after.get(k, {}).get(name, 0) >= n for k, v in before.items() for name, n in v.items())
    assert after["frames"]["total"] > before.get("frames", {}).get("total", 0)


# ---------------------------------------------------------------------------- bad input
def test_unknown_backend_is_a_problem_with_the_fix(mlp_dir):
    h = harness(mlp_dir, {"compile": {"enable": True, "backend": "inducter"}})
    with pytest.warns(HandlerkitWarning, match="inducter"):
        report = h.compile_report(BATCH)
    assert (report.requested, report.applied) == (True, False)
    [problem] = report.problems
    assert problem.check == "compile" and "inducter" in problem.message
    assert "inductor" in problem.fix and "did you mean" in problem.fix.lower()
    assert h.run(BATCH).output  # the handler runs eagerly


def test_compile_error_inside_the_first_call_falls_back_to_eager(break_dir, mlp_reference):
    # fullgraph refuses the .item() graph break: Dynamo raises inside the first call.
    h = harness(break_dir, eager_pt2(fullgraph=True))
    with pytest.warns(HandlerkitWarning, match="handler now runs the eager model"):
        report = h.compile_report(BATCH, batch_sizes=[1, 2])
    assert (report.requested, report.applied) == (True, False)
    assert report.error.startswith("UserError: ")  # Dynamo's error type and first line (data-dependent branch)
    [problem] = [p for p in report.problems if p.check == "compile"]
    assert f"model.py:{BREAK_LINE}" in problem.fix and "fullgraph: false" in problem.fix
    assert not isinstance(h.handler.model, OptimizedModule)
    assert h.handler.decisions.compile.fell_back_at_runtime is True
    assert len(h.run(BATCH).output) == 2  # and keeps working eagerly
    assert report.gate == []


def test_backend_failing_at_compile_time(mlp_dir):
    h = harness(mlp_dir, eager_pt2(backend="relu_compile_error_TESTING_ONLY"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HandlerkitWarning)  # initialize's and the fallback's warnings
        report = h.compile_report(BATCH)
    assert (report.requested, report.applied) == (True, False)
    [problem] = report.problems
    assert "failed at the first call" in problem.message and "ReluCompileError" in (report.error or "")
    assert h.run(BATCH).output


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_torchscript_and_onnx_models_are_not_compilable(fmt, fast_format_dirs):
    ctx = format_context(fmt, fast_format_dirs[fmt])
    ctx.model_yaml_config = {"pt2": eager_pt2()}
    h = hk.Harness(BaseHandler, ctx)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript's deprecation, the refused compile
        report = h.compile_report(BATCH)
    assert (report.requested, report.applied, report.model_format) == (True, False, fmt)
    [problem] = [p for p in report.problems if p.check == "compile"]
    assert ("TorchScript" if fmt == "torchscript" else "ONNX") in problem.fix
    assert "modelFile + state_dict" in problem.fix
    assert len(h.run(BATCH).output) == 2


class NoModelHandler:
    def initialize(self, context):
        self.initialized = True

    def handle(self, data, context):
        return [0 for _ in data]


def test_handler_without_model_or_function_handler_is_an_error_with_the_fix():
    with pytest.raises(HandlerkitError, match="no model after initialize") as caught:
        hk.Harness(NoModelHandler, hk.MockContext()).compile_report(BATCH)
    assert "self.model" in caught.value.fix
    with pytest.raises(HandlerkitError, match="function handler"):
        hk.Harness(lambda data, context: data, hk.MockContext()).compile_report(BATCH)


def test_bad_arguments(mlp_dir):
    h = harness(mlp_dir, eager_pt2())
    for sizes in ([], [0], [2, "4"], [True]):
        with pytest.raises(ValueError, match="batch_sizes"):
            h.compile_report(BATCH, batch_sizes=sizes)
    with pytest.raises(ValueError, match="repeat"):
        report_of(h, BATCH, repeat=0)


def test_a_model_that_fails_eagerly_too_raises_its_stage_error(tmp_path):
    model_dir = write_model_dir(tmp_path / "mlp", MLP_MODEL_PY)
    h = harness(model_dir, eager_pt2())
    with pytest.raises(StageError, match="inference"):
        h.compile_report([[1.0, 2.0]])  # 2 features for a Linear(4, 3)
    assert isinstance(h.handler.model, OptimizedModule)  # not blamed on the compiler


@pytest.mark.torchserve
def test_torchserve_handler(mlp_dir):
    from ts.torch_handler.base_handler import BaseHandler as TsBaseHandler

    class Handler(TsBaseHandler):
        def preprocess(self, data):
            return torch.as_tensor(data)

    report = report_of(harness(mlp_dir, eager_pt2(), Handler), BATCH, batch_sizes=[2], repeat=1)
    assert (report.pt2_schema, report.requested, report.applied, report.backend) == ("compile", True, True, "eager")
    assert report.compile_observed and report.gate_ok is True


# ---------------------------------------------------------------------------- progress, inductor
def test_progress_bar_only_when_asked(mlp_dir, capsys):
    h = harness(mlp_dir, eager_pt2())
    report_of(h, BATCH, repeat=1, progress=False)
    assert "compile report" not in capsys.readouterr().err
    report_of(h, BATCH, repeat=1, batch_sizes=[2], progress=True)
    assert "compile report" in capsys.readouterr().err


@pytest.mark.slow
def test_inductor_first_call_split(mlp_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-cache"))
    report = report_of(harness(mlp_dir, {"compile": {"enable": True}}), BATCH, repeat=3)
    assert (report.applied, report.backend) == (True, "inductor")
    assert report.inductor_s > 0 and report.backend_s >= report.inductor_s
    assert report.compile_s >= report.backend_s and report.dynamo_s > 0
    assert report.graph_breaks == [] and len(report.graphs) == 1
    # An empty cache dir: the graph misses both caches and compiles cold; the report says so per graph.
    (graph,) = report.graphs
    assert (graph.fx_graph_cache, graph.aot_autograd_cache) == ("miss", "miss")
    assert report.cache_load_s is None and report.cold_compile_s == pytest.approx(graph.compile_s)
    assert "graphs compiled cold s" in str(report)


def test_a_compile_report_is_ok_without_an_error_a_failing_problem_or_a_recompile():
    from handlerkit.diagnostics.compile.gate import GateResult
    from handlerkit.worker.contract import Problem

    assert CompileReport(handler="H").ok  # nothing ran, nothing failed
    assert not CompileReport(handler="H", error="backend 'nope' not found").ok
    assert not CompileReport(handler="H", problems=[Problem("compile", "graph break")]).ok
    assert CompileReport(handler="H", problems=[Problem("compile", "slow", severity="warning")]).ok
    gate = [GateResult(1, "no recompile"), GateResult(4, "recompiles", "size mismatch", "mark_dynamic")]
    assert not CompileReport(handler="H", gate=gate).ok
    assert CompileReport(handler="H", gate=gate[:1]).ok


def test_compile_tables_wrap_long_guards_and_fixes():
    from handlerkit.diagnostics.compile.gate import GateResult
    from handlerkit.worker.contract import Problem

    guard = "tensor 'L['x']' size mismatch at index 0. expected 2, actual 4; " * 6  # ~390 characters
    fix = "mark the batch dimension dynamic: torch._dynamo.mark_dynamic(x, 0) before the first call " * 3
    report = CompileReport(handler="H", gate=[GateResult(4, "recompiles", guard, fix)],
                           problems=[Problem("compile", guard, fix)])
    text = str(report)
    assert max(len(line) for line in text.splitlines()) < 160  # was one line of ~700 characters
    words = " ".join(text.split())
    assert "expected 2, actual 4;" in words and "torch._dynamo.mark_dynamic(x, 0)" in words  # nothing lost


# ---------------------------------------------------------------------------- compiled against eager
def _steady_times(monkeypatch, compiled: list[float], eager: list[float]) -> None:
    """The steady calls timed as given: the compiled model's first, then eager's (``_timed``'s order)."""
    from handlerkit.diagnostics.compile import report as compile_module
    from handlerkit.diagnostics.timing import summarize

    given = iter([compiled, eager])
    monkeypatch.setattr(compile_module, "_timed", lambda call, warmup, repeat: summarize(next(given)))


def test_a_compiled_model_slower_than_eager_is_a_problem_with_its_fix(mlp_dir, monkeypatch):
    from handlerkit.worker import devices

    _steady_times(monkeypatch, [12.0, 12.5, 13.0, 12.4, 12.6], [0.5, 0.52, 0.49, 0.5, 0.51])
    monkeypatch.setattr(devices, "cpu_threads", lambda: devices.CpuThreads(2, 2, 2, 3.5))
    with warnings.catch_warnings():
        warnings.simplefilter("error", HandlerkitWarning)  # the load is said once: in the report
        report = report_of(harness(mlp_dir, eager_pt2(dynamic=True)), BATCH, repeat=5)
    assert report.speedup == pytest.approx(0.5 / 12.5)
    slower = [p for p in report.problems if p.check == "compile-slower"]
    assert [(p.severity, p.stage, p.message) for p in slower] == [
        ("warning", "inference", "the compiled model is slower than eager: inference takes 12.5 ms (p25-p75 "
         "12.4-12.6) compiled and 0.5 ms (p25-p75 0.5-0.51) eager (0.04x), a difference beyond the run's noise"),
    ]  # fmt: skip
    assert slower[0].fix == (
        "backend 'eager' generates no code (it checks tracing): use backend: inductor; dynamic: true compiles "
        "shape-generic code: leave it unset where shapes are fixed; or serve eager (pt2: {compile: {enable: false}} "
        "in model-config.yaml): a small model's work can cost less than the compiled code's guards and calls"
    )
    assert report.ok  # a warning: the compiled model serves, slowly
    text = " ".join(str(report).split())
    assert "speedup 0.04x over eager (slower: see the problems)" in text
    assert "compile-slower" in text and "p25-p75 ms" in text
    assert "1-minute load is 3.5" in text and "1-minute load is 3.5" in report._repr_mimebundle_()["text/html"]
    data = json.loads(json.dumps(report.to_dict()))
    assert (data["faster"]["best"], data["conditions"]["load_1min"]) == ("eager", 3.5)
    assert data["faster"]["reason"].startswith("eager is fastest: 0.5 ms (p25-p75 0.5-0.51) against compiled 12.5")
    assert data["steady_compiled"]["p25"] == 12.4


def test_compiled_and_eager_within_noise_is_no_problem_and_says_so(mlp_dir, monkeypatch):
    _steady_times(monkeypatch, [1.0, 1.4, 1.1, 1.2, 1.0], [1.0, 1.1, 0.9, 1.3, 1.2])
    report = report_of(harness(mlp_dir, eager_pt2()), BATCH, repeat=5)
    assert not any(p.check == "compile-slower" for p in report.problems)
    assert "speedup 1.00x over eager (within noise)" in repr(report)
    assert "compiled against eager: no clear winner (within noise: compiled 1.1 ms (p25-p75 1-1.2), eager 1.1 ms " \
           "(p25-p75 1-1.2))" in report.notes  # fmt: skip
    assert report.to_dict()["faster"]["best"] is None
