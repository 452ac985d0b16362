"""``handlerkit manifest DIR``: a model dir's MAR-INF/MANIFEST.json, the one ``handlerkit archive``
writes into the ``.mar``; and the commands that the inferred-manifest warning and the
several-weights error give as their fix, run as printed."""

from __future__ import annotations

import json
import shlex
import shutil
import warnings
import zipfile
from pathlib import Path

import pytest

import handlerkit as hk
from handlerkit.cli import main
from handlerkit.errors import HandlerkitWarning, ModelLoadError

ROOT = Path(__file__).resolve().parents[2]
CLASSIFIER = ROOT / "fixtures" / "models" / "image_classifier"
CIRCLE = ROOT / "fixtures" / "images" / "circle.png"
HANDLER = "def handle(data, context):\n    return ['ok' for _ in data or []]\n"


def cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def classifier_dir(tmp_path: Path, *extra: str) -> Path:
    """The fixture classifier without its manifest, plus a handler.py and the ``extra`` files."""
    target = shutil.copytree(CLASSIFIER, tmp_path / "shapes", ignore=shutil.ignore_patterns("MAR-INF", "__pycache__"))
    (target / "handler.py").write_text("from handlerkit.handlers import ImageClassifier\n\n\nclass Shapes(ImageClassifier):\n    pass\n")
    for name in extra:
        (target / name).write_text("x\n")
    return target


def loads_without_warnings(model_dir: Path) -> hk.MockContext:
    with warnings.catch_warnings():
        warnings.simplefilter("error", HandlerkitWarning)
        return hk.MockContext.from_model_dir(model_dir)


def test_it_writes_the_manifest_archive_writes_into_the_mar(tmp_path, capsys):
    model_dir = classifier_dir(tmp_path)
    code, out, err = cli(capsys, "archive", model_dir, "-o", tmp_path / "store")
    assert code == 0, err
    archived = json.loads(zipfile.ZipFile(tmp_path / "store" / "shapes.mar").read("MAR-INF/MANIFEST.json"))
    code, out, err = cli(capsys, "manifest", model_dir)
    assert code == 0, err
    path = model_dir / "MAR-INF" / "MANIFEST.json"
    assert out.splitlines()[0] == f"wrote {path}"
    written = json.loads(path.read_text())
    assert list(written) == ["createdOn", "runtime", "model", "archiverVersion"]  # the archiver's order
    assert {**written, "createdOn": None} == {**archived, "createdOn": None}
    assert written["model"] == {
        "modelName": "shapes",
        "serializedFile": "model.pt",
        "handler": "handler.py",
        "modelFile": "model.py",
        "modelVersion": "1.0",
        "configFile": "model-config.yaml",
    }
    h = hk.Harness(None, loads_without_warnings(model_dir))  # no more "inferred the manifest"
    top = h.run(hk.batch(hk.Request.from_file(CIRCLE))).output[0]
    assert max(top, key=top.get) == "circle"


def test_the_options_name_the_files_as_the_archivers_do(tmp_path, capsys):
    model_dir = classifier_dir(tmp_path)
    (model_dir / "handler.py").unlink()
    code, _, err = cli(capsys, "manifest", model_dir)
    assert (code, err) == (2, f"handlerkit: error: {model_dir} has no handler.py: pass --handler (a built-in name "
                              "such as image_classifier, or a .py file of the dir, file.py:function too)\n")
    assert not (model_dir / "MAR-INF").exists()
    code, _, err = cli(capsys, "manifest", model_dir, "--handler", "image_classifier", "--model-name", "shapes_v2",
                       "--version", "2.0")  # fmt: skip
    assert code == 0, err
    model = json.loads((model_dir / "MAR-INF" / "MANIFEST.json").read_text())["model"]
    assert (model["handler"], model["modelName"], model["modelVersion"]) == ("image_classifier", "shapes_v2", "2.0")


