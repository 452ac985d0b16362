"""handlerkit.formats.load: every model format loads, runs through the default inference, matches eager;
TorchServe's rules for which format a manifest names, and load errors that name the file and the fix."""

from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import handlerkit as hk
from conftest import FORMAT_FILES, format_context
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
    assert "inputs=['x']" in repr(handler.model)  # named after forward's parameter


def test_export_checks_input_shapes(fast_format_dirs):
    ctx = format_context("export", fast_format_dirs["export"])
    handler = BaseHandler()
    handler.initialize(ctx)
    with pytest.raises(Exception, match=r"size\(\)\[1\] == 4|shape"):
        handler.handle([[1.0, 2.0, 3.0]], ctx)


def test_state_dict_without_model_file_is_explained(fast_format_dirs, tmp_path):
    # A state_dict .pt without modelFile: TorchServe tries TorchScript; say what to do.
    ctx = hk.MockContext(model_dir=fast_format_dirs["eager"], gpu_id=None, manifest={"model": {"serializedFile": "model.pt"}})
    with pytest.raises(ModelLoadError, match=r"torch\.jit\.load\(.*model\.pt'\) failed: .*TorchServe reads a \.pt file as TorchScript") as info:
        BaseHandler().initialize(ctx)
    assert info.value.fix == "for a state_dict, add modelFile (the .py that defines the model class) to the manifest"
    assert info.value.path == str(fast_format_dirs["eager"] / "model.pt")


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
        ("model.pth", "model.py", False, "eager"),
        ("model.onnx", None, False, "onnx"),
        ("model.so", None, True, "aoti-so"),
    ],
)
def test_detect_format(serialized, model_file, aot, expected):
    assert detect_format(serialized, model_file, aot_compile=aot) == expected


@pytest.mark.parametrize("name", ["model.pth", "model.bin", "model.PT", "model.ts", "MODEL.ONNX", "model.SO"])
def test_a_name_torchserve_does_not_load_without_model_file_is_refused(name):
    # BaseHandler.initialize tests str.endswith(".pt"/".onnx"/".so"); anything else without a
    # modelFile ends in RuntimeError("No model weights could be loaded").
    with pytest.raises(
        ModelLoadError,
        match=rf"^serializedFile '{re.escape(name)}' without a modelFile is no model TorchServe can load: it reads "
        r"such a file as TorchScript only when its name ends in '\.pt' \(case-sensitive\), and otherwise fails "
        r"with RuntimeError 'No model weights could be loaded'\n  fix: ",
    ) as info:
        detect_format(f"/models/{name}", None, aot_compile=True)
    assert info.value.fix == "add modelFile (and the model.py defining the class) to the manifest"
    assert info.value.path == f"/models/{name}"


def test_detect_format_pt2_kinds(fast_format_dirs):
    assert detect_format(str(fast_format_dirs["export"] / "model.pt2"), None) == "export"


def test_detect_format_errors(tmp_path):
    with pytest.raises(ModelLoadError, match=r"^the manifest names neither a modelFile nor a serializedFile, so there is no model to load\n  fix: ") as info:
        detect_format(None, None)
    assert info.value.fix == (
        "add 'serializedFile' (and 'modelFile' for an eager model) to MAR-INF/MANIFEST.json, "
        "or override initialize() in your handler"
    )
    with pytest.raises(ModelLoadError, match=r"model\.so.*pt2: \{export: \{aot_compile: true\}\}.*that is not set\n  fix: ") as info:
        detect_format(str(tmp_path / "model.so"), None)
    assert info.value.fix.startswith("add 'pt2: {export: {aot_compile: true}}' to model-config.yaml")
    with pytest.raises(ModelLoadError, match=r"serializedFile is 'absent\.pt2' but .*absent\.pt2 does not exist\n  fix: ") as info:
        detect_format(str(tmp_path / "absent.pt2"), None)
    assert info.value.fix == "put the file in the model dir or correct MAR-INF/MANIFEST.json"
    assert info.value.path == str(tmp_path / "absent.pt2")
    (tmp_path / "text.pt2").write_text("not a zip")
    with pytest.raises(ModelLoadError, match=r"text\.pt2 is not a \.pt2 archive \(not a zip file\)\n  fix: ") as info:
        detect_format(str(tmp_path / "text.pt2"), None)
    assert info.value.fix.startswith("write it with torch._inductor.aoti_compile_and_package or torch.export.save")
    with zipfile.ZipFile(tmp_path / "other.pt2", "w") as z:
        z.writestr("other/readme.txt", "hello")
    with pytest.raises(ModelLoadError, match=r"other\.pt2 is a \.pt2 archive with neither"):
        detect_format(str(tmp_path / "other.pt2"), None)


