"""handlerkit/viz/chunks.py: hk.show of a streamed run draws its chunk timeline (a row per
request, a mark per chunk, the final answer marked, the time to first chunk as a bar from
handle's call), counted here in what the figure holds."""

from __future__ import annotations

import time

import pytest
from _viz import kinds, panels, texts
from ts.handler_utils.utils import send_intermediate_predict_response

import handlerkit as hk
from handlerkit.viz import chunks as chunks_module
from handlerkit.viz.chunks import timeline_panel


def three_then_one(data, context):
    """Request 0 gets three chunks, request 1 one (after a pause), request 2 none."""
    if data is None:
        return None
    ids = context.request_ids
    time.sleep(0.01)
    for step in range(3):
        send_intermediate_predict_response({0: f"a{step}"}, {0: ids[0]}, "Result", 200, context)
        time.sleep(0.005)
    send_intermediate_predict_response({1: "b"}, {1: ids[1]}, "Result", 200, context)
    return ["a", "b", "c"]


def _run(handler=three_then_one, count=3):
    h = hk.Harness(handler, hk.MockContext(gpu_id=None))
    return h.run(hk.batch(*(hk.Request.json({"i": i}, request_id=f"r{i}") for i in range(count))))


def _artists(fig, gid):
    return [a for ax in fig.get_axes() for a in ax.get_children() if a.get_gid() == gid]


def test_show_of_a_streamed_run_draws_a_row_per_request_a_mark_per_chunk_and_the_final_answers():
    run = _run()
    assert kinds(run)[0] == "timeline"
    fig = hk.show(run)
    marks = _artists(fig, "chunks")
    assert sorted(len(m.get_offsets()) for m in marks) == [1, 3]  # request 0's three, request 1's one
    drawn = sorted(float(x) for m in marks for x, _ in m.get_offsets())
    assert drawn == pytest.approx(sorted(c.time_ms for c in run.chunks))
    finals = _artists(fig, "final")
    assert len(finals) == 3  # every request's final answer, request 2's with no chunk before it
    assert [float(f.get_offsets()[0][0]) for f in finals] == pytest.approx([run.handle_ms] * 3)
    bars = [patch for container in _artists(fig, "ttfc") for patch in getattr(container, "patches", [container])]
    assert sorted(b.get_width() for b in bars) == pytest.approx(sorted(s.first_chunk_ms for s in run.streams))
    text = texts(fig)
    assert "request 0 (r0)" in text and "request 2" in text and "time to first chunk" in text
    assert f"{run.streams[0].first_chunk_ms:.1f} ms" in text
    assert run.streams[0].first_chunk_ms >= 10  # the handler slept before its first chunk


def test_a_run_without_chunks_has_no_timeline():
    run = _run(lambda data, context: None if data is None else ["x"] * len(data), count=2)
    assert "timeline" not in kinds(run)


def test_rows_and_marks_are_bounded_and_what_is_left_out_is_noted(monkeypatch):
    monkeypatch.setattr(chunks_module, "MAX_ROWS", 2)
    monkeypatch.setattr(chunks_module, "MAX_MARKS", 2)
    panel = timeline_panel(_run())
    assert [row["label"] for row in panel.data["rows"]] == ["request 0 (r0)", "request 1 (r1)"]
    first, last = panel.data["rows"][0]["chunks"]
    run_chunks = [c.time_ms for c in _run().chunks]
    assert first < last and len(run_chunks) == 4
    assert "first 2 of 3 requests" in panel.notes
    assert "request 0: 2 of its 3 chunks marked" in panel.notes


def test_chunks_for_unknown_requests_and_unfinished_streams_are_noted():
    def strays_and_no_answer(data, context):
        if data is None:
            return None
        send_intermediate_predict_response(["?"], {0: "nobody"}, "Result", 200, context)
        send_intermediate_predict_response(["a"], context.request_ids, "Result", 200, context)
        return "not a list"  # no final answer the worker can send

    with pytest.warns(hk.HandlerkitWarning):
        run = _run(strays_and_no_answer, count=1)
    (panel,) = [p for p in panels(run) if p.kind == "timeline"]
    assert "1 chunk(s) for request ids not in the batch, not drawn" in panel.notes
    assert "request 0: no final answer ended its stream" in panel.notes
    assert panel.data["rows"][0]["final_ms"] is None
