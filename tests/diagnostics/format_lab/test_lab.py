"""Harness.compare_formats: every format inside the handler's own pre- and postprocessing.

The fixture classifier goes through eager, TorchScript, ONNX Runtime and torch.export (about
10 s: ONNX's exporter takes 3); the failure cases use a four-input MLP. AOTInductor compiles
C++ and runs under ``slow``. The ragged-input cases use the ranker of tests/_new_users.py (item
lists of different lengths, several inputs, its own ``inference``): a few seconds each.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from _new_users import RANKER_INFERENCE_LINE, ranker_dir, ranker_request

import handlerkit as hk
import handlerkit.formats
from conftest import ARGMAX_MODEL_PY, MLP_MODEL_PY, eager_manifest, write_model_dir
from handlerkit._compare import same_output
from handlerkit.diagnostics.format_lab import DEFAULT_FORMATS, FormatReport, FormatRow
from handlerkit.diagnostics.timing import summarize
from handlerkit.errors import ConfigError, HandlerkitError, HandlerkitWarning
from handlerkit.handlers.base import BaseHandler

ROOT = Path(__file__).resolve().parents[3]
CLASSIFIER = ROOT / "fixtures" / "models" / "image_classifier"
IMAGES = [ROOT / "fixtures" / "images" / f"{name}.png" for name in ("circle", "cross", "square")]

#: A data-dependent branch on line 11: torch.export and the ONNX exporter refuse it.
BRANCH_MODEL_PY = '''\
import torch


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        y = self.fc(x)
        if y.sum() > 0:
            y = y * 2
        return y
'''
BATCH = [[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 2.0, 0.0]]


def harness(model_dir: Path, **config: Any) -> hk.Harness:
    ctx = hk.MockContext(model_dir=model_dir, gpu_id=None, manifest=eager_manifest(), model_yaml_config=config)
    return hk.Harness(BaseHandler, ctx)


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


def test_report_without_timed_rows_has_no_best():
    report = FormatReport("H", 2, rows=[FormatRow("eager", exported=True, answers_agree=True)])
    assert report.ok and report.best is None
    with pytest.raises(KeyError, match="no 'onnx' row"):
        report.row("onnx")


def _timed(fmt: str, *samples: float) -> FormatRow:
    return FormatRow(fmt, exported=True, answers_agree=True, steady=summarize(samples))


def test_the_best_is_declared_only_beyond_the_runs_noise():
    noisy = FormatReport("H", 2, rows=[_timed("eager", 1.0, 1.6, 1.2, 1.1, 1.15), _timed("onnx", 0.9, 1.5, 1.2, 1.0, 1.1),
                                       _timed("torchscript", 3.0, 3.1, 3.2, 3.0)])  # fmt: skip
    assert noisy.best is None and noisy.verdict.within_noise == ("onnx", "eager")  # torchscript: clearly slower
    said = "no clear winner (within noise: onnx 1.1 ms (p25-p75 1-1.2), eager 1.15 ms (p25-p75 1.1-1.2))"
    assert repr(noisy) == f"<FormatReport formats of H (batch 2, cpu): {said}>"
    assert said in noisy._repr_mimebundle_()["text/html"]
    assert (noisy.to_dict()["best"], noisy.to_dict()["verdict"]) == (None, said)
    assert "p25-p75 ms" in str(noisy) and "3-3.12" in str(noisy)

    clear = FormatReport("H", 2, rows=[_timed("eager", 2.0, 2.1, 2.2), _timed("onnx", 1.0, 1.1, 1.0)])
    assert clear.best is clear.row("onnx") and clear.to_dict()["best"] == "onnx"
    assert repr(clear) == "<FormatReport formats of H (batch 2, cpu): best: onnx>"


def test_a_lead_measured_on_a_busy_machine_is_not_called_best():
    from handlerkit.diagnostics.noise import Conditions
    from handlerkit.worker import devices

    rows = [_timed("eager", 2.0, 2.1, 2.2), _timed("onnx", 1.0, 1.1, 1.0)]
    busy = FormatReport("H", 2, rows=rows, conditions=Conditions(devices.CpuThreads(1, 1, 2, 4.2)))
    assert repr(busy) == (
        "<FormatReport formats of H (batch 2, cpu): fastest here: onnx, measured at load 4.2 on 2 core(s) "
        "(time it on a quiet machine to call it best)>"
    )
    quiet = FormatReport("H", 2, rows=rows, conditions=Conditions(devices.CpuThreads(1, 1, 2, 0.4)))
    assert repr(quiet) == "<FormatReport formats of H (batch 2, cpu): best: onnx>"


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


def quiet_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """No load warning: a test that counts the lab's warnings must not count the machine's load."""
    from handlerkit.worker import devices

    monkeypatch.setattr(devices, "cpu_threads", lambda: devices.CpuThreads(1, 1, 2, 0.0))


def test_save_writes_the_chosen_format_into_the_model_dir(tmp_path, monkeypatch):
    quiet_machine(monkeypatch)
    model_dir = write_model_dir(tmp_path / "mlp", MLP_MODEL_PY, manifest=eager_manifest())
    h = harness(model_dir)
    eager = h.run(BATCH).output
    with warnings.catch_warnings():
        warnings.simplefilter("error", HandlerkitWarning)  # TorchServe's own BaseHandler serves TorchScript
        report = h.compare_formats(BATCH, formats=["export"], save="torchscript", repeat=2, warmup=0)

    assert [r.format for r in report.rows] == ["eager", "export", "torchscript"]  # the saved one is tried
    assert report.saved is not None and report.saved.artifact == "model.torchscript.pt"
    assert report.to_dict()["saved"]["model"]["serializedFile"] == "model.torchscript.pt"
    assert any(note.startswith(f"saved torchscript into {model_dir}") for note in report.notes)
    served = hk.Harness.open(model_dir, BaseHandler)
    assert same_output(served.run(BATCH).output, eager, 1e-5, 1e-5)
    assert served.handler.decisions.model_format == "torchscript"


def test_saving_a_format_torchserve_does_not_serve_warns_with_the_fix(tmp_path, monkeypatch):
    quiet_machine(monkeypatch)
    model_dir = write_model_dir(tmp_path / "mlp", MLP_MODEL_PY, manifest=eager_manifest())
    h = harness(model_dir)
    with pytest.warns(HandlerkitWarning, match=r"^handlerkit: saved export into mlp/, which TorchServe 0.12's own "
                      r"BaseHandler does not serve: TorchServe 0.12 does not load a .pt2") as caught:  # fmt: skip
        report = h.compare_formats(BATCH, formats=[], save="export", repeat=1, warmup=0)
    assert len(caught) == 1 and caught[0].filename == __file__  # once, pointing at the caller
    assert "fix: serve the dir with a handler that subclasses hk.BaseHandler" in str(caught[0].message)
    assert report.saved is not None and not report.saved.torchserve_serves
    assert hk.Harness.open(model_dir, BaseHandler).run(BATCH).problems == []  # handlerkit serves it


def test_save_refuses_a_format_that_disagrees_and_an_archive(tmp_path, monkeypatch):
    load_model = handlerkit.formats.load_model

    def perturbed(fmt: str, **kwargs: Any) -> Any:
        loaded = load_model(fmt, **kwargs)
        inner = loaded.model
        loaded.model = lambda x: inner(x) + 0.5
        return loaded

    model_dir = write_model_dir(tmp_path / "mlp", MLP_MODEL_PY, manifest=eager_manifest())
    monkeypatch.setattr(handlerkit.formats, "load_model", perturbed)
    report = harness(model_dir).compare_formats(BATCH, formats=[], save="export", repeat=1, warmup=0)
    assert report.saved is None and not report.ok
    assert any(n.startswith(f"export was not saved into {model_dir}: answers differ at [0][0]") for n in report.notes)
    assert not (model_dir / "model.export.pt2").exists() and "serializedFile" in json.loads(
        (model_dir / "MAR-INF" / "MANIFEST.json").read_text()
    )["model"]



def test_save_refuses_a_model_opened_from_an_archive(tmp_path):
    from handlerkit.archive import build

    h = hk.Harness.open(build(CLASSIFIER, tmp_path / "store"))
    with pytest.raises(HandlerkitError, match=r"save='onnx' writes into the handler's model dir, and .* from an archive"):
        h.compare_formats(hk.batch(hk.Request.from_file(IMAGES[0])), save="onnx")


# ---------------------------------------------------------------------------------------------
# Ragged inputs: the ranker of tests/_new_users.py pads each batch's item lists to the longest,
# so item_ids and mask are [n, L] with L the batch's longest list.
# ---------------------------------------------------------------------------------------------

SHORT, LONG = ranker_request(1, [3, 5]), ranker_request(2, [1, 2, 3, 4, 5, 6, 7])


def ragged_batch() -> hk.Batch:
    return hk.batch(hk.Request.json(SHORT), hk.Request.json(LONG))


def files_of(model_dir: Path) -> dict[str, bytes]:
    """Every file of the dir and its bytes (Python's own __pycache__ left out: no save writes it)."""
    return {
        str(p.relative_to(model_dir)): p.read_bytes()
        for p in sorted(model_dir.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def ranker_answers(tmp_path: Path, *requests: dict) -> list:
    """What the eager ranker answers, each request alone (from a dir of its own, never saved into)."""
    h = hk.Harness.open(ranker_dir(tmp_path / "eager-ranker", base="handlerkit"))
    return [h.run(hk.batch(hk.Request.json(r))).output[0] for r in requests]


def test_a_ragged_onnx_save_serves_requests_of_other_lengths(tmp_path):
    model_dir = ranker_dir(tmp_path / "recs", base="handlerkit")
    h = hk.Harness.open(model_dir)
    with pytest.warns(HandlerkitWarning, match="saved onnx into recs/, which TorchServe 0.12's own BaseHandler"):
        report = h.compare_formats(ragged_batch(), formats=[], save="onnx", repeat=1, warmup=0)

    # Each request alone pads to its own length: item_ids and mask dim 1 vary (2 and 7).
    assert report.dims is not None and report.dims.seen == {1: [1], 2: [1]}
    assert report.dims.sizes[(1, 1)] == [2, 7] and report.dims.names == ["user_ids", "item_ids", "mask"]
    onnx = report.row("onnx")
    assert onnx.agrees and onnx.dynamic_batch is True and onnx.dynamic_dims == ["item_ids dim 1", "mask dim 1"]
    assert onnx.dims == {"user_ids": ["batch"], "item_ids": ["batch", "*"], "mask": ["batch", "*"]}
    assert onnx.fixed_dims == []
    assert report.saved is not None and report.refused is None
    assert ("Opened afresh, the saved dir answered the batch, request 0 alone (item_ids dim 1 = 2, mask dim 1 = 2), "
            "the batch made longer (item_ids dim 1 = 8, mask dim 1 = 8)") in report.saved.notes  # fmt: skip
    text = str(report)
    assert "the dimensions each takes" in text and "item_ids [batch, *]" in text
    assert "input dimensions that vary besides the batch: item_ids dim 1 (sizes 2, 7: seen in the batch)" in text
    data = json.loads(json.dumps(report.to_dict()))
    assert data["dims"]["dynamic"] == {"item_ids": [1], "mask": [1]} and data["rows"][1]["dims"]["mask"] == [
        "batch",
        "*",
    ]

    # The saved dir, opened again, answers lengths the lab never sent, alone and batched.
    served = hk.Harness.open(model_dir)
    three, eleven = ranker_request(4, [9, 8, 7]), ranker_request(5, list(range(11)))
    answers = served.run(hk.batch(hk.Request.json(three), hk.Request.json(eleven))).output
    assert served.handler.decisions.model_format == "onnx"
    assert same_output(answers, ranker_answers(tmp_path, three, eleven), 1e-3, 1e-3)


@pytest.mark.parametrize(("fmt", "artifact"), [("onnx", "model.onnx"), ("export", "model.export.pt2")])
def test_a_save_that_keeps_a_varying_dimension_fixed_is_refused_and_the_dir_is_unchanged(tmp_path, fmt, artifact):
    model_dir = ranker_dir(tmp_path / "recs", base="handlerkit")
    h = hk.Harness.open(model_dir)
    before = files_of(model_dir)
    # Declared fixed (no dim of item_ids or mask varies), though the batch's requests vary dim 1.
    report = h.compare_formats(
        ragged_batch(), formats=[], save=fmt, repeat=1, warmup=0, dynamic_shapes={"item_ids": [], "mask": []}
    )

    assert files_of(model_dir) == before  # nothing written: no artifact, no manifest, no record
    row = report.row(fmt)
    assert row.agrees and row.dynamic_dims == []  # the batch itself is answered: the lab's old verdict
    assert row.dims == {"user_ids": ["batch"], "item_ids": ["batch", "=7"], "mask": ["batch", "=7"]}
    assert row.fixed_dims[0].startswith("item_ids dim 1 fixed = 7 (2, 8 refused: exported for ")
    assert report.saved is None and report.refused is not None
    assert report.refused.reason == (
        f"{artifact} does not take request 0 alone (item_ids dim 1 = 2, mask dim 1 = 2): it was exported for "
        "item_ids dim 1 = 7 and mask dim 1 = 7"
    )
    assert report.refused.fix == (
        "dynamic_shapes= keeps item_ids dim 1, mask dim 1 fixed, and the requests vary them: declare them dynamic, "
        "dynamic_shapes={'item_ids': [1], 'mask': [1]} (handlerkit formats: --dynamic item_ids:1,mask:1)"
    )
    assert f"not saved: {artifact} does not take request 0 alone" in repr(report)
    assert any(n.startswith(f"{fmt} was not saved into {model_dir}: {artifact} does not take") for n in report.notes)
    assert report.to_dict()["refused"]["fix"] == report.refused.fix


@pytest.mark.torchserve
def test_a_handler_whose_inference_calls_the_bare_onnx_session_is_refused(tmp_path):
    # TorchServe's BaseHandler keeps an .onnx as the bare InferenceSession; the ranker's own
    # inference calls self.model(*inputs), which the lab's OnnxModel takes but the session does not.
    model_dir = ranker_dir(tmp_path / "recs", base="torchserve")
    h = hk.Harness.open(model_dir)
    before = files_of(model_dir)
    report = h.compare_formats(ragged_batch(), formats=[], save="onnx", repeat=1, warmup=0)

    assert files_of(model_dir) == before
    assert report.row("onnx").agrees and report.saved is None and report.refused is not None
    assert report.refused.reason == (
        f"RecsHandler.inference (handler.py:{RANKER_INFERENCE_LINE}: return self.model(*inputs), inputs[1], "
        "inputs[2]) cannot call the model as the saved dir loads it: TypeError: 'InferenceSession' object is not "
        "callable; the dir loads model.onnx as onnxruntime.InferenceSession (TorchServe's BaseHandler keeps the "
        "bare session)"
    )
    assert report.refused.fix.startswith(
        "subclass handlerkit's BaseHandler in place of TorchServe's (from handlerkit.handlers import BaseHandler): "
        "it loads model.onnx as a model called with the tensors, as the lab ran it; or call self.model.run(None, "
        "{name: array}) in RecsHandler.inference; or save torchscript"
    )


def configured_ranker(tmp_path: Path, dynamic_shapes: str) -> Path:
    """The ranker with ``handler: {dynamic_shapes: ...}`` in its model config."""
    model_dir = ranker_dir(tmp_path / "recs", base="handlerkit")
    (model_dir / "model-config.yaml").write_text(f"handler:\n  dynamic_shapes: {dynamic_shapes}\n")
    manifest_path = model_dir / "MAR-INF" / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["model"]["configFile"] = "model-config.yaml"
    manifest_path.write_text(json.dumps(manifest))
    return model_dir


def test_dimensions_declared_in_the_model_config_are_exported_dynamic(tmp_path):
    # Both lists have 4 items: the batch shows nothing varying, the config says item lists do.
    model_dir = configured_ranker(tmp_path, "{item_ids: [1], mask: [1]}")
    h = hk.Harness.open(model_dir)
    four = [ranker_request(1, [1, 2, 3, 4]), ranker_request(2, [5, 6, 7, 8])]
    with pytest.warns(HandlerkitWarning, match="saved export into recs/"):
        report = h.compare_formats(hk.batch(*map(hk.Request.json, four)), formats=[], save="export", repeat=1, warmup=0)

    assert report.dims is not None and report.dims.seen == {} and report.dims.declared == {1: [1], 2: [1]}
    assert report.dims.source == "model-config.yaml handler.dynamic_shapes"
    assert report.row("export").dynamic_dims == ["item_ids dim 1", "mask dim 1"]
    assert report.row("export").dims["item_ids"] == ["batch", "*"]
    assert report.saved is not None, report.refused
    assert "the batch made longer (item_ids dim 1 = 5, mask dim 1 = 5)" in report.saved.notes[-1]
    two = ranker_request(3, [10, 11])
    assert same_output(hk.Harness.open(model_dir).run(hk.batch(hk.Request.json(two))).output,
                       ranker_answers(tmp_path, two), 1e-3, 1e-3)  # fmt: skip


def test_dynamic_shapes_must_name_the_models_inputs(tmp_path):
    h = hk.Harness.open(ranker_dir(tmp_path / "recs", base="handlerkit"))
    with pytest.raises(ValueError, match=r"^dynamic_shapes= names input 'items' \(did you mean 'item_ids'\?\), and "
                       r"the model takes 3: user_ids, item_ids, mask \(by name"):  # fmt: skip
        h.compare_formats(ragged_batch(), formats=[], dynamic_shapes={"items": [1]})
    with pytest.raises(ValueError, match=r"^dynamic_shapes=: item_ids has dims 1 to 1 besides the batch \(its shape "
                       r"in the batch is \[2, 7\]\), not \[2\]"):  # fmt: skip
        h.compare_formats(ragged_batch(), formats=[], dynamic_shapes={1: [2]})
    configured = hk.Harness.open(configured_ranker(tmp_path / "configured", "{items: [1]}"))
    with pytest.raises(ConfigError, match=r"^model-config.yaml handler.dynamic_shapes names input 'items' \(did you"):
        configured.compare_formats(ragged_batch(), formats=[])


@pytest.mark.slow
def test_a_ragged_aoti_save_serves_requests_of_other_lengths(tmp_path):
    model_dir = ranker_dir(tmp_path / "recs", base="handlerkit")
    with pytest.warns(HandlerkitWarning, match="saved aoti into recs/"):
        report = hk.Harness.open(model_dir).compare_formats(ragged_batch(), formats=[], save="aoti", repeat=1, warmup=0)
    aoti = report.row("aoti")
    assert aoti.dynamic_dims == ["item_ids dim 1", "mask dim 1"] and aoti.dims["mask"] == ["batch", "*"]
    assert report.saved is not None, report.refused
    three = ranker_request(4, [9, 8, 7])
    served = hk.Harness.open(model_dir)
    answers = served.run(hk.batch(hk.Request.json(three))).output
    assert served.handler.decisions.model_format == "aoti"
    assert same_output(answers, ranker_answers(tmp_path, three), 1e-3, 1e-3)
