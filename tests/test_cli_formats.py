"""``handlerkit formats``: the format lab from a terminal, --save, --json and the exit codes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_cli import CIRCLE, MODEL, SQUARE, assert_usage_error, cli, cli_json

from handlerkit.cli import main


def test_formats_json_reports_each_format_and_exits_0(capsys):
    code, data = cli_json(capsys, "formats", MODEL, CIRCLE, SQUARE, "--formats", "torchscript", "--repeat", "2")
    assert code == 0 and data["ok"] is True and data["saved"] is None
    assert [row["format"] for row in data["rows"]] == ["eager", "torchscript"]
    assert all(row["agrees"] for row in data["rows"])


def test_save_writes_the_format_into_the_model_dir(tmp_path, capsys):
    model_dir = Path(shutil.copytree(MODEL, tmp_path / "clf"))
    code, out, _ = cli(capsys, "formats", model_dir, CIRCLE, "--formats", "eager", "--save", "torchscript", "--repeat", "1")
    assert code == 0, out
    assert f"saved torchscript into {model_dir}: model.torchscript.pt" in " ".join(out.split())
    manifest = json.loads((model_dir / "MAR-INF" / "MANIFEST.json").read_text())["model"]
    assert manifest["serializedFile"] == "model.torchscript.pt" and (model_dir / "model.pt").is_file()
    code, data = cli_json(capsys, "run", model_dir, CIRCLE)
    assert code == 0 and "circle" in json.dumps(data)


def test_a_format_that_disagrees_exits_1(capsys, monkeypatch):
    import handlerkit.formats

    load_model = handlerkit.formats.load_model

    def perturbed(fmt, **kwargs):
        loaded = load_model(fmt, **kwargs)
        inner = loaded.model
        loaded.model = lambda x: inner(x) * -1.0
        return loaded

    monkeypatch.setattr(handlerkit.formats, "load_model", perturbed)
    code, data = cli_json(capsys, "formats", MODEL, CIRCLE, "--formats", "torchscript", "--repeat", "1")
    assert code == 1 and data["ok"] is False
    assert data["rows"][1]["agrees"] is False and data["rows"][1]["difference"].startswith("answers differ")


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (("--formats", "onx"), ("unknown format 'onx'", "did you mean 'onnx'")),
        (("--save", "tflite"), ("invalid choice: 'tflite'",)),
        (("--replace",), ("--replace deletes earlier saves when --save FORMAT saves a new one",)),
    ],
)
def test_usage_errors_exit_2(capsys, argv, fragments):
    code = main(["formats", str(MODEL), CIRCLE, *argv])
    captured = capsys.readouterr()
    assert_usage_error(code, captured.out, captured.err, *fragments)
