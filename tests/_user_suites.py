"""Shared by test_pytest_plugin.py and test_testing.py: a user's test suite run by a real pytest
in a subprocess (``pytester``), with handlerkit's plugin loaded as an installed project gets it.

Each run costs 1-4 s (torch and the model load in it), so user files hold several tests.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "fixtures" / "models" / "image_classifier"
IMAGES = ROOT / "fixtures" / "images"
TRUNCATED = ROOT / "fixtures" / "bad" / "truncated.png"


def plugin_args() -> list[str]:
    """Load the plugin explicitly unless the installed entry point does it: pytest refuses the
    same module registered twice (as "handlerkit" by the entry point and by ``-p``)."""
    installed = any(ep.value == "handlerkit.pytest_plugin" for ep in importlib.metadata.entry_points(group="pytest11"))
    return [] if installed else ["-p", "handlerkit.pytest_plugin"]


def run_pytest(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """pytest run in a subprocess in ``pytester``'s folder."""
    # nbval's plugin alone costs ~1.7 s of imports per pytest start; these runs need none of it.
    return pytester.runpytest_subprocess(*plugin_args(), "-p", "no:cacheprovider", "-p", "no:nbval", *args)


def write_ini(pytester: pytest.Pytester, model: str | Path | None) -> None:
    """A pytest.ini naming ``model`` as ``hk_model_dir`` (None: no model configured)."""
    pytester.makeini("[pytest]\n" + (f"hk_model_dir = {model}\n" if model is not None else ""))
