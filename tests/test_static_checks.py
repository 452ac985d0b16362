"""The static checks CI makes, as tests (so the README's test command runs them): the linter,
the formatter's check and the type checker over handlerkit/, configured in pyproject.toml.
ruff and mypy come with the ``[test]`` extra (pinned in .ci/constraints.txt)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing():
    out = run("ruff", "check", "--no-cache", "handlerkit")
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_code_is_formatted():
    out = run("ruff", "format", "--check", "--no-cache", "handlerkit")
    assert out.returncode == 0, f"run `ruff format handlerkit`:\n{out.stdout}{out.stderr}"


def test_mypy_finds_nothing():
    out = run("mypy", "--no-incremental", "--config-file", "pyproject.toml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Success: no issues found" in out.stdout


def test_the_checks_fail_on_a_planted_problem(tmp_path):
    """The checks above are only worth their verdicts if they catch a planted problem: a None
    misused (mypy), an unused import (ruff), a line the formatter would change."""
    planted = tmp_path / "planted.py"
    planted.write_text("import os\n\n\ndef f(x: int | None) -> int:\n    return x  + 1\n")
    assert run("ruff", "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), str(planted)).returncode == 1
    assert run("ruff", "format", "--check", "--no-cache", str(planted)).returncode == 1
    out = run("mypy", "--no-incremental", "--strict-optional", "--check-untyped-defs", str(planted))
    assert out.returncode == 1 and 'Unsupported operand types for + ("None" and "int")' in out.stdout
