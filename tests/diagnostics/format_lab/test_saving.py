"""The format lab's ``save=`` (:mod:`handlerkit.diagnostics.format_lab.saving`): the chosen format
written into the model dir only when the dir, opened afresh, answers as eager did; refused,
with the dir unchanged, when it does not (answers differ, a dimension kept fixed, a handler
that calls the bare ONNX session)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from _format_lab import BATCH, CLASSIFIER, IMAGES, harness, ragged_batch, ranker_answers
from _new_users import RANKER_INFERENCE_LINE, ranker_dir, ranker_request

import handlerkit as hk
import handlerkit.formats
from conftest import MLP_MODEL_PY, eager_manifest, write_model_dir
from handlerkit._compare import same_output
from handlerkit.errors import HandlerkitError, HandlerkitWarning
from handlerkit.handlers.base import BaseHandler


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


def files_of(model_dir: Path) -> dict[str, bytes]:
    """Every file of the dir and its bytes (Python's own __pycache__ left out: no save writes it)."""
    return {
        str(p.relative_to(model_dir)): p.read_bytes()
        for p in sorted(model_dir.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


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
