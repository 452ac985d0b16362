"""handlerkit.formats.export: a model written in each format, with a dynamic batch (a batch of
one too), scripted or traced, and the pip command when ONNX's exporters are missing."""

from __future__ import annotations

import sys

import pytest
import torch

from handlerkit.formats import export_model, load_model


def test_export_model_accepts_a_batch_of_one(tmp_path, mlp_reference):
    # torch.export specialises a size-1 dimension; export_model must still give a dynamic batch.
    reference = mlp_reference[0]
    path = export_model(reference, (torch.randn(1, 4),), tmp_path / "one.pt2", "export")
    loaded = load_model("export", device=torch.device("cpu"), model_dir=str(tmp_path), model_pt_path=path)
    x = torch.randn(5, 4)
    torch.testing.assert_close(loaded.model(x), reference(x))


@pytest.mark.parametrize("missing", ["onnx", "onnxscript"])
def test_onnx_export_without_its_packages_names_the_pip_command(tmp_path, monkeypatch, missing):
    monkeypatch.setitem(sys.modules, missing, None)
    with pytest.raises(ImportError, match=rf"^exporting to ONNX needs {missing}: pip install 'handlerkit\[onnx\]'$"):
        export_model(torch.nn.Linear(4, 3), (torch.zeros(2, 4),), tmp_path / "m.onnx", "onnx")
    assert not (tmp_path / "m.onnx").exists()


def test_export_model_scripts_when_asked(tmp_path, mlp_reference):
    reference = mlp_reference[0]
    path = export_model(reference, (torch.randn(2, 4),), tmp_path / "scripted.pt", "torchscript", torchscript="script")
    loaded = load_model("torchscript", device=torch.device("cpu"), model_dir=str(tmp_path), model_pt_path=path)
    assert "def forward" in loaded.model.code  # scripted: the source, not a recorded trace
    x = torch.randn(5, 4)
    torch.testing.assert_close(loaded.model(x), reference(x))
    with pytest.raises(ValueError, match=r"torchscript must be 'trace' or 'script': got 'jit'"):
        export_model(reference, (x,), tmp_path / "x.pt", "torchscript", torchscript="jit")
