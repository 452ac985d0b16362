"""handlerkit.diagnostics.runs: the one set-up every diagnostic's extra runs share."""

from __future__ import annotations

import contextlib

import pytest

import handlerkit as hk
from handlerkit.diagnostics.runs import diagnostic_runs, ensure_initialized
from handlerkit.errors import StageError
from handlerkit.recording.results import StageResult
from handlerkit.worker.memory import cpu_method


class View:
    """A harness double with the members diagnostic_runs uses, logging what happens to it."""

    def __init__(self, initialize: StageResult | None = None) -> None:
        self.results: dict[str, StageResult] = {} if initialize is None else {"initialize": initialize}
        self.track_memory = True
        self.log: list[str] = []

    def initialize(self) -> StageResult:
        self.log.append(f"initialize (tracking {self.track_memory})")
        result = self.results["initialize"] = StageResult("initialize")
        return result

    @contextlib.contextmanager
    def preserved(self):
        self.log.append("preserve")
        saved = dict(self.results)
        try:
            yield
        finally:
            self.results.clear()
            self.results.update(saved)
            self.log.append("put back")


def test_it_initializes_first_tracks_no_memory_inside_and_puts_everything_back():
    view = View()
    with diagnostic_runs(view):
        view.log.append(f"runs (tracking {view.track_memory})")
        view.results["preprocess"] = StageResult("preprocess")
    assert view.log == ["initialize (tracking True)", "preserve", "runs (tracking False)", "put back"]
    assert view.track_memory is True
    assert list(view.results) == ["initialize"]  # the user's initialize stays, the runs' results go


@pytest.mark.parametrize("last, initializes", [(None, True), ("failed", True), ("ok", False)])
def test_initialize_runs_unless_the_last_one_succeeded(last, initializes):
    previous = {None: None, "ok": StageResult("initialize"),
                "failed": StageResult("initialize", error=StageError("boom", stage="initialize"))}[last]
    view = View(previous)
    ensure_initialized(view)
    assert (view.log == ["initialize (tracking True)"]) is initializes


def test_memory_tracking_comes_back_when_a_run_raises():
    view = View(StageResult("initialize"))
    view.track_memory = False  # the user's choice is kept too
    with pytest.raises(KeyError, match="during the runs"):
        with diagnostic_runs(view):
            view.track_memory = True  # whatever the block does
            raise KeyError("during the runs")
    assert view.track_memory is False and view.log == ["preserve", "put back"]


def test_on_a_real_harness(argmax_dir):
    ctx = hk.MockContext(model_pt_file="model.pt", model_dir=str(argmax_dir), model_file="model.py", gpu_id=None)
    h = hk.Harness(hk.BaseHandler, ctx)
    mine = hk.batch(hk.Request.json([1.0, 2.0]))
    tracked = cpu_method() != "unavailable"
    assert (h.run(mine).stages["inference"].cpu_peak_bytes is not None) is tracked  # outside: as the user set
    before = dict(h.results)
    with diagnostic_runs(h):
        inside = h.run(hk.batch(hk.Request.json([5.0, 1.0]), hk.Request.json([0.0, 9.0])))
    assert inside.output == [0, 1]
    assert inside.stages["inference"].cpu_peak_bytes is None  # not tracked inside
    assert h.results == before and h.batch is mine and h.track_memory is True


def test_a_failing_initialize_raises_before_anything_changes(tmp_path):
    (tmp_path / "MAR-INF").mkdir()
    h = hk.Harness(hk.BaseHandler, hk.MockContext(model_dir=str(tmp_path), gpu_id=None))
    with pytest.raises(StageError, match="initialize failed"):
        with diagnostic_runs(h):
            raise AssertionError("the block must not run")
    assert h.track_memory is True and not h.results["initialize"].ok
