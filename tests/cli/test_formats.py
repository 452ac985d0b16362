"""``handlerkit formats``: the format lab from a terminal, --save, --json and the exit codes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from _cli import CIRCLE, MODEL, SQUARE, assert_usage_error, cli, cli_json
from _new_users import ranker_dir, ranker_request

from handlerkit.cli import main
from handlerkit.errors import HandlerkitWarning


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
        (("--dynamic", "item_ids:0"), ("expected INPUT:DIM pairs like item_ids:1,mask:1", "got 'item_ids:0'")),
    ],
)
def test_usage_errors_exit_2(capsys, argv, fragments):
    code = main(["formats", str(MODEL), CIRCLE, *argv])
    captured = capsys.readouterr()
    assert_usage_error(code, captured.out, captured.err, *fragments)


def ranker_files(tmp_path: Path) -> tuple[Path, list[str]]:
    """The ranker of tests/_new_users.py and two request files whose item lists differ in length."""
    model_dir = ranker_dir(tmp_path / "recs", base="handlerkit")
    files = []
    for name, request in (("short", ranker_request(1, [3, 5])), ("long", ranker_request(2, [1, 2, 3, 4, 5, 6, 7]))):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(request))
        files.append(str(path))
    return model_dir, files


def test_a_ragged_save_exports_the_varying_dimensions_dynamic(tmp_path, capsys):
    model_dir, files = ranker_files(tmp_path)
    code, data = cli_json(
        capsys, "formats", model_dir, *files, "--formats", "eager", "--save", "export", "--repeat", "1"
    )
    assert code == 0 and data["ok"] is True and data["refused"] is None
    assert data["dims"]["dynamic"] == {"item_ids": [1], "mask": [1]}
    assert data["rows"][1]["format"] == "export" and data["rows"][1]["dims"]["item_ids"] == ["batch", "*"]
    assert data["saved"]["model"]["serializedFile"] == "model.export.pt2"
    assert cli_json(capsys, "run", model_dir, files[0])[0] == 0  # the saved dir answers the short list alone


def test_a_save_refused_for_a_fixed_dimension_exits_1_and_writes_nothing(tmp_path, capsys):
    model_dir, files = ranker_files(tmp_path)
    before = sorted(p.name for p in model_dir.rglob("*") if "__pycache__" not in p.parts)
    argv = ("formats", model_dir, *files, "--formats", "eager", "--save", "export", "--dynamic", "item_ids:,mask:")
    code, out, _ = cli(capsys, *argv, "--repeat", "1")
    assert code == 1
    text = " ".join(out.split())
    assert ("export was not saved into" in text and "model.export.pt2 does not take request 0 alone (item_ids dim 1 = 2, "
            "mask dim 1 = 2): it was exported for item_ids dim 1 = 7 and mask dim 1 = 7") in text  # fmt: skip
    assert "--dynamic item_ids:1,mask:1" in text
    assert sorted(p.name for p in model_dir.rglob("*") if "__pycache__" not in p.parts) == before


def test_dynamic_naming_no_input_is_a_usage_error(tmp_path, capsys):
    model_dir, files = ranker_files(tmp_path)
    code, out, err = cli(capsys, "formats", model_dir, *files, "--formats", "eager", "--dynamic", "items:1")
    assert_usage_error(code, out, err, "--dynamic names input 'items' (did you mean 'item_ids'?)")
