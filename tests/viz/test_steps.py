"""handlerkit/viz/steps.py: hk.show of hk.Sequences (or its steps) draws the per-step batches, a
row per request and a square per step it was in, coloured joined / running / finished /
cancelled / failed, counted here in what the figure holds."""

from __future__ import annotations

from pathlib import Path

import pytest
from _stateful_handlers import CONTINUOUS_CONFIG, STREAMING_SUM, model_dir
from _viz import kinds, texts

import handlerkit as hk
from handlerkit.sequences import Sequences
from handlerkit.viz import steps as steps_module
from handlerkit.viz.steps import steps_panel


def text(value: int) -> hk.Request:
    return hk.Request.text(str(value))


@pytest.fixture
def played(tmp_path: Path) -> Sequences:
    """Two sequences opened (both start requests finish at once), a stream in each, then a's
    cancelled while b's runs to its end: seven steps."""
    seqs = Sequences(hk.Harness.open(model_dir(tmp_path, "streams", STREAMING_SUM, CONTINUOUS_CONFIG)))
    a, b = seqs.start(text(2)), seqs.start(text(4))
    seqs.step()
    a.send(text(5))
    b.send(text(7))
    seqs.step()
    a.cancel(text(-1))
    seqs.run()
    return seqs


def _cells(fig, state):
    return sorted(
        (int(x), int(y))
        for ax in fig.get_axes()
        for artist in ax.get_children()
        if artist.get_gid() == state
        for x, y in artist.get_offsets()
    )


def test_show_of_sequences_draws_a_row_per_request_and_a_cell_per_step_coloured_by_what_became_of_it(played):
    assert len(played.steps) == 7 and kinds(played) == ["steps"]
    fig = hk.show(played)
    a_start, b_start, a_stream, b_stream, a_cancel = played.jobs  # in the order sent
    rows = [a_start, b_start, a_stream, b_stream, a_cancel]  # and in the order they first ran
    assert _cells(fig, "joined") == [(1, 2), (1, 3)]
    assert _cells(fig, "running") == [(s, 3) for s in (2, 3, 4, 5)]
    assert _cells(fig, "finished") == [(0, 0), (0, 1), (2, 4), (6, 3)]
    assert _cells(fig, "cancelled") == [(2, 2)]
    assert _cells(fig, "failed") == []
    labels = [t.get_text() for t in fig.get_axes()[0].get_yticklabels()]
    assert labels == [f"{job.request_id[:8]} ({job.sequence_id[:15]})" for job in rows]
    drawn = texts(fig)
    assert "7 step(s), 5 request(s): 2 joined, 4 running, 4 finished, 1 cancelled" in " ".join(drawn.split())
    for state in ("joined", "running", "finished", "cancelled"):
        assert state in drawn.splitlines()  # the legend


def test_a_list_of_steps_draws_the_same_grid(played):
    assert kinds(played.steps[2:]) == ["steps"]
    panel = steps_panel(played.steps[2:])
    assert panel.data["steps"] == (2, 6)
    assert panel.data["cells"]["cancelled"] == [(2, 0)]  # rows start with the first step given
    assert panel.title.startswith("5 step(s), 3 request(s)")


def test_a_failed_step_and_no_steps():
    def broken(data, context):
        if data is None:
            return None
        raise ValueError("no")

    seqs = Sequences(hk.Harness(broken), continuous=True)
    assert steps_panel(seqs).title == "no step has run yet"
    seqs.start(text(1))
    with pytest.raises(hk.HandlerkitError):
        seqs.step()
    fig = hk.show(seqs)
    assert _cells(fig, "failed") == [(0, 0)] and "1 failed" in texts(fig)


def test_rows_and_steps_are_bounded_and_what_is_left_out_is_noted(played, monkeypatch):
    monkeypatch.setattr(steps_module, "MAX_ROWS", 2)
    monkeypatch.setattr(steps_module, "MAX_STEPS", 3)
    panel = steps_panel(played)
    # steps 4-6 hold b's stream alone; with two rows allowed, one request fewer than all:
    assert panel.notes[0] == "the last 3 of 7 steps" and panel.data["steps"] == (4, 6)
    assert len(panel.data["labels"]) == 1
    monkeypatch.setattr(steps_module, "MAX_STEPS", 7)
    panel = steps_panel(played)
    assert panel.notes[0] == "first 2 of 5 requests" and len(panel.data["labels"]) == 2
    assert panel.data["cells"]["finished"] == [(0, 0), (0, 1)]  # the start requests' rows alone
    assert sum(len(cells) for cells in panel.data["cells"].values()) == 2
