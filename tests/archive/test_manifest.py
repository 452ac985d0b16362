"""handlerkit.archive.manifest: the MAR-INF/MANIFEST.json torch-model-archiver 0.12 writes, key for
key: the keys in the archiver's order, a handler spec named by its base name, the model name
TorchServe accepts, and the manifest a build starts from.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest
from _archives import DEMO, archiver_inputs, contents, needs_archiver, run_archiver, without_date

from handlerkit import archive
from handlerkit.archive import ArchiveError
from handlerkit.archive.manifest import ARCHIVER_VERSION, check_model_name, complete, handler_source, start_from
from handlerkit.errors import ModelLoadError


@pytest.fixture()
def inputs(tmp_path: Path) -> Path:
    return archiver_inputs(tmp_path)


@needs_archiver
@pytest.mark.parametrize(
    "spec, archived", [("image_classifier", None), ("my_handler", "my_handler.py"), ("my_handler.py", "my_handler.py")]
)
def test_handler_specs_are_archived_as_the_archiver_does(inputs: Path, tmp_path: Path, spec: str, archived: str | None) -> None:
    """A built-in name is no file; a path is archived under its base name and named by it."""
    handler = spec if spec == "image_classifier" else f"{inputs}/{spec}"
    ref = run_archiver(tmp_path, "default", "--model-name", "m", "--version", "1.0", "--handler", handler)
    ours = archive.build(None, tmp_path / "ours", model_name="m", handler=handler)
    assert without_date(archive.read_manifest(ours)) == without_date(archive.read_manifest(ref))
    assert archive.read_manifest(ours)["model"]["handler"] == spec
    assert set(contents(ours)) == set(contents(ref)) == ({archived} if archived else set())


@pytest.mark.parametrize("name", ["m", "shapes", "Resnet-18", "a.b_c-1", "0model"])
def test_model_names_torchserve_accepts(name: str) -> None:
    assert check_model_name(name) == name


@pytest.mark.parametrize("name", [None, "", "bad name!", "-dash", ".dot", "_under", "a/b", "caf\u00e9"])
def test_other_model_names_are_refused_with_the_rule_and_the_fix(name) -> None:
    with pytest.raises(ArchiveError, match=r"model name .* is not allowed: TorchServe wants \^\[A-Za-z0-9\]") as info:
        check_model_name(name)
    assert info.value.rule == "model-name" and info.value.fix == "pass model_name= with letters, digits, '_', '-' and '.'"


@pytest.mark.parametrize(
    "spec, source",
    [("image_classifier", None), ("base_handler", None), ("h", "h.py"), ("h.py", "h.py"), ("h:fn", "h.py"),
     ("h.py:fn", "h.py"), ("dir/h", "dir/h.py"), ("text_handler", "text_handler.py")],
)  # fmt: skip
def test_a_handler_spec_names_its_file_unless_the_archiver_ships_it(spec: str, source: str | None) -> None:
    assert handler_source(spec) == source


def test_the_manifest_keeps_the_archivers_key_order_and_only_the_keys_set() -> None:
    model = {"handler": "h.py", "custom": 1, "configFile": None, "extensions": "", "serializedFile": "w.pt", "modelFile": "m.py"}
    before = datetime.datetime.now().replace(microsecond=0)
    manifest = complete({}, model, "shapes", None)
    assert list(manifest) == ["createdOn", "runtime", "model", "archiverVersion"]
    assert manifest["model"] == {"modelName": "shapes", "serializedFile": "w.pt", "handler": "h.py", "modelFile": "m.py",
                                 "modelVersion": "1.0", "custom": 1}  # fmt: skip
    assert list(manifest["model"]) == ["modelName", "serializedFile", "handler", "modelFile", "modelVersion", "custom"]
    assert manifest["runtime"] == "python" and manifest["archiverVersion"] == ARCHIVER_VERSION == "0.12.0"
    created = datetime.datetime.strptime(manifest["createdOn"], "%d/%m/%Y %H:%M:%S")  # the archiver's format, local time
    assert before <= created <= datetime.datetime.now()
    kept = complete({"runtime": "python3"}, {"modelVersion": "2.0"}, "m", None)
    assert kept["runtime"] == "python3" and kept["model"] == {"modelName": "m", "modelVersion": "2.0"}
    assert complete({}, {"modelVersion": "2.0"}, "m", "3.0")["model"]["modelVersion"] == "3.0"  # the argument wins


def test_a_build_starts_from_the_dirs_manifest_or_the_one_its_files_imply(tmp_path: Path) -> None:
    assert start_from(None, "m", None) == {}
    assert start_from(DEMO, None, None) == json.loads((DEMO / "MAR-INF" / "MANIFEST.json").read_text())
    src = tmp_path / "src"
    src.mkdir()
    (src / "handler.py").write_text("def handle(data, context):\n    return data\n")
    (src / "a.pt").write_bytes(b"1")
    assert start_from(src, "named", None)["model"] == {"modelName": "named", "serializedFile": "a.pt",
                                                       "handler": "handler.py", "modelVersion": "1.0"}  # fmt: skip
    (src / "b.onnx").write_bytes(b"1")
    with pytest.raises(ModelLoadError, match="has several weights files: a.pt, b.onnx"):
        start_from(src, None, None)
    # Naming the weights file settles it: the files with a role by their name are kept.
    assert start_from(src, None, "b.onnx") == {"runtime": "python", "model": {"handler": "handler.py"}}
