"""handlerkit.handlers.base: TorchServe's BaseHandler scenarios, decisions, loud failures."""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import pytest
import torch

import handlerkit as hk
from conftest import ARGMAX_LINEAR_MODEL_PY, MLP_MODEL_PY, eager_manifest, write_model_dir
from handlerkit.errors import ConfigError, HandlerkitError, ModelLoadError
from handlerkit.handlers.base import BaseHandler, load_label_mapping, output_width


def ts_signature_context(model_dir: Path, **kwargs) -> hk.MockContext:
    """TorchServe's unit-test MockContext call (ts/torch_handler/unit_tests/conftest.py)."""
    return hk.MockContext(
        model_pt_file="model.pt",
        model_dir=str(model_dir),
        model_file="model.py",
        gpu_id="0",
        model_name="mnist",
        **kwargs,
    )


# ---------------------------------------------------------------------------------------------
# TorchServe's BaseHandler unit tests (ts/torch_handler/unit_tests/test_base_handler.py)
# ---------------------------------------------------------------------------------------------


def test_single_handle(argmax_dir):
    ctx = ts_signature_context(argmax_dir)
    handler = BaseHandler()
    handler.initialize(ctx)
    assert handler.initialized
    assert handler.handle([[1.0, 2.0]], ctx) == [1]


def test_batch_handle(argmax_dir):
    ctx = ts_signature_context(argmax_dir)
    handler = BaseHandler()
    handler.initialize(ctx)
    assert handler.handle([[1.0, 2.0], [4.0, 3.0]], ctx) == [1, 0]


@pytest.mark.parametrize(
    ("weights", "single", "batch"),
    [([[1.0, 0.0], [0.0, 1.0]], [1], [1, 0]), ([[0.0, 1.0], [1.0, 0.0]], [0], [0, 1])],
    ids=["identity", "swap"],
)
def test_state_dict_is_loaded(tmp_path, weights, single, batch):
    # The argmax scenario with weights: a swapped matrix flips the answers, so the outputs
    # prove the serializedFile was read (TorchServe's ArgmaxModel has no parameters).
    model_dir = write_model_dir(tmp_path, ARGMAX_LINEAR_MODEL_PY, state_dict={"fc.weight": torch.tensor(weights)})
    ctx = ts_signature_context(model_dir)
    handler = BaseHandler()
    handler.initialize(ctx)
    assert handler.handle([[1.0, 2.0]], ctx) == single
    assert handler.handle([[1.0, 2.0], [4.0, 3.0]], ctx) == batch
    assert handler.decisions.model_details["state_dict_tensors"] == 1


def test_json_requests_through_a_bound_batch(argmax_dir):
    # What the worker really hands over: one dict per request, the JSON body under "body".
    ctx = ts_signature_context(argmax_dir)
    handler = BaseHandler()
    handler.initialize(ctx)
    batch = hk.batch(hk.Request.json([1.0, 2.0]), hk.Request.json([4.0, 3.0]))
    batch.bind(ctx)
    assert handler.handle(batch.data, ctx) == [1, 0]
    form = hk.batch(hk.Request.form({"data": (b"[4.0, 3.0]", "application/json")}))
    form.bind(ctx)
    assert handler.handle(form.data, ctx) == [0]


def test_handler_time_is_recorded_and_stage_times_only_with_profile(argmax_dir):
    ctx = ts_signature_context(argmax_dir)
    handler = BaseHandler()
    handler.initialize(ctx)
    handler.handle([[1.0, 2.0]], ctx)
    record = ctx.metrics.last("HandlerTime")
    assert record is not None
    assert record.unit == "ms" and record.value >= 0
    assert not [name for name in ctx.metrics.names() if name.startswith("ts_handler_")]


@pytest.mark.parametrize("profile", [True, False])
def test_profile_records_each_stage(argmax_dir, profile):
    (argmax_dir / "model-config.yaml").write_text(f"handler:\n  profile: {str(profile).lower()}\n")
    ctx = ts_signature_context(argmax_dir, model_yaml_config_file="model-config.yaml")
    handler = BaseHandler()
    handler.initialize(ctx)
    assert handler.handle([[1.0, 2.0], [4.0, 3.0]], ctx) == [1, 0]
    stages = {"ts_handler_preprocess", "ts_handler_inference", "ts_handler_postprocess"}
    recorded = set(ctx.metrics.names())
    assert "HandlerTime" in recorded
    if profile:
        assert stages <= recorded
        assert all(ctx.metrics.last(name).unit == "ms" for name in stages)
    else:
        assert not stages & recorded


