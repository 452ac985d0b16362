"""The ``handlerkit`` command: fast help, and the demo on the bundled assets."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from handlerkit.cli import demo_paths, main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_import_and_help_do_not_import_torch():
    code = "import sys, handlerkit, handlerkit.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    help_run = subprocess.run([sys.executable, "-m", "handlerkit.cli", "--help"], capture_output=True, text=True)
    assert help_run.returncode == 0 and "demo" in help_run.stdout


def test_demo_assets_ship_inside_the_package():
    model_dir, images = demo_paths()
    assert model_dir.startswith(os.path.dirname(sys.modules["handlerkit"].__file__))
    assert os.path.isfile(os.path.join(model_dir, "MAR-INF", "MANIFEST.json"))
    assert {os.path.basename(p) for p in images} >= {"circle.png", "star.jpg"}


def test_demo_prints_a_row_per_stage_and_predictions(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    for stage in ("initialize", "preprocess", "inference", "postprocess"):
        assert f"\n{stage}" in out
    assert "Tensor[3, 3, 224, 224] float32 cpu" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.split() and "." in line.split()[0]}
    assert lines["circle.png"].split()[1] == "circle"
    assert lines["star.jpg"].split()[1] == "star"


def test_run_on_a_model_dir(capsys):
    model_dir = os.path.join(ROOT, "fixtures", "models", "image_classifier")
    image = os.path.join(ROOT, "fixtures", "images", "square.png")
    assert main(["run", model_dir, image]) == 0
    assert "square.png  square" in capsys.readouterr().out


def test_errors_are_reported_without_a_traceback(tmp_path, capsys):
    with pytest.warns(Warning):
        code = main(["run", str(tmp_path), os.path.join(ROOT, "fixtures", "images", "square.png")])
    assert code == 1
    assert "handlerkit: error:" in capsys.readouterr().err


def test_a_missing_input_file_is_one_line_and_exit_code_2(capsys):
    model_dir = os.path.join(ROOT, "fixtures", "models", "image_classifier")
    assert main(["run", model_dir, "missing.png"]) == 2
    captured = capsys.readouterr()
    assert captured.err == "handlerkit: error: no such file: missing.png\n" and captured.out == ""


def test_a_missing_model_dir_is_exit_code_2(capsys, tmp_path):
    image = os.path.join(ROOT, "fixtures", "images", "square.png")
    assert main(["run", str(tmp_path / "nowhere"), image]) == 2
    assert capsys.readouterr().err.startswith("handlerkit: error: no such model dir: ")


def test_demo_help_says_what_it_does():
    out = subprocess.run([sys.executable, "-m", "handlerkit.cli", "demo", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "built-in image_classifier on the bundled 'shapes' model" in text
    assert "grace_hopper.jpg is a real photo outside what the shapes model knows" in text


def test_demo_notes_that_the_photo_is_outside_the_model(capsys):
    assert main(["demo"]) == 0
    assert "grace_hopper.jpg is a photo outside what it knows" in capsys.readouterr().out


def test_a_handler_returning_no_list_is_reported_with_exit_code_1(tmp_path, capsys):
    (tmp_path / "handler.py").write_text("def handle(data, context):\n    return None\n")
    request = tmp_path / "request.txt"
    request.write_text("hello")
    with pytest.warns(Warning) as caught:
        code = main(["run", str(tmp_path), str(request), "--handler", "handler.py:handle"])
    messages = [str(w.message) for w in caught]
    assert any("inferred the manifest" in m for m in messages)  # no MAR-INF/MANIFEST.json here
    assert any("must return a list" in m for m in messages)
    out = capsys.readouterr().out
    assert code == 1 and "contract problems" in out and out.rstrip().endswith("(all)    None")
