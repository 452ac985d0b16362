"""Progress bars: drawn where a person watches, silent in pipes, CI and the test suite."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import handlerkit as hk
from handlerkit import _progress
from handlerkit._progress import Bar, bar, wanted

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv("HANDLERKIT_PROGRESS", raising=False)
    monkeypatch.delenv("CI", raising=False)


class _Tty:
    def __init__(self, tty: bool) -> None:
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def test_explicit_choice_wins(monkeypatch):
    monkeypatch.setenv("HANDLERKIT_PROGRESS", "0")
    assert wanted(True) is True
    monkeypatch.setenv("HANDLERKIT_PROGRESS", "1")
    assert wanted(False) is False


@pytest.mark.parametrize("value, expected", [("0", False), ("off", False), ("False", False), ("1", True), ("yes", True)])
def test_environment_switch(monkeypatch, value, expected):
    monkeypatch.setenv("HANDLERKIT_PROGRESS", value)
    assert wanted() is expected


def test_ci_is_silent_and_terminals_are_not(no_env, monkeypatch):
    monkeypatch.setattr(sys, "stderr", _Tty(True))
    assert wanted() is True
    monkeypatch.setenv("CI", "true")
    assert wanted() is False
    monkeypatch.delenv("CI")
    monkeypatch.setattr(sys, "stderr", _Tty(False))  # a pipe or a log file
    assert wanted() is False


def test_a_kernel_counts_as_watched(no_env, monkeypatch):
    monkeypatch.setattr(sys, "stderr", _Tty(False))
    monkeypatch.setattr(_progress, "_in_kernel", lambda: True)
    assert wanted() is True


def test_off_bar_does_nothing_and_iterates_everything():
    with Bar(3, "x", progress=False) as shown:
        shown.update()
        shown.set_description("y")
        assert shown._bar is None
    assert list(bar(range(4), "x", progress=False)) == [0, 1, 2, 3]


def test_on_bar_counts_to_its_total(capsys):
    with Bar(3, "counting", progress=True) as shown:
        for _ in range(3):
            shown.update()
        assert shown._bar.n == shown._bar.total == 3
    assert shown._bar is None  # closed
    assert "counting" in capsys.readouterr().err
    assert list(bar([1, 2, 3], "iterating", progress=True)) == [1, 2, 3]
    assert "iterating:   0%" in capsys.readouterr().err


def test_time_and_sweep_draw_one_bar_each(capsys):
    h = hk.Harness("image_classifier", hk.MockContext.from_model_dir(FIXTURES / "models" / "image_classifier"))
    batch = hk.batch(hk.Request.from_file(FIXTURES / "images" / "circle.png"))
    h.time(batch, warmup=1, repeat=2, progress=True)
    err = capsys.readouterr().err
    assert "timing ImageClassifier:   0%" in err and "0/3" in err  # warm-up + repeat
    h.sweep(batch, batch_sizes=[1, 2], warmup=0, repeat=2, progress=True)
    err = capsys.readouterr().err
    assert "sweep ImageClassifier: batch 2" in err and "/4" in err
    h.time(batch, warmup=0, repeat=2)  # the suite sets HANDLERKIT_PROGRESS=0
    assert capsys.readouterr().err == ""


def test_check_draws_one_bar_over_its_phases(capsys):
    h = hk.Harness("image_classifier", hk.MockContext.from_model_dir(FIXTURES / "models" / "image_classifier"))
    report = h.check(hk.batch(hk.Request.from_file(FIXTURES / "images" / "circle.png")), progress=True)
    assert report.ok
    err = capsys.readouterr().err
    assert "check ImageClassifier: the batch:   0%" in err and "0/4" in err


class _Handle:
    """What ``IPython.display.display(obj, display_id=True)`` returns: the updates it got."""

    def __init__(self, shown) -> None:
        self.shown, self.updates = shown, []

    def update(self, obj, **kwargs) -> None:
        self.updates.append((obj, kwargs))


def test_a_notebook_bar_counts_to_its_total_then_empties_its_output(no_env, monkeypatch):
    pytest.importorskip("ipywidgets")
    import IPython.display

    handles = []
    monkeypatch.setattr(_progress, "_in_kernel", lambda: True)
    monkeypatch.setattr(IPython.display, "display", lambda obj, display_id=False: handles.append(_Handle(obj)) or handles[-1])
    monkeypatch.setattr(_progress, "_REDRAW_S", 3600.0)  # no redraw on time: only the last count and descriptions
    with Bar(12, "timing <H>") as shown:
        notebook_bar = shown._bar
        [handle] = handles
        label, progress = handle.shown.children
        assert label.value == "<span style='font-family:monospace'>timing &lt;H&gt;: 0/12</span>" and progress.max == 12
        for _ in range(11):
            shown.update()
        assert notebook_bar.n == 11 and progress.value == 0  # not redrawn yet
        shown.update()
        assert notebook_bar.text == "timing <H>: 12/12" and progress.value == 12  # the end is always drawn
        assert handle.updates == []
    # Closed: the output becomes an empty widget view (hidden by JupyterLab, skipped by nbval), so a saved
    # notebook keeps no bar, and the widgets are gone.
    assert handle.updates == [({_progress.WIDGET_VIEW: {"version_major": 2, "version_minor": 0, "model_id": ""}}, {"raw": True})]
    assert label.comm is None and progress.comm is None and handle.shown.comm is None
    assert shown._bar is None


def test_a_notebook_saved_after_timing_keeps_no_bar_and_compares_as_without_one():
    """In a real kernel (as JupyterLab, nbconvert or nbval run a notebook): the bar's saved
    output holds only an empty widget view, so nbval, which skips widget views, sees the same
    outputs with the bar as without it, and no '0%| | 0/12' stays behind."""
    pytest.importorskip("ipywidgets")
    import nbclient
    import nbformat

    setup = "\n".join([
        "import handlerkit as hk",
        f"h = hk.Harness('image_classifier', hk.MockContext.from_model_dir({str(FIXTURES / 'models' / 'image_classifier')!r}))",
        f"batch = hk.batch(hk.Request.from_file({str(FIXTURES / 'images' / 'circle.png')!r}))",
    ])
    timed = "print('timed'); r = h.time(batch, warmup=1, repeat=2, progress={})"
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(setup), nbformat.v4.new_code_cell(timed.format(True)),
                                               nbformat.v4.new_code_cell(timed.format(False))])
    nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(FIXTURES.parent)}}).execute()  # its handlerkit
    with_bar, without = notebook.cells[1].outputs, notebook.cells[2].outputs
    empty_view = {_progress.WIDGET_VIEW: {"version_major": 2, "version_minor": 0, "model_id": ""}}
    assert [o.get("data") for o in with_bar if o["output_type"] == "display_data"] == [empty_view]
    compared = lambda outputs: [o.get("text") for o in outputs if o["output_type"] != "display_data"]  # what nbval reads
    assert compared(with_bar) == compared(without) == ["timed\n"]