def test_describe_and_explain_headers(argmax_dir):
    ctx = ts_signature_context(argmax_dir)
    handler = BaseHandler()
    handler.initialize(ctx)
    describe = hk.batch(hk.Request.json([1.0, 2.0]).with_headers(describe="True"))
    describe.bind(ctx)
    assert handler.handle(describe.data, ctx) == [None]  # TorchServe's default describe_handle
    explain = hk.batch(hk.Request.json([1.0, 2.0]).with_headers(explain="True"))
    explain.bind(ctx)
    with pytest.raises(HandlerkitError, match="get_insights"):
        handler.handle(explain.data, ctx)


def test_decisions_are_recorded(mlp_dir):
    ctx = hk.MockContext(model_dir=mlp_dir, gpu_id=None, manifest=eager_manifest())
    handler = BaseHandler()
    handler.initialize(ctx)
    d = handler.decisions
    assert (d.device, d.device_kind, handler.map_location) == ("cpu", "cpu", "cpu")
    assert d.model_format == "eager" and d.loader.startswith("TinyMLP()")
    assert d.model_path == str(mlp_dir / "model.pt")
    assert d.compile.requested is False and d.compile.applied is False
    assert d.label_map["found"] is False
    assert d.tf32["applied"] is False
    assert d.to_dict()["model_format"] == "eager"
    assert "initialized" in repr(handler) and "eager" in repr(handler)


def test_tf32_setting_is_validated(mlp_dir):
    ctx = hk.MockContext(model_dir=mlp_dir, gpu_id=None, manifest=eager_manifest(), model_yaml_config={"handler": {"tf32": "maybe"}})
    handler = BaseHandler()
    with pytest.raises(HandlerkitError, match="handler.tf32"):
        handler.initialize(ctx)
    assert handler.initialized is False


# ---------------------------------------------------------------------------------------------
# Bad model dirs: a HandlerkitError naming the file and the fix; nothing half-loaded
# ---------------------------------------------------------------------------------------------


def _two_classes(d: Path) -> None:
    (d / "model.py").write_text(MLP_MODEL_PY + "\n\nclass Other(torch.nn.Module):\n    pass\n")


def _wrong_shapes(d: Path) -> None:
    torch.save({"fc1.weight": torch.zeros(5, 4), "fc1.bias": torch.zeros(5), "fc2.weight": torch.zeros(3, 3), "fc2.bias": torch.zeros(3)}, d / "model.pt")


def _missing_keys(d: Path) -> None:
    torch.save({"fc1.weight": torch.zeros(3, 4)}, d / "model.pt")


def _not_json(d: Path) -> None:
    (d / "index_to_name.json").write_text("{'0': 'single quotes are not JSON'}")


def _missing_model_py(d: Path) -> None:
    (d / "model.py").unlink()


def _missing_weights(d: Path) -> None:
    (d / "model.pt").unlink()


def _model_py_fails(d: Path) -> None:
    (d / "model.py").write_text("import torch\nraise RuntimeError('boom at import')\n")


def _needs_arguments(d: Path) -> None:
    (d / "model.py").write_text(MLP_MODEL_PY.replace("def __init__(self):", "def __init__(self, width):"))


def _pickled_model(d: Path) -> None:
    torch.save(torch.nn.Linear(2, 2), d / "model.pt")


BAD_DIRS = {
    "missing serializedFile": (_missing_weights, "model.pt", r"does not exist"),
    "missing modelFile": (_missing_model_py, "model.py", r"does not exist"),
    "state_dict with wrong shapes": (_wrong_shapes, "model.pt", r"shape mismatches \[fc1\.weight: file \(5, 4\) vs model \(3, 4\)"),
    "state_dict with missing keys": (_missing_keys, "model.pt", r"missing keys \[.*fc1\.bias"),
    "two model classes": (_two_classes, "model.py", r"exactly one model class; found Other, TinyMLP"),
    "model.py raises at import": (_model_py_fails, "model.py", r"boom at import"),
    "constructor needs arguments": (_needs_arguments, "model.py", r"TinyMLP\(\) \(from .*model\.py\) failed"),
    "whole pickled model": (_pickled_model, "model.pt", r"weights_only"),
    "index_to_name.json not JSON": (_not_json, "index_to_name.json", r"not valid JSON"),
}