def test_the_output_names_what_archive_packs_once_the_dir_has_a_manifest(tmp_path, capsys):
    model_dir = classifier_dir(tmp_path, "train.py", "notes.md")
    code, out, err = cli(capsys, "manifest", model_dir, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["now_packed"] == ["accuracy.json", "notes.md", "train.py"] and data["refused"] is None
    assert data["notes"] == [
        "with a manifest, handlerkit archive packs the dir whole (an unpacked .mar), so now also "
        "accuracy.json, notes.md, train.py: move out what the server does not need"
    ]
    assert cli(capsys, "archive", model_dir, "-o", tmp_path / "store")[0] == 0  # and so it does
    assert {"accuracy.json", "notes.md", "train.py"} <= set(zipfile.ZipFile(tmp_path / "store" / "shapes.mar").namelist())


def test_a_hidden_file_that_archive_would_now_refuse_is_named(tmp_path, capsys):
    model_dir = classifier_dir(tmp_path, ".gitignore")
    code, out, err = cli(capsys, "manifest", model_dir)
    assert code == 0, err
    assert (model_dir / "MAR-INF" / "MANIFEST.json").is_file()
    note = out.splitlines()[-1]
    assert note.startswith("note: handlerkit archive now refuses the dir: the unpacked .mar shapes/ ")
    assert "would sweep in .gitignore, which belongs to version control" in note
    assert note.endswith("to leave it out, move it out of the model dir)")


def test_an_existing_manifest_is_replaced_only_with_force_keeping_its_keys(tmp_path, capsys):
    model_dir = classifier_dir(tmp_path)
    assert cli(capsys, "manifest", model_dir, "--version", "3.1")[0] == 0
    code, out, err = cli(capsys, "manifest", model_dir, "--handler", "image_classifier")
    path = model_dir / "MAR-INF" / "MANIFEST.json"
    assert (code, out) == (2, "")
    assert err == f"handlerkit: error: {path} exists: pass --force to write it anew (its keys are kept unless the options change them)\n"
    assert cli(capsys, "manifest", model_dir, "--handler", "image_classifier", "--force")[0] == 0
    model = json.loads(path.read_text())["model"]
    assert (model["handler"], model["modelVersion"], model["serializedFile"]) == ("image_classifier", "3.1", "model.pt")


def test_a_file_outside_the_dir_is_refused(tmp_path, capsys):
    model_dir = classifier_dir(tmp_path)
    elsewhere = tmp_path / "elsewhere.pt"
    shutil.copy(model_dir / "model.pt", elsewhere)
    code, out, err = cli(capsys, "manifest", model_dir, "--serialized-file", elsewhere)
    assert (code, out) == (2, "")
    assert err.startswith(f"handlerkit: error: the manifest would name serializedFile elsewhere.pt, which {model_dir} "
                          "does not hold: a manifest names files of its model dir; copy them in")  # fmt: skip
    assert not (model_dir / "MAR-INF").exists()


@pytest.mark.parametrize("path", ["missing", "a_file"])
def test_no_directory_is_exit_code_2(tmp_path, capsys, path):
    (tmp_path / "a_file").write_text("")
    code, out, err = cli(capsys, "manifest", tmp_path / path)
    assert (code, out) == (2, "")
    assert err == f"handlerkit: error: {tmp_path / path} is not a directory: give the model dir\n"


# ------------------------------------------------------------------- fixes that name this command


def test_the_inferred_manifest_warnings_fix_runs_as_printed_and_silences_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model_dir = tmp_path / "my models" / "echo"
    model_dir.mkdir(parents=True)
    (model_dir / "handler.py").write_text(HANDLER)
    with pytest.warns(HandlerkitWarning, match="inferred the manifest") as caught:
        hk.MockContext.from_model_dir(model_dir)
    fix = str(caught[0].message).splitlines()[-1]
    assert fix == "  fix: handlerkit manifest 'my models/echo'"
    argv = shlex.split(fix.removeprefix("  fix: "))
    assert cli(capsys, *argv[1:])[0] == 0
    assert loads_without_warnings(model_dir).manifest["model"]["handler"] == "handler.py"


def test_a_dir_name_torchserve_refuses_asks_for_a_model_name(tmp_path, capsys):
    model_dir = tmp_path / "my model"
    model_dir.mkdir()
    (model_dir / "handler.py").write_text(HANDLER)
    code, out, err = cli(capsys, "manifest", model_dir)
    assert (code, out) == (2, "")
    assert err.startswith("handlerkit: error: model name 'my model' is not allowed: TorchServe wants ")
    assert err.endswith("; pass --model-name with letters, digits, '_', '-' and '.'\n")
    assert cli(capsys, "manifest", model_dir, "--model-name", "my_model")[0] == 0


def test_the_several_weights_errors_fix_runs_as_printed(tmp_path, capsys):
    model_dir = classifier_dir(tmp_path)
    shutil.copy(model_dir / "model.pt", model_dir / "old.pt")
    with pytest.raises(ModelLoadError, match="several weights files: model.pt, old.pt") as info:
        hk.MockContext.from_model_dir(model_dir)
    command = info.value.fix.split(": ", 1)[1].split(" (or ", 1)[0]
    assert command == f"handlerkit manifest {model_dir} --serialized-file model.pt"
    assert cli(capsys, *shlex.split(command)[1:])[0] == 0
    assert loads_without_warnings(model_dir).manifest["model"]["serializedFile"] == "model.pt"
