"""recording.capture: what a run or step catches, entered once however deep the steps nest."""

from __future__ import annotations

import contextlib
import logging
import warnings

import pytest
from _tabular import FEATURES, tabular_dir

import handlerkit as hk
from handlerkit.errors import HandlerkitWarning
from handlerkit.recording.capture import Capture, ListHandler


class _Counting:
    """What Capture is given: a ``running()`` whose blocks are counted, and a ``look``."""

    def __init__(self) -> None:
        self.entered = self.left = self.looks = 0

    @contextlib.contextmanager
    def block(self):
        self.entered += 1
        try:
            yield
        finally:
            self.left += 1

    def look(self) -> None:
        self.looks += 1


def test_a_capture_entered_inside_itself_catches_once_and_shows_the_warnings_as_it_closes():
    seen = _Counting()
    capture = Capture(seen.block, ListHandler(), {}, look=seen.look)
    with pytest.warns(UserWarning, match="^inner$") as shown:
        with capture:
            logging.getLogger("tab").warning("outer log")
            with capture:  # a step inside a run: the run's capture, the same lists
                assert capture.open
                warnings.warn("inner", UserWarning, stacklevel=1)
            assert capture.open and len(capture.warnings) == 1  # not shown yet: the run is still on
    assert not capture.open and len(shown) == 1
    assert (seen.entered, seen.left, seen.looks) == (1, 1, 1)
    assert [(e.level, e.message) for e in capture.logs] == [("WARNING", "outer log")]
    with capture:  # opened again: fresh lists (results keep slices of the old ones)
        assert capture.warnings == [] and capture.logs == []
    assert (seen.entered, seen.looks) == (2, 2)


def test_a_capture_not_looking_does_not_look_and_one_without_a_log_handler_leaves_logs_alone():
    seen = _Counting()
    capture = Capture(seen.block, None, {}, look=seen.look)
    capture.looking = False  # a diagnostic's loop looked once before it (Harness.preserved)
    with capture:
        logging.getLogger("tab").warning("not kept")
    assert seen.looks == 0 and capture.logs == [] and seen.entered == 1


class _Chatty(hk.BaseHandler):
    """The tabular model, with a handler that says what it got."""

    def preprocess(self, data):
        logging.getLogger("chatty").info("rows: %d", len(data))
        return super().preprocess([(row.get("data") or row.get("body"))["features"] for row in data])


def test_capture_logs_can_be_switched_on_a_harness_and_its_runs_follow(tmp_path):
    ctx = hk.MockContext.from_model_dir(tabular_dir(tmp_path / "tab", base="handlerkit"))
    h = hk.Harness(_Chatty, ctx, capture_logs=False, track_memory=False)
    batch = hk.batch(hk.Request.json({"features": FEATURES}))
    assert h.capture_logs is False and h.run(batch).stages["preprocess"].logs == []
    h.capture_logs = True
    assert [e.message for e in h.run(batch).stages["preprocess"].logs] == ["rows: 1"]
    h.capture_logs = False
    assert h.run(batch).stages["preprocess"].logs == [] and not h.capture_logs


def test_the_freshness_look_happens_once_per_run_not_per_step_inside_it(tmp_path):
    model_dir = tabular_dir(tmp_path / "tab", base="handlerkit")
    h = hk.Harness.open(model_dir, track_memory=False)
    h.run(hk.batch(hk.Request.json({"features": FEATURES})))
    handler_py = model_dir / "handler.py"
    handler_py.write_text(handler_py.read_text() + "\n# edited\n")
    with pytest.warns(HandlerkitWarning, match=r"^handlerkit: handler\.py changed since it was loaded") as told:
        h.run(hk.batch(hk.Request.json({"features": FEATURES})))
    assert len([w for w in told if "changed since" in str(w.message)]) == 1