@pytest.mark.parametrize("case", list(BAD_DIRS))
def test_bad_model_dir_fails_loudly_and_cleanly(tmp_path, case):
    breaker, filename, pattern = BAD_DIRS[case]
    model_dir = write_model_dir(tmp_path / "m", MLP_MODEL_PY, labels=["a", "b", "c"])
    breaker(model_dir)
    ctx = hk.MockContext(model_dir=model_dir, gpu_id=None, manifest=eager_manifest())
    handler = BaseHandler()
    with pytest.raises(ModelLoadError, match=pattern) as info:
        handler.initialize(ctx)
    message = str(info.value)
    assert filename in message
    assert re.search(r"\bfix\b", message, re.IGNORECASE), message
    assert handler.initialized is False
    assert handler.model is None and handler.mapping is None


def test_missing_model_dir(tmp_path):
    ctx = ts_signature_context(tmp_path / "nowhere")
    handler = BaseHandler()
    with pytest.raises(ModelLoadError, match=r"nowhere does not exist\n  fix: point the context at the model dir"):
        handler.initialize(ctx)
    assert handler.initialized is False and handler.model is None


def test_manifest_without_model_section(mlp_dir):
    ctx = hk.MockContext(model_dir=mlp_dir, gpu_id=None, manifest={"runtime": "python"})
    with pytest.raises(ModelLoadError, match=r"(?s)'model' section.*\n  fix: use MockContext.from_model_dir"):
        BaseHandler().initialize(ctx)


def test_manifest_naming_no_model(mlp_dir):
    ctx = hk.MockContext(model_dir=mlp_dir, gpu_id=None, manifest={"model": {"modelName": "x"}})
    with pytest.raises(ModelLoadError, match=r"(?s)neither a modelFile nor a serializedFile.*\n  fix: add 'serializedFile'"):
        BaseHandler().initialize(ctx)


def test_malformed_yaml_config_file(mlp_dir):
    (mlp_dir / "model-config.yaml").write_text("handler:\n\ttopk: 3\n")
    with pytest.raises(ConfigError, match=r"(?s)model-config\.yaml.*not valid YAML.*[Ff]ix"):
        hk.MockContext(model_dir=mlp_dir, gpu_id=None, model_yaml_config_file="model-config.yaml")
    (mlp_dir / "MAR-INF").mkdir()
    (mlp_dir / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(eager_manifest(configFile="model-config.yaml")))
    with pytest.raises(ConfigError, match=r"model-config\.yaml.*not valid YAML"):
        hk.MockContext.from_model_dir(mlp_dir)


def test_invalid_config_values_fail_at_initialize(mlp_dir):
    ctx = hk.MockContext(model_dir=mlp_dir, gpu_id=None, manifest=eager_manifest(), model_yaml_config={"pt2": [1, 2]})
    handler = BaseHandler()
    with pytest.raises(ConfigError, match=r"pt2 must be a backend name"):
        handler.initialize(ctx)
    assert handler.initialized is False and handler.model is None


def _fix_model_py(d: Path) -> None:
    (d / "model.py").write_text(MLP_MODEL_PY)


def _fix_weights(d: Path) -> None:
    torch.manual_seed(0)
    write_model_dir(d, MLP_MODEL_PY)


def _fix_json(d: Path) -> None:
    (d / "index_to_name.json").write_text(json.dumps({"0": "a", "1": "b", "2": "c"}))