def test_no_error_message_carries_its_fix_as_text(tmp_path):
    # The fix is data (error.fix): messages never spell it "fix:" / "Fix:" themselves.
    (tmp_path / "text.pt2").write_text("not a zip")
    cases = [(None, None), (str(tmp_path / "model.so"), None), (str(tmp_path / "absent.pt2"), None), (str(tmp_path / "text.pt2"), None)]
    for serialized, model_file in cases:
        with pytest.raises(ModelLoadError) as info:
            detect_format(serialized, model_file)
        assert "fix" not in info.value.message.lower() and info.value.fix
    with pytest.raises(ModelLoadError, match=r"format 'onnx' needs a serializedFile, and none was given") as info:
        load_model("onnx", device=torch.device("cpu"), model_dir=str(tmp_path), model_pt_path=None)
    assert info.value.fix == "name the model file in the manifest's serializedFile"


def test_unknown_format_names():
    with pytest.raises(ValueError, match="unknown model format 'tflite'"):
        load_model("tflite", device=torch.device("cpu"), model_dir=".", model_pt_path="x.tflite")
    with pytest.raises(ValueError, match="unknown model format 'tflite'"):
        export_model(torch.nn.Linear(1, 1), (torch.zeros(2, 1),), "x.tflite", "tflite")


