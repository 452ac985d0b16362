"""The tutorial notebooks are committed executed, in order, without errors.

nbval (``pytest notebooks --nbval --nbval-sanitize-with notebooks/sanitize.cfg``) re-runs each
notebook and compares the fresh outputs with the stored ones; that only means something when
the stored outputs come from one clean top-to-bottom run. These checks are static and fast:
they read the ``.ipynb`` files and run nothing.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
SANITIZE = NOTEBOOKS_DIR / "sanitize.cfg"


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _code_cells(nb: dict) -> list[dict]:
    return [cell for cell in nb["cells"] if cell["cell_type"] == "code"]


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def test_there_are_notebooks():
    assert NOTEBOOKS, f"no notebooks in {NOTEBOOKS_DIR}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_name_is_numbered(path):
    assert re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", path.name), (
        f"{path.name}: name notebooks NN_topic.ipynb (two digits, reading order)"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_valid_nbformat_with_a_python_kernel(path):
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.get("kernelspec", {}).get("language") == "python", (
        f"{path.name}: the kernelspec must be a Python kernel (nbval starts the kernel it names)"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_code_cell_ran_once_top_to_bottom(path):
    cells = _code_cells(_load(path))
    assert cells, f"{path.name} has no code cells"
    counts = [cell.get("execution_count") for cell in cells]
    unrun = [i for i, count in enumerate(counts) if count is None]
    assert not unrun, (
        f"{path.name}: code cells {unrun} were not executed; execute the whole notebook and save it "
        "with its outputs (DESIGN.md §4)"
    )
    assert counts == list(range(1, len(cells) + 1)), (
        f"{path.name}: execution counts {counts} are not 1..{len(cells)}: the stored outputs do not come "
        "from one run in a fresh kernel; restart the kernel and run all cells"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_error_outputs(path):
    for index, cell in enumerate(_code_cells(_load(path))):
        for output in cell.get("outputs", []):
            assert output.get("output_type") != "error", (
                f"{path.name}: code cell {index} stores an error ({output.get('ename')}: {output.get('evalue')}); "
                "nbval fails a cell that raises: catch the exception in the cell and print its fields"
            )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_outputs_hold_no_machine_paths(path):
    text = json.dumps([cell.get("outputs", []) for cell in _code_cells(_load(path))])
    for local in {str(ROOT), str(Path.home())} - {"/"}:
        assert local not in text, (
            f"{path.name}: an output contains {local!r}, which differs on every machine; print paths "
            "relative to the notebook, or sanitize them in notebooks/sanitize.cfg"
        )


def test_sanitize_patterns_parse_and_compile():
    text = SANITIZE.read_text(encoding="utf-8")
    # nbval's own parser (nbval.plugin.get_sanitize_patterns) reads exactly this shape.
    pairs = re.findall(r"^regex: (.*)$\n^replace: (.*)$", text, flags=re.MULTILINE)
    assert pairs, f"{SANITIZE} holds no 'regex:' / 'replace:' pairs"
    for regex, _ in pairs:
        re.compile(regex)
