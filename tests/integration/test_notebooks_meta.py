"""The tutorial notebooks are committed executed, in order, without errors, frozen progress
bars or a warning said twice.

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

ROOT = Path(__file__).resolve().parents[2]
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


def _output_texts(output: dict) -> list[str]:
    """The text an output shows: a stream's, or each text/* representation's."""
    if output.get("output_type") == "stream":
        text = output.get("text", "")
        return ["".join(text) if isinstance(text, list) else text]
    texts = []
    for mime, value in output.get("data", {}).items():
        if mime.startswith("text/"):
            texts.append("".join(value) if isinstance(value, list) else value)
    return texts


# tqdm's bar as its text twin shows it: "  0%|          | 0/12 [00:00<?, ?it/s]"
_PROGRESS_BAR = re.compile(r"\d+%\|.*\|\s*\d+/\d+")
# a warning as Python prints it on stderr: "<file>:<line>: SomeWarning: message"
_WARNING_LINE = re.compile(r"^\S.*?:\d+: (\w*Warning): (?:handlerkit: )?(.+)$", flags=re.MULTILINE)


def progress_bars(nb: dict) -> list[str]:
    """'cell N: <the bar>' for each progress bar kept in a notebook's outputs."""
    found = []
    for index, cell in enumerate(_code_cells(nb)):
        for output in cell.get("outputs", []):
            found += [f"cell {index}: {m.group(0)}" for t in _output_texts(output) for m in _PROGRESS_BAR.finditer(t)]
    return found


def repeated_warnings(nb: dict) -> list[str]:
    """'cell N: <message>' for each warning on a cell's stderr that the cell's outputs say again
    (a second time on stderr, or in a table's notes)."""
    found = []
    for index, cell in enumerate(_code_cells(nb)):
        outputs = cell.get("outputs", [])
        stderr = "".join(
            t
            for o in outputs
            if o.get("output_type") == "stream" and o.get("name") == "stderr"
            for t in _output_texts(o)
        )
        shown = "\n".join(t for o in outputs for t in _output_texts(o))
        for match in _WARNING_LINE.finditer(stderr):
            message = match.group(2).strip()
            if shown.count(message) > 1:
                found.append(f"cell {index}: {message}")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_progress_bars_in_outputs(path):
    bars = progress_bars(_load(path))
    assert not bars, (
        f"{path.name} keeps progress bars in its outputs, frozen where the run left them: {bars[:3]}; "
        "execute the notebooks with HANDLERKIT_PROGRESS=0 (tests/conftest.py sets it for nbval), or pass progress=False"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_warning_said_twice(path):
    repeated = repeated_warnings(_load(path))
    assert not repeated, (
        f"{path.name}: a warning is shown twice in one cell's outputs: {repeated[:3]}; say it once "
        "(on stderr or in the report's notes, not both)"
    )


def test_the_output_checks_can_fail():
    bar = {"output_type": "stream", "name": "stderr", "text": "  0%|          | 0/12 [00:00<?, ?it/s]"}
    warned = {
        "output_type": "stream",
        "name": "stderr",
        "text": "/tmp/ipykernel_1/2.py:2: HandlerkitWarning: handlerkit: the load is 4.7\n  h.time(batch)\n",
    }
    noted = {"output_type": "execute_result", "data": {"text/plain": "timing\nnote: the load is 4.7"}}
    nb = {"cells": [{"cell_type": "code", "outputs": [bar]}, {"cell_type": "code", "outputs": [warned, noted]}]}
    assert progress_bars(nb) == ["cell 0: 0%|          | 0/12"]
    assert repeated_warnings(nb) == ["cell 1: the load is 4.7"]
    once = {"cells": [{"cell_type": "code", "outputs": [warned]}]}
    assert repeated_warnings(once) == []
