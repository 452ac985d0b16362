"""docs/architecture.md says what the code is: its layer table is tests/test_imports.py's LAYERS,
and its module map lists every module of the package and nothing that does not exist."""

from __future__ import annotations

import re
from pathlib import Path

from test_imports import LAYERS, MODULES, PACKAGE

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"


def layer_table(text: str) -> dict[str, int]:
    """``{module: layer}`` from the doc's table: a row per layer, the modules in backticks."""
    found: dict[str, int] = {}
    for row in re.findall(r"^\| (\d+) \|[^|]*\|([^|]*)\|$", text, re.M):
        for name in re.findall(r"`(handlerkit[\w.]*)`", row[1]):
            found[name] = int(row[0])
    return found


def module_map(text: str) -> set[str]:
    """The paths the doc's ``handlerkit/`` block lists: two spaces of indent per folder, and
    several names on one line where they share a description."""
    block = re.search(r"```\nhandlerkit/\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no module map (a ``` block starting with handlerkit/)"
    listed: set[str] = set()
    folders: list[str] = []
    for line in block.group(1).splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 2 - 1
        names = []
        for word in line.split():
            if not re.fullmatch(r"[\w.]+(\.py|/)", word):
                break
            names.append(word)
        del folders[depth:]
        for name in names:
            if name.endswith("/"):
                folders.append(name.rstrip("/"))
            else:
                listed.add("/".join(["handlerkit", *folders, name]))
    return listed


def test_the_layer_table_is_the_one_the_imports_test_enforces():
    assert layer_table(DOC.read_text(encoding="utf-8")) == LAYERS


def test_the_module_map_lists_every_module_and_no_other():
    listed = module_map(DOC.read_text(encoding="utf-8"))
    actual = {p.relative_to(PACKAGE.parent).as_posix() for p in MODULES.values()}
    assert not actual - listed, f"add these to docs/architecture.md's module map: {sorted(actual - listed)}"
    assert not listed - actual, f"docs/architecture.md lists modules that do not exist: {sorted(listed - actual)}"


def test_the_parsers_read_what_they_are_given():
    """The checks above are only worth their verdicts if the parsers see planted rows and lines."""
    table = "| layer | what | where |\n|---|---|---|\n| 2 | the model | `handlerkit.worker` `handlerkit.formats` |\n"
    assert layer_table(table) == {"handlerkit.worker": 2, "handlerkit.formats": 2}
    block = (
        "```\nhandlerkit/\n  errors.py   the errors\n  worker/   the worker\n    a.py b.py   two\n"
        "    deep/\n      c.py  one\n  top.py  back at the top\n```\n"
    )
    assert module_map(block) == {
        "handlerkit/errors.py",
        "handlerkit/worker/a.py",
        "handlerkit/worker/b.py",
        "handlerkit/worker/deep/c.py",
        "handlerkit/top.py",
    }
