"""handlerkit/viz/cards.py: text panels, a value's summary card ending in why it has no picture,
and a failed stage's card naming the original error and its fix."""

from __future__ import annotations

import torch

from handlerkit.errors import StageError
from handlerkit.recording.results import StageResult
from handlerkit.viz.cards import MAX_LINES, card, error_card, summary_card


def test_a_card_holds_at_most_max_lines_and_grows_with_them():
    short, full = card("s", ["one"]), card("f", [str(i) for i in range(100)])
    assert short.kind == "card" and short.data["lines"] == ["one"]
    assert len(full.data["lines"]) == MAX_LINES and full.data["lines"][-1] == str(MAX_LINES - 1)
    assert full.size[1] > short.size[1] and full.size[0] == short.size[0]


def test_an_error_card_names_the_original_exception_and_keeps_the_fix():
    error = StageError("inference raised RuntimeError: shapes differ", stage="inference",
                       original=RuntimeError("shapes differ"), fix="resize the images to 224")
    panel = error_card(StageResult("inference", error=error))
    assert panel.title == "inference raised RuntimeError: shapes differ"  # the error's first line, said once
    assert panel.data["lines"] == ["  fix: resize the images to 224"]
    bare = error_card(StageResult("handle", error=StageError("handle failed", stage="handle")))
    assert bare.title == "handle failed" and bare.data["lines"] == []


def test_a_summary_card_is_the_value_s_summary_and_one_sentence_saying_why():
    panel = summary_card("postprocess output", [{"x": torch.zeros(2)}], "it is a test")
    assert panel.title == "postprocess output"
    assert panel.data["lines"] == [
        "list[1] of dict(1 keys)",
        "  [0]['x']: Tensor[2] float32 cpu n=2 (8 B) min=0 max=0 mean=0 std=0 all zeros",
        "No picture: it is a test.",
    ]
    many = summary_card("t", [torch.zeros(1)] * 100, "many")  # the sentence survives the line limit
    assert len(many.data["lines"]) == MAX_LINES and many.data["lines"][-1] == "No picture: many."