@pytest.mark.parametrize(
    ("breaker", "fixer"),
    [
        (_two_classes, _fix_model_py),
        (_model_py_fails, _fix_model_py),
        (_missing_model_py, _fix_model_py),
        (_wrong_shapes, _fix_weights),
        (_missing_weights, _fix_weights),
        (_not_json, _fix_json),
    ],
    ids=["two classes", "import error", "missing model.py", "wrong shapes", "missing weights", "bad json"],
)
def test_initialize_again_after_fixing_the_file(tmp_path, mlp_reference, breaker, fixer):
    reference, _ = mlp_reference
    model_dir = write_model_dir(tmp_path / "m", MLP_MODEL_PY, labels=["a", "b", "c"])
    ctx = hk.MockContext(model_dir=model_dir, gpu_id=None, manifest=eager_manifest())
    handler = BaseHandler()
    handler.initialize(ctx)  # a good load first: the failure must not leave its model behind
    breaker(model_dir)
    with pytest.raises(ModelLoadError):
        handler.initialize(ctx)
    assert handler.initialized is False and handler.model is None
    fixer(model_dir)
    handler.initialize(ctx)
    assert handler.initialized
    assert handler.mapping == {"0": "a", "1": "b", "2": "c"}
    x = [[0.5, -1.0, 2.0, 0.25], [1.0, 2.0, 3.0, 4.0]]
    expected = reference(torch.tensor(x))
    torch.testing.assert_close(torch.tensor(handler.handle(x, ctx)), expected, rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# One process, several model dirs, each with its own model.py
# ---------------------------------------------------------------------------------------------

SCALE_MODEL_PY = '''\
import torch


class Net(torch.nn.Module):
    def forward(self, x):
        return x * {factor}
'''


def test_two_model_dirs_each_get_their_own_model_py(tmp_path, monkeypatch):
    dir_a = write_model_dir(tmp_path / "a", SCALE_MODEL_PY.format(factor=2))
    dir_b = write_model_dir(tmp_path / "b", SCALE_MODEL_PY.format(factor=-10))
    # A stray `model` module already imported (a notebook in another dir): TorchServe's
    # importlib.import_module("model") would pick it up; handlerkit must not.
    monkeypatch.setitem(sys.modules, "model", types.ModuleType("model"))
    ctx_a, ctx_b = (hk.MockContext(model_dir=d, model_file="model.py", gpu_id=None) for d in (dir_a, dir_b))
    handler_a, handler_b = BaseHandler(), BaseHandler()
    handler_a.initialize(ctx_a)
    handler_b.initialize(ctx_b)
    assert type(handler_a.model) is not type(handler_b.model)
    assert type(handler_a.model).__name__ == type(handler_b.model).__name__ == "Net"
    assert handler_a.handle([[1.0, 2.0]], ctx_a) == [[2.0, 4.0]]
    assert handler_b.handle([[1.0, 2.0]], ctx_b) == [[-10.0, -20.0]]
    # Initialising a again (after b) still gives a's class.
    handler_a.initialize(ctx_a)
    assert handler_a.handle([[3.0]], ctx_a) == [[6.0]]
    assert handler_b.handle([[3.0]], ctx_b) == [[-30.0]]


def test_model_py_imports_a_sibling_module(tmp_path):
    model_dir = tmp_path / "sib"
    model_dir.mkdir()
    (model_dir / "layers.py").write_text("OFFSET = 7.0\n")
    (model_dir / "model.py").write_text(
        "import torch\nfrom layers import OFFSET\n\n\nclass Net(torch.nn.Module):\n"
        "    def forward(self, x):\n        return x + OFFSET\n"
    )
    ctx = hk.MockContext(model_pt_file=None, model_dir=model_dir, model_file="model.py", gpu_id=None)
    handler = BaseHandler()
    handler.initialize(ctx)
    assert handler.handle([[1.0]], ctx) == [[8.0]]


# ---------------------------------------------------------------------------------------------
# Label maps and output width
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ({"0": "cat", "1": "dog"}, {"0": "cat", "1": "dog"}),
        ({"0": ["n01", "cat"], "1": ["n02", "dog"]}, {"0": "cat", "1": "dog"}),
        ({"object_type_names": ["cat", "dog"]}, {"0": "cat", "1": "dog"}),
    ],
    ids=["plain", "list values", "object_type_names"],
)
def test_load_label_mapping_forms(tmp_path, content, expected):
    path = tmp_path / "index_to_name.json"
    path.write_text(json.dumps(content))
    assert load_label_mapping(str(path)) == expected


def test_load_label_mapping_errors(tmp_path):
    assert load_label_mapping(str(tmp_path / "absent.json")) is None
    path = tmp_path / "index_to_name.json"
    path.write_text(json.dumps(["cat", "dog"]))
    with pytest.raises(ModelLoadError, match=r"(?s)holds a list.*\n  fix: rewrite it in that form"):
        load_label_mapping(str(path))
    path.write_text(json.dumps({"0": 3}))
    with pytest.raises(ModelLoadError, match=r"label for '0' is 3"):
        load_label_mapping(str(path))
    path.write_bytes(b"\xff\xfe{")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        load_label_mapping(str(path))


def test_output_width():
    assert output_width(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 5))) == 5
    assert output_width(torch.nn.Conv2d(3, 21, 1)) == 21
    assert output_width(types.SimpleNamespace(num_classes=7)) == 7
    assert output_width(torch.nn.ReLU()) is None
