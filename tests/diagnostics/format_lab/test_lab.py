"""Harness.compare_formats: every format inside the handler's own pre- and postprocessing.

The fixture classifier goes through eager, TorchScript, ONNX Runtime and torch.export (about
10 s: ONNX's exporter takes 3); the failure cases use a four-input MLP. AOTInductor compiles
C++ and runs under ``slow``. What ``save=`` writes is in test_saving.py, the input dimensions in
test_shapes.py, the report's verdict in test_report.py.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest
from _format_lab import BATCH, BRANCH_MODEL_PY, CLASSIFIER, IMAGES, harness

import handlerkit as hk
import handlerkit.formats
from conftest import ARGMAX_MODEL_PY, MLP_MODEL_PY, write_model_dir
from handlerkit.diagnostics.format_lab import DEFAULT_FORMATS, FormatReport
from handlerkit.errors import HandlerkitError, HandlerkitWarning


def test_fixture_classifier_agrees_in_every_default_format():
    ctx = hk.MockContext.from_model_dir(CLASSIFIER, gpu_id=None)
    h = hk.Harness("image_classifier", ctx)
    batch = hk.batch(*(hk.Request.from_file(p) for p in IMAGES))
    h.initialize()
    model = h.handler.model
    report = h.compare_formats(batch, repeat=3, warmup=1)

    assert isinstance(report, FormatReport) and report.ok
    assert [r.format for r in report.rows] == list(DEFAULT_FORMATS)
    for row in report.rows:
        assert row.agrees, (row.format, row.error, row.difference)
        assert row.max_abs_diff is not None and row.max_abs_diff < 1e-4
        assert row.accepted_sizes == [1, 3, 4], (row.format, row.batch_sizes)
        assert row.steady is not None and row.steady.n == 3
        assert row.first_call_ms is not None and row.first_call_ms > 0
    for row in report.rows[1:]:
        assert row.export_s is not None and row.load_s is not None
        assert row.artifact_bytes is not None and row.artifact_bytes > 1000
    assert report.row("torchscript").how == "torch.jit.script"
    assert report.row("onnx").dynamic_batch is True and report.row("export").dynamic_batch is True
    assert report.best == (None if report.verdict.best is None else report.row(report.verdict.best))
    assert h.handler.model is model  # put back

    text = str(report)
    assert "format" in text and "max abs diff" in text and "torch.jit.script" in text
    assert "<table" in report._repr_mimebundle_()["text/html"]
    data = json.loads(json.dumps(report.to_dict()))
    assert data["ok"] is True and data["verdict"] == report.verdict.reason
    assert data["best"] == (None if report.best is None else report.best.format)
    assert data["rows"][2]["batch_sizes"] == {"1": "ok", "3": "ok", "4": "ok"}


def test_a_model_that_does_not_export_names_its_line_and_the_fix(tmp_path, capfd):
    h = harness(write_model_dir(tmp_path / "branchy", BRANCH_MODEL_PY))
    report = h.compare_formats(BATCH, formats=["export", "onnx", "torchscript"], repeat=2, warmup=0)
    out, err = capfd.readouterr()

    # The exporters' graph dumps and warnings stay on the rows: nothing reaches a cell or terminal.
    assert "y.sum()" not in out + err and "def forward" not in out + err, err[-2000:]
    assert "if y.sum() > 0" in report.row("export").log and "if y.sum() > 0" in report.row("onnx").log
    assert "kept in each row's .log" in " ".join(report.notes)

    assert not report.ok
    for fmt in ("export", "onnx"):
        row = report.row(fmt)
        assert not row.exported and not row.agrees and row.steady is None
        assert row.failure is not None
        assert row.failure.error.startswith("GuardOnDataDependentSymNode: Could not guard on data-dependent expression")
        assert row.failure.where == "model.py:11"
        assert row.failure.source == "if y.sum() > 0:"
        assert row.failure.fix.startswith("the model branches on a tensor's value at model.py:11: compute both sides")
    # TorchScript scripts the branch (it keeps both sides), so its answers agree.
    assert report.row("torchscript").agrees and report.row("torchscript").how == "torch.jit.script"
    assert set(report.verdict.within_noise) == {"eager", "torchscript"}  # two calls each measure no noise
    assert report.best is None and "too few timed calls" in report.verdict.reason
    text = str(report)
    assert "not exported: export, onnx" in text and "if y.sum() > 0:" in text


def test_a_perturbed_format_disagrees_and_the_report_says_so(tmp_path, monkeypatch):
    load_model = handlerkit.formats.load_model

    def perturbed(fmt: str, **kwargs: Any) -> Any:
        loaded = load_model(fmt, **kwargs)
        if fmt == "torchscript":
            inner = loaded.model
            loaded.model = lambda x: inner(x) + 0.5
        return loaded

    monkeypatch.setattr(handlerkit.formats, "load_model", perturbed)
    h = harness(write_model_dir(tmp_path / "mlp", MLP_MODEL_PY))
    report = h.compare_formats(BATCH, formats=["torchscript", "export"], repeat=2, warmup=0)

    bad = report.row("torchscript")
    assert bad.exported and bad.answers_agree is False and not bad.agrees
    assert bad.max_abs_diff == pytest.approx(0.5, abs=1e-5)
    assert bad.difference is not None and bad.difference.startswith("answers differ at [0][0] (number): eager ")
    assert set(bad.batch_sizes.values()) == {"wrong output"}
    assert report.row("export").agrees
    assert not report.ok and report.to_dict()["ok"] is False
    assert report.verdict.fastest in ("eager", "export")  # never the format that disagrees
    assert "answers differ or fail: torchscript" in repr(report)
    assert "DIFFER" in str(report)


def test_torchscript_falls_back_to_trace_and_says_why(tmp_path):
    # TorchServe's argmax test model takes *input, which torch.jit.script refuses.
    h = harness(write_model_dir(tmp_path / "argmax", ARGMAX_MODEL_PY))
    report = h.compare_formats([[1.0, 2.0], [3.0, 1.0]], formats=["torchscript"], repeat=2, warmup=0)
    row = report.row("torchscript")
    assert row.agrees, (row.error, row.difference)
    assert row.how.startswith("torch.jit.trace (script failed at model.py:5: ")
    assert "a trace freezes any branch on a tensor's value" in row.how


def test_compile_uses_the_pt2_settings(tmp_path):
    h = harness(write_model_dir(tmp_path / "mlp", MLP_MODEL_PY), pt2={"compile": {"enable": True, "backend": "eager"}})
    report = h.compare_formats(BATCH, formats=["compile"], repeat=2, warmup=1)
    row = report.row("compile")
    assert row.how == "torch.compile(backend='eager')"
    assert row.agrees and row.accepted_sizes == [1, 2, 3]


@pytest.mark.slow
def test_aoti_package_agrees(tmp_path):
    h = harness(write_model_dir(tmp_path / "mlp", MLP_MODEL_PY))
    report = h.compare_formats(BATCH, formats=["aoti"], repeat=2, warmup=0)
    row = report.row("aoti")
    assert row.agrees and row.dynamic_batch is True and row.accepted_sizes == [1, 2, 3]
    assert row.artifact_bytes is not None and row.artifact_bytes > 10_000


def test_unknown_format_is_refused_with_a_suggestion(tmp_path):
    h = harness(write_model_dir(tmp_path / "mlp", MLP_MODEL_PY))
    with pytest.raises(ValueError, match=r"unknown format 'onx'.*'onnx'"):
        h.compare_formats(BATCH, formats=["onx"])
    with pytest.raises(ValueError, match=r"repeat must be >= 1"):
        h.compare_formats(BATCH, repeat=0)


def test_a_function_handler_has_no_model_to_export():
    h = hk.Harness(lambda data, context: data, hk.MockContext())
    with pytest.raises(HandlerkitError, match="function handler: compare_formats finds the model as handler.model"):
        h.compare_formats(BATCH)


def test_the_lab_says_what_it_was_timed_under_and_warns_on_a_busy_machine(tmp_path, monkeypatch):
    from handlerkit.worker import devices

    monkeypatch.setattr(devices, "cpu_threads", lambda: devices.CpuThreads(4, 4, 2, 0.5))
    h = harness(write_model_dir(tmp_path / "mlp", MLP_MODEL_PY))
    with warnings.catch_warnings():
        warnings.simplefilter("error", HandlerkitWarning)  # said once: in the report's notes
        report = h.compare_formats(BATCH, formats=[], repeat=3, warmup=0)
    warning = "torch runs 4 intra-op threads on 2 usable core(s): they take turns, and timings measure the " \
              "waiting; torch.set_num_threads(2)"  # fmt: skip
    noted = ["torch: 4 intra-op / 4 inter-op threads, 2 usable core(s), 1-minute load 0.5", warning]
    assert report.notes[:2] == noted and f"note: {warning}" in " ".join(str(report).split())
    assert warning in report._repr_mimebundle_()["text/html"]
    assert report.to_dict()["conditions"] == {"intra_op_threads": 4, "inter_op_threads": 4, "cores": 2,
                                              "load_1min": 0.5, "warning": warning}  # fmt: skip