def test_onnx_without_onnxruntime_names_the_pip_command(fast_format_dirs, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if it were not installed
    path = str(fast_format_dirs["onnx"] / "model.onnx")
    with pytest.raises(ImportError, match=r"^loading \.onnx models needs onnxruntime: pip install 'handlerkit\[onnx\]'$") as info:
        load_model("onnx", device=torch.device("cpu"), model_dir=str(fast_format_dirs["onnx"]), model_pt_path=path)
    assert isinstance(info.value.__cause__, ImportError)


def test_eager_load_errors_carry_their_fix(tmp_path):
    (tmp_path / "model.py").write_text("import torch\n\nclass Net(torch.nn.Module):\n    def __init__(self, width):\n        super().__init__()\n")
    with pytest.raises(ModelLoadError, match=r"Net\(\) \(from .*model\.py\) failed: TypeError.*TorchServe builds the model class with no arguments\n  fix: ") as info:
        load_model("eager", device=torch.device("cpu"), model_dir=str(tmp_path), model_pt_path=None, model_file="model.py")
    assert info.value.fix == "give every constructor argument a default"
    assert info.value.path == str(tmp_path / "model.py")
    (tmp_path / "model.py").write_text("import torch\n\nclass Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.fc = torch.nn.Linear(2, 2)\n")
    torch.save({"fc.weight": torch.zeros(3, 2)}, tmp_path / "model.pt")
    with pytest.raises(ModelLoadError, match=r"does not fit Net: missing keys \[fc\.bias\] \(1\); shape mismatches \[fc\.weight: file \(3, 2\) vs model \(2, 2\)\] \(1\)\n  fix: ") as info:
        load_model("eager", device=torch.device("cpu"), model_dir=str(tmp_path), model_pt_path=str(tmp_path / "model.pt"), model_file="model.py")
    assert info.value.fix == "ship the model.py the weights were trained with, or re-save the weights from it"
    torch.save([1, 2], tmp_path / "model.pt")
    with pytest.raises(ModelLoadError, match=r"model\.pt holds a list, not a state_dict\n  fix: ") as info:
        load_model("eager", device=torch.device("cpu"), model_dir=str(tmp_path), model_pt_path=str(tmp_path / "model.pt"), model_file="model.py")
    assert info.value.fix == "save the weights with torch.save(model.state_dict(), path)"
    (tmp_path / "model.py").write_text("import not_installed_for_handlerkit_formats\n")
    with pytest.raises(ModelLoadError, match=r"importing modelFile .*model\.py failed: ModuleNotFoundError: No module named 'not_installed_for_handlerkit_formats'\n  fix: ") as info:
        load_model("eager", device=torch.device("cpu"), model_dir=str(tmp_path), model_pt_path=None, model_file="model.py")
    assert info.value.fix == "correct model.py (it is imported with the model dir first on sys.path, as TorchServe does)"
    (tmp_path / "model.py").write_text("import torch\n\nclass A(torch.nn.Module):\n    pass\n\nclass B(torch.nn.Module):\n    pass\n")
    with pytest.raises(ModelLoadError, match=r"must define exactly one model class; found A, B: TorchServe counts every class defined in it.*\n  fix: ") as info:
        load_model("eager", device=torch.device("cpu"), model_dir=str(tmp_path), model_pt_path=None, model_file="model.py")
    assert info.value.fix == "keep one nn.Module class in it and import the others from another file"


def test_corrupt_serialized_files(tmp_path):
    for name, fmt, pattern in (
        ("model.pt", "torchscript", r"torch\.jit\.load\(.*model\.pt"),
        ("model.onnx", "onnx", r"onnxruntime could not open .*model\.onnx"),
    ):
        (tmp_path / name).write_bytes(b"\x00garbage")
        with pytest.raises(ModelLoadError, match=pattern):
            load_model(fmt, device=torch.device("cpu"), model_dir=str(tmp_path), model_pt_path=str(tmp_path / name))


def test_a_helper_class_next_to_the_model_is_refused_as_torchserve_does(tmp_path):
    # TorchServe's _load_pickled_model counts every class list_classes_from_module finds,
    # nn.Module or not, and raises ValueError("Expected only one class as model definition").
    (tmp_path / "model.py").write_text(
        "import torch\nfrom collections import OrderedDict\n\nclass Config:\n    width = 2\n\n"
        "class Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.fc = torch.nn.Linear(Config.width, 1)\n"
    )
    with pytest.raises(
        ModelLoadError,
        match=r"model\.py must define exactly one model class; found Config, Net: TorchServe counts every class "
        r"defined in it, helpers included, and raises ValueError 'Expected only one class as model definition'\n  fix: ",
    ) as info:
        load_model("eager", device=torch.device("cpu"), model_dir=str(tmp_path), model_pt_path=None, model_file="model.py")
    assert info.value.fix == "keep one nn.Module class in it and import the others from another file"
    # An imported class (OrderedDict) does not count, for TorchServe either: one class loads.
    (tmp_path / "model.py").write_text(
        "import torch\nfrom collections import OrderedDict\n\nclass Net(torch.nn.Linear):\n"
        "    def __init__(self):\n        super().__init__(2, 1)\n"
    )
    loaded = load_model("eager", device=torch.device("cpu"), model_dir=str(tmp_path), model_pt_path=None, model_file="model.py")
    assert loaded.details["model_class"] == "Net"


def test_keys_a_module_accepts_without_keeping_them_are_no_misfit(tmp_path):
    """torchvision's FrozenBatchNorm2d drops ``num_batches_tracked`` when it loads (pytorch/serve's
    detection examples build their backbone with it, and their checkpoints carry the key): torch's
    strict load accepts such a state_dict, so handlerkit does too, as TorchServe does."""
    from torchvision.ops.misc import FrozenBatchNorm2d

    (tmp_path / "model.py").write_text(
        "import torch\nfrom torchvision.ops.misc import FrozenBatchNorm2d\n\n"
        "class Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.norm = FrozenBatchNorm2d(3)\n"
    )
    trained = torch.nn.BatchNorm2d(3)
    torch.nn.init.uniform_(trained.weight)
    state = {f"norm.{k}": v for k, v in trained.state_dict().items()}
    assert "norm.num_batches_tracked" in state and "num_batches_tracked" not in dict(FrozenBatchNorm2d(3).state_dict())
    torch.save(state, tmp_path / "model.pt")
    loaded = load_model("eager", device=torch.device("cpu"), model_dir=str(tmp_path), model_pt_path=str(tmp_path / "model.pt"), model_file="model.py")
    assert torch.equal(loaded.model.norm.weight, trained.weight.detach())
    torch.save({**state, "head.weight": torch.zeros(1)}, tmp_path / "model.pt")  # a key nothing takes is still one
    with pytest.raises(ModelLoadError, match=r"does not fit Net: unexpected keys \[head\.weight\] \(1\)\n  fix: "):
        load_model("eager", device=torch.device("cpu"), model_dir=str(tmp_path), model_pt_path=str(tmp_path / "model.pt"), model_file="model.py")
