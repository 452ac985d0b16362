"""The ``handlerkit`` command in-process for the tests under tests/cli/: ``main([...])`` with its
output captured, the fixture classifier and its images, and small model dirs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from handlerkit.cli import main

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "fixtures" / "models" / "image_classifier"
IMAGES = ROOT / "fixtures" / "images"
CIRCLE, STAR, SQUARE = str(IMAGES / "circle.png"), str(IMAGES / "star.jpg"), str(IMAGES / "square.png")
COMMANDS = ("demo", "new", "run", "check", "time", "compile", "formats", "manifest", "archive", "inspect", "serve")


def cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def cli_json(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, dict]:
    """Run with ``--json``: stdout must be one JSON document and nothing else."""
    code, out, _ = cli(capsys, *argv, "--json")
    data = json.loads(out)
    assert data["exit_code"] == code
    return code, data


def assert_usage_error(code: int, out: str, err: str, *fragments: str) -> None:
    assert code == 2 and out == ""
    assert err.startswith("handlerkit: error: ") and err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err


def handler_dir(path: Path, source: str) -> Path:
    """A model dir holding only handler.py with ``source`` (its manifest is inferred)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "handler.py").write_text(source)
    return path


def copied_model(tmp_path: Path, request: pytest.FixtureRequest, config: str | None = None) -> Path:
    """The fixture classifier copied, its model.py unique to the test: Dynamo remembers sizes by
    a code's file content across a process, which would make one test's batch dim dynamic in another."""
    target = tmp_path / "image_classifier"
    shutil.copytree(MODEL, target)
    with open(target / "model.py", "a") as f:
        f.write(f"\n# {request.node.nodeid}\n")
    if config is not None:
        (target / "model-config.yaml").write_text(config)
    return target


#: A model-config.yaml that compiles with the eager backend (no Inductor), dynamic or not.
EAGER = "batchSize: 4\npt2:\n  compile:\n    enable: true\n    backend: eager\n    dynamic: {dynamic}\n"
