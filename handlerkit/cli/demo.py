"""``handlerkit demo``: the built-in image classifier on the shapes model bundled in the package."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from importlib import resources
from typing import Any

from handlerkit.cli._common import Outcome

HELP = "run the built-in image classifier on the bundled shapes model"
DESCRIPTION = (
    "Run handlerkit's built-in image_classifier on the bundled 'shapes' model (a small CNN that "
    "knows circle, square, triangle, star, cross...) with three bundled images, stage by stage: "
    "what each stage took and gave, then the top predictions. grace_hopper.jpg is a real photo "
    "outside what the shapes model knows, so its prediction is a guess among shapes."
)
NOTE = (
    "note: the shapes model knows only drawn shapes; grace_hopper.jpg is a photo outside "
    "what it knows, so its top class is a guess."
)


def demo_paths() -> tuple[str, list[str]]:
    """The bundled demo model dir and images (they ship inside the package)."""
    root = resources.files("handlerkit") / "assets" / "demo"
    model_dir = str(root / "image_classifier")
    images_dir = root / "images"
    images = sorted(str(images_dir / name) for name in os.listdir(str(images_dir)))
    return model_dir, images


def add_parser(commands: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("demo", help=HELP, description=DESCRIPTION, parents=parents)
    parser.set_defaults(command=command)


def command(args: argparse.Namespace) -> Outcome:
    from handlerkit.cli._common import open_model
    from handlerkit.cli.run import run_files

    model_dir, images = demo_paths()
    with open_model(model_dir, "image_classifier") as model:
        outcome = run_files(model, images)
    outcome.text += f"\n\n{NOTE}"
    return outcome
