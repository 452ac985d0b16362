"""handlerkit.worker.modeldir: manifest reading and inference, config discovery (through from_model_dir)."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest

from handlerkit.errors import ConfigError, HandlerkitWarning, ModelLoadError
from handlerkit.worker.context import MockContext
from handlerkit.worker.modeldir import ModelDir, infer_manifest, manifest_command, read_manifest, read_model_dir


def _manifest(tmp_path: Path, model: dict, **top) -> Path:
    (tmp_path / "MAR-INF").mkdir()
    path = tmp_path / "MAR-INF" / "MANIFEST.json"
    path.write_text(json.dumps({"createdOn": "01/01/2025", "runtime": "python", "model": model, **top}))
    return path


def test_from_model_dir_reads_manifest_and_config(tmp_path):
    _manifest(
        tmp_path,
        {
            "modelName": "shapes",
            "serializedFile": "weights.pth",
            "handler": "image_classifier",
            "modelFile": "model.py",
            "modelVersion": "2.0",
            "configFile": "conf.yaml",
        },
    )
    (tmp_path / "conf.yaml").write_text("batchSize: 4\nhandler:\n  topk: 2\n")
    (tmp_path / "weights.pth").write_bytes(b"x")
    (tmp_path / "other.pt").write_bytes(b"x")  # ignored: the manifest decides
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ctx = MockContext.from_model_dir(tmp_path)
    assert ctx.model_name == "shapes"
    assert ctx.manifest["model"]["serializedFile"] == "weights.pth"
    assert ctx.manifest["createdOn"] == "01/01/2025"
    assert ctx.inferred == {}
    assert ctx.model_yaml_config == {"batchSize": 4, "handler": {"topk": 2}}
    assert ctx.system_properties["batch_size"] == 4
    assert ctx.system_properties["gpu_id"] is None
    assert ctx.system_properties["model_dir"] == str(tmp_path.resolve())


def test_from_model_dir_arguments_override(tmp_path):
    _manifest(tmp_path, {"modelName": "shapes", "handler": "h.py", "configFile": "conf.yaml"})
    (tmp_path / "conf.yaml").write_text("batchSize: 4\n")
    (tmp_path / "alt.yaml").write_text("batchSize: 2\nhandler: {x: 1}\n")
    ctx = MockContext.from_model_dir(
        tmp_path, gpu_id=0, batch_size=16, model_name="renamed", limit_max_image_pixels=False
    )
    assert ctx.model_name == "renamed"
    assert ctx.system_properties["batch_size"] == 16
    assert ctx.system_properties["gpu_id"] == 0
    assert ctx.system_properties["limit_max_image_pixels"] is False
    alt = MockContext.from_model_dir(tmp_path, config="alt.yaml")
    assert alt.model_yaml_config == {"batchSize": 2, "handler": {"x": 1}}
    assert alt.system_properties["batch_size"] == 2
    absolute = MockContext.from_model_dir(tmp_path, config=tmp_path / "alt.yaml")
    assert absolute.model_yaml_config["handler"] == {"x": 1}
    with pytest.raises(ModelLoadError, match="nope.yaml"):
        MockContext.from_model_dir(tmp_path, config="nope.yaml")


def test_from_model_dir_config_relative_to_cwd(tmp_path, monkeypatch):
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "model.pt").write_bytes(b"")
    (tmp_path / "outside.yaml").write_text("batchSize: 3\n")
    monkeypatch.chdir(tmp_path)
    with pytest.warns(HandlerkitWarning):
        ctx = MockContext.from_model_dir(model_dir, config="outside.yaml")
    assert ctx.system_properties["batch_size"] == 3


def test_from_model_dir_manifest_without_config_file_ignores_model_config_yaml(tmp_path):
    _manifest(tmp_path, {"modelName": "m", "handler": "h.py"})
    (tmp_path / "model-config.yaml").write_text("batchSize: 8\n")
    with pytest.warns(HandlerkitWarning, match="names no configFile"):
        ctx = MockContext.from_model_dir(tmp_path)
    assert ctx.model_yaml_config == {}
    assert ctx.system_properties["batch_size"] == 1


def test_from_model_dir_infers_manifest_and_says_so(tmp_path):
    model_dir = tmp_path / "shapes"
    model_dir.mkdir()
    for name in ("model.onnx", "model.py", "handler.py", "index_to_name.json"):
        (model_dir / name).write_bytes(b"")
    (model_dir / "model-config.yaml").write_text("batchSize: 2\nhandler:\n  threshold: 0.5\n")
    with pytest.warns(HandlerkitWarning) as caught:
        ctx = MockContext.from_model_dir(model_dir)
    assert len(caught) == 1
    # Short lines: what was inferred in brief, how to make it explicit, and the command that does.
    assert str(caught[0].message).splitlines() == [
        "handlerkit: inferred the manifest of shapes/ from model.onnx, model.py, handler.py, model-config.yaml",
        "  there is no MAR-INF/MANIFEST.json: write one to make it explicit (details: .inferred)",
        f"  fix: handlerkit manifest {model_dir.resolve()}",
    ]
    assert caught[0].filename == __file__  # stacklevel points at the caller
    assert ctx.manifest == {
        "runtime": "python",
        "model": {
            "modelName": "shapes",
            "serializedFile": "model.onnx",
            "modelFile": "model.py",
            "handler": "handler.py",
            "configFile": "model-config.yaml",
            "modelVersion": "1.0",
        },
    }
    assert set(ctx.inferred) == {
        "modelName",
        "serializedFile",
        "modelFile",
        "handler",
        "configFile",
        "modelVersion",
        "runtime",
    }
    # The details live in ctx.inferred, not in the warning.
    assert ctx.inferred == {
        "modelName": "the model dir's name",
        "serializedFile": "the only weights file in the dir",
        "modelFile": "model.py is in the dir",
        "handler": "handler.py is in the dir",
        "configFile": "model-config.yaml is in the dir",
        "modelVersion": "default",
        "runtime": "default",
    }
    assert ctx.model_name == "shapes"
    assert ctx.model_yaml_config == {"batchSize": 2, "handler": {"threshold": 0.5}}
    assert ctx.system_properties["batch_size"] == 2


def test_from_model_dir_infers_minimal_dir(tmp_path):
    (tmp_path / "weights.safetensors").write_bytes(b"")
    with pytest.warns(HandlerkitWarning, match=r"from weights\.safetensors\n") as caught:
        ctx = MockContext.from_model_dir(tmp_path, model_name="given")
    assert ctx.manifest["model"] == {
        "modelName": "given",
        "serializedFile": "weights.safetensors",
        "modelVersion": "1.0",
    }
    assert ctx.inferred["modelName"] == "the model_name argument"
    assert "modelFile" not in ctx.inferred and "handler" not in ctx.inferred
    assert ctx.model_yaml_config == {}
    assert "no weights file" not in str(caught[0].message)
    # Without model.py, TorchServe's BaseHandler cannot load a .safetensors file: say so.
    assert ctx.inferred["serializedFile"].startswith(
        "the only weights file in the dir; without a modelFile TorchServe's BaseHandler cannot load it"
    )


@pytest.mark.parametrize(
    ("files", "needs_model_file"),
    [
        (("weights.pth",), True),
        (("weights.bin",), True),
        (("weights.pth", "model.py"), False),
        (("weights.pt",), False),
        (("weights.onnx",), False),
        (("weights.pt2",), False),
    ],
)
def test_inferred_weights_say_when_they_need_a_model_file(tmp_path, files, needs_model_file):
    for name in files:
        (tmp_path / name).write_bytes(b"")
    _, inferred = infer_manifest(tmp_path)
    note = (
        "; without a modelFile TorchServe's BaseHandler cannot load it (it reads a lone file as TorchScript "
        "only when its name ends in .pt, else 'No model weights could be loaded'): add model.py defining "
        "the model class, or load it in your own initialize"
    )
    expected = "the only weights file in the dir" + (note if needs_model_file else "")
    assert inferred["serializedFile"] == expected


def test_from_model_dir_without_weights_says_none_found(tmp_path):
    model_dir = tmp_path / "bare"
    model_dir.mkdir()
    (model_dir / "handler.py").write_text("")
    with pytest.warns(HandlerkitWarning) as caught:
        ctx = MockContext.from_model_dir(model_dir)
    assert "serializedFile" not in ctx.manifest["model"]
    first, second, fix = str(caught[0].message).splitlines()
    assert first == "handlerkit: inferred the manifest of bare/ from handler.py; no weights file found"
    assert len(second) <= 100
    assert fix == f"  fix: handlerkit manifest {model_dir.resolve()}"


def test_from_model_dir_ambiguous_weights(tmp_path):
    for name in ("a.pt", "b.pth", "model.py"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"several weights files: a\.pt, b\.pth; handlerkit cannot tell") as info:
        MockContext.from_model_dir(tmp_path)
    assert info.value.path == str(tmp_path.resolve())
    assert info.value.fix.startswith(
        f"name the model's weights in MAR-INF/MANIFEST.json: handlerkit manifest {tmp_path.resolve()} "
        "--serialized-file a.pt (or b.pth), as torch-model-archiver --serialized-file does"
    )


def test_the_manifest_command_names_a_dir_below_the_working_directory_relatively(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my models" / "shapes").mkdir(parents=True)
    assert manifest_command(tmp_path / "my models" / "shapes") == "handlerkit manifest 'my models/shapes'"
    assert manifest_command(tmp_path) == "handlerkit manifest ."
    assert manifest_command("/elsewhere/m", "--force") == "handlerkit manifest /elsewhere/m --force"


def test_from_model_dir_malformed_manifest_json(tmp_path):
    (tmp_path / "MAR-INF").mkdir()
    path = tmp_path / "MAR-INF" / "MANIFEST.json"
    path.write_text('{"model": {"modelName": "x",}')
    with pytest.raises(ModelLoadError, match=r"MANIFEST\.json is not valid JSON \(") as info:
        MockContext.from_model_dir(tmp_path)
    assert info.value.path == str(path.resolve())
    assert info.value.fix == (
        "correct the file, or delete MAR-INF/MANIFEST.json to let handlerkit infer the manifest from the files"
    )
    assert "delete" not in info.value.message


def test_from_model_dir_manifest_without_model_object(tmp_path):
    _manifest(tmp_path, model="oops")
    with pytest.raises(ModelLoadError, match='must be a JSON object with a "model" object'):
        MockContext.from_model_dir(tmp_path)


def test_from_model_dir_malformed_yaml(tmp_path):
    (tmp_path / "model.pt").write_bytes(b"")
    (tmp_path / "model-config.yaml").write_text("handler:\n  a: [1, 2\n")
    with pytest.warns(HandlerkitWarning), pytest.raises(ConfigError, match=r"model-config\.yaml, line 3, column 1: not valid YAML"):
        MockContext.from_model_dir(tmp_path)


def test_from_model_dir_yaml_not_a_mapping_and_bad_batch_size(tmp_path):
    (tmp_path / "model.pt").write_bytes(b"")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "bad.yaml").write_text("batchSize: four\n")
    (tmp_path / "empty.yaml").write_text("")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HandlerkitWarning)
        with pytest.raises(ConfigError, match="list.yaml: the top level must be a mapping"):
            MockContext.from_model_dir(tmp_path, config="list.yaml")
        with pytest.raises(ConfigError, match="bad.yaml: batchSize must be an integer, got str 'four'"):
            MockContext.from_model_dir(tmp_path, config="bad.yaml")
        # TorchServe 0.12 cannot register a model whose config file is empty
        with pytest.raises(ConfigError, match="empty.yaml: the file is empty"):
            MockContext.from_model_dir(tmp_path, config="empty.yaml")


def test_from_model_dir_manifest_names_missing_config(tmp_path):
    _manifest(tmp_path, {"modelName": "m", "configFile": "gone.yaml"})
    with pytest.raises(ModelLoadError, match="configFile 'gone.yaml' but .* does not exist") as info:
        MockContext.from_model_dir(tmp_path)
    assert info.value.fix == "add the file, or remove configFile from MAR-INF/MANIFEST.json"


def test_from_model_dir_missing_dir(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist") as info:
        MockContext.from_model_dir(tmp_path / "nope")
    assert info.value.path == str(tmp_path / "nope")
    (tmp_path / "file").write_text("")
    with pytest.raises(ModelLoadError, match="is not a directory") as info:
        MockContext.from_model_dir(tmp_path / "file")
    assert info.value.fix == "pass the folder holding the model files (an unpacked .mar)"


# ---------------------------------------------------------------------------------------------
# The module's own functions
# ---------------------------------------------------------------------------------------------


def test_read_model_dir_reports_what_torchserve_would_load(tmp_path):
    _manifest(tmp_path, {"modelName": "m", "handler": "h.py", "configFile": "conf.yaml"})
    (tmp_path / "conf.yaml").write_text("batchSize: 3\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = read_model_dir(tmp_path)
    assert isinstance(found, ModelDir)
    assert found.path == tmp_path.resolve() and found.path.is_absolute()
    assert found.manifest["model"]["handler"] == "h.py" and found.inferred == {}
    assert found.config_path == tmp_path.resolve() / "conf.yaml"
    assert found.config == {"batchSize": 3} and found.batch_size == 3


@pytest.mark.parametrize("value", [0, -3])
def test_batch_size_below_one_is_raised_to_one_as_torchserve_does(tmp_path, value):
    # TorchServe's ModelConfig.setBatchSize: Math.max(1, batchSize). load_config warns.
    _manifest(tmp_path, {"modelName": "m", "configFile": "conf.yaml"})
    (tmp_path / "conf.yaml").write_text(f"batchSize: {value}\n")
    with pytest.warns(HandlerkitWarning, match=rf"batchSize: {value} is below 1; TorchServe 0\.12 raises it to 1"):
        found = read_model_dir(tmp_path)
    assert found.batch_size == 1
    with pytest.warns(HandlerkitWarning, match=rf"batchSize: {value} is below 1"):
        ctx = MockContext.from_model_dir(tmp_path)
    assert ctx.system_properties["batch_size"] == 1
    with pytest.warns(HandlerkitWarning, match=rf"batchSize: {value} is below 1"):
        ctx = MockContext.from_model_dir(tmp_path, batch_size=2)  # the argument wins
    assert ctx.system_properties["batch_size"] == 2


def test_batch_size_that_is_no_integer_is_an_error():
    found = ModelDir(path=Path("/m"), manifest={"model": {}}, config={"batchSize": 2.5}, config_path=Path("/m/c.yaml"))
    with pytest.raises(ConfigError, match=r"batchSize in /m/c\.yaml must be an integer: got 2\.5\n  fix: write batchSize: 1 or more"):
        found.batch_size
    assert ModelDir(path=Path("/m"), manifest={"model": {}}).batch_size == 1


def test_infer_manifest_without_warning(tmp_path):
    (tmp_path / "net.pt2").write_bytes(b"")
    (tmp_path / "model.py").write_text("")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # only read_model_dir warns
        manifest, inferred = infer_manifest(tmp_path)
    assert manifest == {
        "runtime": "python",
        "model": {"modelName": tmp_path.name, "serializedFile": "net.pt2", "modelFile": "model.py", "modelVersion": "1.0"},
    }
    assert inferred["serializedFile"] == "the only weights file in the dir"


def test_read_manifest_keeps_every_key(tmp_path):
    path = _manifest(tmp_path, {"modelName": "m"}, archiverVersion="0.12.0")
    assert read_manifest(path) == {
        "createdOn": "01/01/2025",
        "runtime": "python",
        "model": {"modelName": "m"},
        "archiverVersion": "0.12.0",
    }
    with pytest.raises(ModelLoadError, match=r"cannot read .*nope\.json") as info:
        read_manifest(tmp_path / "nope.json")
    assert "delete MAR-INF/MANIFEST.json" in info.value.fix


@pytest.mark.parametrize("argument", ["config", "metrics_config"])
def test_a_missing_absolute_config_is_a_model_load_error(tmp_path, argument):
    # As for a relative path: the file is missing, so ModelLoadError (ConfigError is for a
    # file that exists and does not validate).
    (tmp_path / "model.pt").write_bytes(b"")
    missing = tmp_path / "elsewhere" / "nope.yaml"
    with pytest.warns(HandlerkitWarning, match="inferred the manifest"), pytest.raises(
        ModelLoadError, match=rf"^{argument} '{re.escape(str(missing))}' does not exist\n  fix: check the path$"
    ) as info:
        MockContext.from_model_dir(tmp_path, **{argument: missing})
    assert info.value.path == str(missing)


def test_config_argument_not_found_names_both_places(tmp_path, monkeypatch):
    (tmp_path / "model.pt").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    with pytest.warns(HandlerkitWarning), pytest.raises(ModelLoadError, match=r"config 'nope\.yaml' not found in the model dir \(.*\) nor in the working directory") as info:
        read_model_dir(tmp_path, config="nope.yaml")
    assert info.value.fix == "check the name, or pass an absolute path"
