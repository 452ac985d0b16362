"""``handlerkit demo``: the built-in image classifier on the bundled shapes model."""

from __future__ import annotations

import os
import sys

from _cli import cli

from handlerkit.cli import demo_paths


def test_demo_assets_ship_inside_the_package():
    model_dir, images = demo_paths()
    assert model_dir.startswith(os.path.dirname(sys.modules["handlerkit"].__file__))
    assert os.path.isfile(os.path.join(model_dir, "MAR-INF", "MANIFEST.json"))
    assert {os.path.basename(p) for p in images} >= {"circle.png", "star.jpg"}


def test_demo_prints_a_row_per_stage_predictions_and_the_note(capsys):
    code, out, _ = cli(capsys, "demo")
    assert code == 0
    for stage in ("initialize", "preprocess", "inference", "postprocess"):
        assert f"\n{stage}" in out
    assert "Tensor[3, 3, 224, 224] float32 cpu" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.split() and "." in line.split()[0]}
    assert lines["circle.png"].split()[1] == "circle"
    assert lines["star.jpg"].split()[1] == "star"
    assert out.rstrip().endswith("grace_hopper.jpg is a photo outside what it knows, so its top class is a guess.")


def test_demo_help_says_what_it_does(capsys):
    code, out, _ = cli(capsys, "demo", "--help")
    text = " ".join(out.split())
    assert code == 0
    assert "built-in image_classifier on the bundled 'shapes' model" in text
    assert "grace_hopper.jpg is a real photo outside what the shapes model knows" in text
