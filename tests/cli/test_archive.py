"""``handlerkit archive``: a .mar (or a no-archive dir, or a .tar.gz) built from a model dir, and
the archive run, checked and inspected like its dir."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from _cli import CIRCLE, MODEL, STAR, assert_usage_error, cli, cli_json


@pytest.fixture
def mar(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    code, data = cli_json(capsys, "archive", MODEL, "-o", tmp_path / "store")
    assert code == 0
    return Path(data["path"])


def test_archive_builds_a_mar_with_the_manifest(mar, capsys):
    assert mar.name == "image_classifier.mar" and zipfile.is_zipfile(mar)
    with zipfile.ZipFile(mar) as zf:
        manifest = json.loads(zf.read("MAR-INF/MANIFEST.json"))
    assert manifest["model"]["handler"] == "image_classifier" and manifest["model"]["modelName"] == "image_classifier"


def test_archive_prints_the_torchserve_command(tmp_path, capsys):
    code, out, _ = cli(capsys, "archive", MODEL, "-o", tmp_path, "--model-name", "shapes")
    assert code == 0 and out.startswith(f"wrote {tmp_path / 'shapes.mar'} (")
    assert f"torchserve --start --ncs --model-store {tmp_path} --models shapes=shapes.mar" in out


def test_archive_refuses_to_overwrite_without_force(mar, capsys):
    code, out, err = cli(capsys, "archive", MODEL, "-o", mar.parent)
    assert_usage_error(code, out, err, str(mar))
    assert cli(capsys, "archive", MODEL, "-o", mar.parent, "--force")[0] == 0


@pytest.mark.parametrize("fmt, name", [("no-archive", "image_classifier"), ("tgz", "image_classifier.tar.gz")])
def test_archive_formats(tmp_path, capsys, fmt, name):
    code, data = cli_json(capsys, "archive", MODEL, "-o", tmp_path, "--format", fmt)
    assert code == 0 and Path(data["path"]) == tmp_path / name and data["format"] == fmt
    code, out, _ = cli(capsys, "run", data["path"], CIRCLE)
    assert code == 0 and "circle.png  circle" in out


def test_archive_without_a_source_or_files_is_exit_code_2(capsys, tmp_path):
    assert_usage_error(*cli(capsys, "archive", "-o", tmp_path), "give SOURCE")
    assert_usage_error(*cli(capsys, "archive", MODEL, "-o", tmp_path, "--extra-files", "nowhere.json"), "nowhere.json")
    assert_usage_error(*cli(capsys, "archive", tmp_path / "nowhere", "-o", tmp_path), "does not exist")


def test_a_mar_runs_checks_and_inspects_like_its_dir(mar, capsys):
    _, from_dir = cli_json(capsys, "run", MODEL, CIRCLE, STAR)
    code, from_mar = cli_json(capsys, "run", mar, CIRCLE, STAR)
    # The model is named as its manifest names it (what TorchServe serves it as), from a .mar or its dir.
    assert code == 0 and from_mar["output"] == from_dir["output"] and from_mar["model"] == from_dir["model"] == "image_classifier"
    assert cli(capsys, "check", mar, CIRCLE)[0] == 0
    code, out, _ = cli(capsys, "inspect", mar)
    assert code == 0 and out.startswith("image_classifier.mar (mar): model image_classifier 1.0, handler ImageClassifier")
    _, data = cli_json(capsys, "inspect", mar)
    assert data["manifest"]["model"] == json.loads((MODEL / "MAR-INF" / "MANIFEST.json").read_text())["model"]
    assert {f["name"] for f in data["files"]} >= {"model.pt", "MAR-INF/MANIFEST.json"}
    assert all("compressed" in f for f in data["files"]) and data["kind"] == "mar"
