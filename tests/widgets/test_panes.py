"""The Jupyter outputs a Stepper's panes show (:mod:`handlerkit.widgets.panes`): timing bars, and a
picture or the note that says why there is none."""

from __future__ import annotations

import warnings

from handlerkit.errors import HandlerkitError
from handlerkit.widgets.panes import (
    answer_outputs,
    compile_html,
    error_output,
    logs_output,
    output_text,
    stream_output,
    timing_html,
)


def test_timing_bars_scale_to_the_slowest_stage():
    markup = timing_html({"preprocess": (10.0, True), "inference": (40.0, False)})
    assert "width:55px" in markup and "width:220px" in markup
    assert ">40.0</td>" in markup and ">failed</td>" in markup and "wall time (ms)" in markup
    assert "no stage has run yet" in timing_html({})


def test_a_picture_that_cannot_be_drawn_leaves_a_note_with_the_reason(monkeypatch):
    """panes.picture_output (both steppers' picture panes): the drawing, or a grey note naming
    why there is none; the failure never escapes into the pane's other outputs."""
    import matplotlib

    matplotlib.use("Agg")
    import torch

    from handlerkit import viz
    from handlerkit.errors import HandlerkitError
    from handlerkit.widgets.panes import picture_output

    drawn = picture_output(torch.rand(3, 8, 8))
    assert drawn["output_type"] == "display_data" and "image/png" in drawn["data"]

    def refuse(obj):
        raise HandlerkitError("nothing to draw in a <set>", fix="pass a tensor")

    monkeypatch.setattr(viz, "show", refuse)
    note = picture_output({1, 2})
    assert output_text([note]) == "no picture: nothing to draw in a <set>"
    assert "no picture: nothing to draw in a &lt;set&gt;" in note["data"]["text/html"]


def test_answers_are_shown_as_the_worker_sends_them_and_long_ones_are_cut():
    [out] = answer_outputs(["a cat", {"label": "dog"}, "x" * 1300], pictures=False)
    lines = output_text([out]).splitlines()
    assert lines[:3] == ["answer: what each of 3 request(s) gets", "request 0: a cat", 'request 1: {"label": "dog"}']
    assert lines[3] == f"request 2: {'x' * 1200}… (1300 characters)"
    [many] = answer_outputs(list(range(20)), pictures=False)
    assert output_text([many]).splitlines()[-1] == (
        "… and 4 more request(s): h.results['postprocess'].output holds them all"
    )
    assert output_text(answer_outputs("alone")) == "answer\nalone"  # not a list: one answer


def test_an_error_says_its_stage_and_fix_and_an_unexpected_one_its_traceback():
    known = error_output("preprocess", HandlerkitError("the image is truncated", fix="send a whole PNG"))
    assert output_text([known]) == "preprocess failed: the image is truncated\n  fix: send a whole PNG"
    assert "<b>fix:</b> send a whole PNG" in known["data"]["text/html"]
    try:
        raise KeyError("label")
    except KeyError as exc:
        bug = error_output("postprocess", exc, unexpected=True)
    text = output_text([bug])
    assert text.startswith("postprocess failed: KeyError: 'label'\nTraceback (most recent call last):")
    assert "fix:" not in text


def test_logs_and_warnings_are_one_table_and_nothing_is_no_output():
    assert logs_output([], []) is None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("one item per request", UserWarning, stacklevel=1)
    out = logs_output([], caught)
    assert out is not None and output_text([out]) == (
        "logs and warnings (0 log record(s), 1 warning(s))\nwarning: UserWarning: one item per request"
    )
    assert output_text([stream_output("printed\n"), out]).startswith("printed\n\nlogs and warnings")


def test_the_compile_pane_says_when_there_is_no_decision():
    assert "records no compile decision" in compile_html(None)
