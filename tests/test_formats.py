"""handlerkit.formats: every model format loads, runs through the default inference, matches eager."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import torch
from conftest import FORMAT_FILES, format_context

import handlerkit as hk
from handlerkit.errors import ModelLoadError
from handlerkit.formats import FORMATS, OnnxModel, detect_format, export_model, load_model
from handlerkit.handlers.base import BaseHandler

# format -> the loader recorded in the handler's decisions
LOADERS = {
    "eager": "TinyMLP() + torch.load(weights_only=True)",
    "torchscript": "torch.jit.load",
    "onnx": "onnxruntime.InferenceSession",
    "export": "torch.export.load(...).module()",
    "aoti": "torch._inductor.aoti_load_package",
    "aoti-so": "torch._export.aot_load",
}
FAST = ("eager", "torchscript", "onnx", "export")
AOTI = ("aoti", "aoti-so")


def check_matches_eager(fmt: str, directory: Path, reference: torch.nn.Module) -> BaseHandler:
    ctx = format_context(fmt, directory)
    handler = BaseHandler()
    handler.initialize(ctx)
    assert handler.decisions.model_format == fmt
    assert handler.decisions.loader == LOADERS[fmt]
    assert handler.decisions.model_path == str(directory / FORMAT_FILES[fmt][0])
    generator = torch.Generator().manual_seed(1)
    for batch_size in (1, 3):
        x = torch.randn(batch_size, 4, generator=generator)
        out = handler.handle(x.tolist(), ctx)  # the default preprocess / inference / postprocess
        assert isinstance(out, list) and len(out) == batch_size
        with torch.no_grad():
            expected = reference(x)
        torch.testing.assert_close(torch.tensor(out), expected, rtol=0, atol=1e-5)
    return handler


@pytest.mark.parametrize("fmt", FAST)
def test_format_loads_and_matches_eager(fmt, fast_format_dirs, mlp_reference):
    check_matches_eager(fmt, fast_format_dirs[fmt], mlp_reference[0])


@pytest.mark.slow
@pytest.mark.parametrize("fmt", AOTI)
def test_aoti_format_loads_and_matches_eager(fmt, aoti_format_dirs, mlp_reference):
    handler = check_matches_eager(fmt, aoti_format_dirs[fmt], mlp_reference[0])
    assert "AOTI_RUNTIME_CHECK_INPUTS" in handler.decisions.model_details["note"]


@pytest.mark.slow
def test_aoti_checks_input_shapes_when_asked(aoti_format_dirs, mlp_reference, monkeypatch):
    # The compiled model reads AOTI_RUNTIME_CHECK_INPUTS at its first call (each load of a .pt2
    # package is a fresh copy of its library). export_model turns off the batch >= 2 lower-bound
    # check, so a batch of 1 still passes; sizes outside the exported range are refused.
    monkeypatch.setenv("AOTI_RUNTIME_CHECK_INPUTS", "1")
    handler = check_matches_eager("aoti", aoti_format_dirs["aoti"], mlp_reference[0])
    assert handler.decisions.model_details["input_checks"] is True
    with pytest.raises(RuntimeError, match=r"input_handles\[0\]: dim value is too large at 0, expected to be <= 1024"):
        handler.inference(torch.zeros(1025, 4))
    with pytest.raises(RuntimeError, match=r"input_handles\[0\]"):
        handler.inference(torch.zeros(2, 5))


def test_every_format_is_tested():
    assert set(LOADERS) == set(FORMAT_FILES) == set(FORMATS) == set(FAST + AOTI)


def test_onnx_runs_through_the_default_inference(fast_format_dirs):
    ctx = format_context("onnx", fast_format_dirs["onnx"])
    handler = BaseHandler()
    handler.initialize(ctx)
    assert isinstance(handler.model, OnnxModel)
    assert handler.decisions.model_details["providers"] == ["CPUExecutionProvider"]
    out = handler.inference(torch.zeros(2, 4))
    assert isinstance(out, torch.Tensor) and out.shape == (2, 3) and out.device.type == "cpu"
    with pytest.raises(TypeError, match=r"takes 1 input"):
        handler.model(torch.zeros(1, 4), torch.zeros(1, 4))
    assert "input_0" in repr(handler.model)


def test_export_checks_input_shapes(fast_format_dirs):
    ctx = format_context("export", fast_format_dirs["export"])
    handler = BaseHandler()
    handler.initialize(ctx)
    with pytest.raises(Exception, match=r"size\(\)\[1\] == 4|shape"):
        handler.handle([[1.0, 2.0, 3.0]], ctx)


def test_export_model_accepts_a_batch_of_one(tmp_path, mlp_reference):
    # torch.export specialises a size-1 dimension; export_model must still give a dynamic batch.
    reference = mlp_reference[0]
    path = export_model(reference, (torch.randn(1, 4),), tmp_path / "one.pt2", "export")
    loaded = load_model("export", device=torch.device("cpu"), model_dir=str(tmp_path), model_pt_path=path)
    x = torch.randn(5, 4)
    torch.testing.assert_close(loaded.model(x), reference(x))


def test_state_dict_without_model_file_is_explained(fast_format_dirs, tmp_path):
    # A state_dict .pt without modelFile: TorchServe tries TorchScript; say what to do.
    ctx = hk.MockContext(model_dir=fast_format_dirs["eager"], gpu_id=None, manifest={"model": {"serializedFile": "model.pt"}})
    with pytest.raises(ModelLoadError, match=r"for a state_dict, add modelFile"):
        BaseHandler().initialize(ctx)


# ---------------------------------------------------------------------------------------------
# detect_format: TorchServe's rules, with errors that name the file and the fix
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("serialized", "model_file", "aot", "expected"),
    [
        ("model.pt", "model.py", False, "eager"),
        (None, "model.py", False, "eager"),
        ("model.pt2", "model.py", False, "eager"),  # modelFile wins, as in TorchServe
        ("model.pt", None, False, "torchscript"),
        ("model.pth", None, False, "torchscript"),
        ("model.onnx", None, False, "onnx"),
        ("MODEL.ONNX", None, False, "onnx"),
        ("model.so", None, True, "aoti-so"),
    ],
)
def test_detect_format(serialized, model_file, aot, expected):
    assert detect_format(serialized, model_file, aot_compile=aot) == expected


def test_detect_format_pt2_kinds(fast_format_dirs):
    assert detect_format(str(fast_format_dirs["export"] / "model.pt2"), None) == "export"


def test_detect_format_errors(tmp_path):
    with pytest.raises(ModelLoadError, match=r"neither a modelFile nor a serializedFile"):
        detect_format(None, None)
    with pytest.raises(ModelLoadError, match=r"model\.so.*pt2: \{export: \{aot_compile: true\}\}"):
        detect_format(str(tmp_path / "model.so"), None)
    with pytest.raises(ModelLoadError, match=r"'absent\.pt2' but .* does not exist; fix"):
        detect_format(str(tmp_path / "absent.pt2"), None)
    (tmp_path / "text.pt2").write_text("not a zip")
    with pytest.raises(ModelLoadError, match=r"text\.pt2 is not a \.pt2 archive"):
        detect_format(str(tmp_path / "text.pt2"), None)
    with zipfile.ZipFile(tmp_path / "other.pt2", "w") as z:
        z.writestr("other/readme.txt", "hello")
    with pytest.raises(ModelLoadError, match=r"other\.pt2 is a \.pt2 archive with neither"):
        detect_format(str(tmp_path / "other.pt2"), None)


def test_unknown_format_names():
    with pytest.raises(ValueError, match="unknown model format 'tflite'"):
        load_model("tflite", device=torch.device("cpu"), model_dir=".", model_pt_path="x.tflite")
    with pytest.raises(ValueError, match="unknown model format 'tflite'"):
        export_model(torch.nn.Linear(1, 1), (torch.zeros(2, 1),), "x.tflite", "tflite")


def test_corrupt_serialized_files(tmp_path):
    for name, fmt, pattern in (
        ("model.pt", "torchscript", r"torch\.jit\.load\(.*model\.pt"),
        ("model.onnx", "onnx", r"onnxruntime could not open .*model\.onnx"),
    ):
        (tmp_path / name).write_bytes(b"\x00garbage")
        with pytest.raises(ModelLoadError, match=pattern):
            load_model(fmt, device=torch.device("cpu"), model_dir=str(tmp_path), model_pt_path=str(tmp_path / name))
