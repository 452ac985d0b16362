"""README.md is executed: its Python blocks run, and its test command is the one CI runs."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


def test_readme_opens_with_the_two_commands():
    blocks = re.findall(r"```bash\n(.*?)```", README, re.S)
    assert "handlerkit demo" in blocks[0] and "pip install" in blocks[0]
    assert "pytest" in blocks[1] and '".[test]"' in blocks[1]


def test_ci_runs_the_readme_test_command():
    awk = open(os.path.join(ROOT, ".ci", "run")).read()
    assert "<!-- test-command -->" in awk
    marked = re.search(r"<!-- test-command -->\n```bash\n(.*?)\n```\n<!-- /test-command -->", README, re.S)
    assert marked, "README.md must mark its test command for .ci/run"
    extracted = subprocess.run(
        ["awk", "/<!-- test-command -->/{f=1; next} /<!-- \\/test-command -->/{f=0} f && /^[^`]/", "README.md"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert extracted == marked.group(1).strip()


@pytest.mark.parametrize("block", re.findall(r"```python\n(.*?)```", README, re.S))
def test_python_blocks_run(block, monkeypatch):
    monkeypatch.chdir(ROOT)
    exec(compile(block, "README.md", "exec"), {"__name__": "readme"})
