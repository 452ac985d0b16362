"""handlerkit/viz/bars.py: class scores as top-k bars labelled from the mapping (probabilities,
scores or softmax of logits), a short tensor's values, and ``{label: score}`` dicts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from _viz import (
    NAMES,
    classifier,  # noqa: F401 (a fixture)
    texts,
)

from handlerkit import viz
from handlerkit.recording.results import StageResult
from handlerkit.viz.bars import MAX_BAR_SAMPLES, bars_panel, dict_bars_panel, values_panel
from handlerkit.viz.handler_view import HandlerView
from handlerkit.viz.panel import Context

MAPPING = HandlerView(mapping={"0": "cat", "1": "dog", "2": "fox"}, mapping_at="handler.mapping")


def test_bars_are_labelled_from_the_mapping_and_handler_overrides_it(classifier):
    fig = viz.show(classifier.run.stages["inference"], top_k=2)
    labels = [t.get_text() for ax in fig.get_axes() for t in ax.get_yticklabels()]
    assert labels[:2] == ["circle", "square"] and len(labels) == 2 * len(NAMES)
    own = SimpleNamespace(mapping={str(i): f"class {i}" for i in range(5)})
    fig = viz.show(classifier.run.stages["inference"].output, handler=own, top_k=1)
    assert [t.get_text() for ax in fig.get_axes() for t in ax.get_yticklabels()][0] == "class 0"
    # a Harness stands for its handler
    assert "circle" in texts(viz.show(classifier.run.stages["inference"].output, handler=classifier.h))


@pytest.mark.parametrize(
    "scores, xlabel, first",
    [
        (torch.tensor([[0.2, 0.7, 0.1]]), "probability", ("dog", 0.7)),
        (torch.tensor([[0.2, 0.9, 0.4]]), "score", ("dog", 0.9)),
        (torch.tensor([[0.0, 2.0, 1.0]]), "softmax(logits)", ("dog", 0.6652)),
    ],
    ids=["probabilities", "scores", "logits"],
)
def test_scores_are_shown_as_they_are_and_logits_as_their_softmax(scores, xlabel, first):
    panel = bars_panel(scores, Context(MAPPING, top_k=2), "t")
    labels, values = panel.data["samples"][0]
    assert panel.data["xlabel"] == xlabel and panel.data["unit"] is True
    assert labels[0] == first[0] and values[0] == pytest.approx(first[1], abs=1e-4) and len(values) == 2
    assert panel.notes == ["top 2 of 3 classes", "labels from handler.mapping"]


def test_bars_show_at_most_eight_rows_and_nan_scores_last():
    panel = bars_panel(torch.rand(20, 3), Context(HandlerView(), top_k=3), "t")
    assert len(panel.data["samples"]) == MAX_BAR_SAMPLES and panel.notes == ["first 8 of 20 rows"]
    labels, _ = bars_panel(torch.tensor([[float("nan"), 0.1, 0.2]]), Context(HandlerView()), "t").data["samples"][0]
    assert labels == ["2", "1", "0"]  # no mapping: the index


def test_values_keep_their_order_and_are_labelled_by_position_never_by_class():
    panel = values_panel(torch.tensor([3.0, -1.0, 2.0]), "v")
    assert panel.data["samples"] == [(["[0]", "[1]", "[2]"], [3.0, -1.0, 2.0])] and panel.data["unit"] is False
    three = SimpleNamespace(mapping=["cat", "dog", "fox"])
    features = StageResult("preprocess", output=torch.tensor([5.1, 3.5, 1.4]), source=three)
    (ax,) = viz.show(features).get_axes()  # three features, three classes: still the features
    assert [t.get_text() for t in ax.get_yticklabels()] == ["[0]", "[1]", "[2]"]
    assert [round(p.get_width(), 1) for p in ax.patches] == [5.1, 3.5, 1.4]


def test_score_dicts_are_ranked_top_k():
    rows = [{"cat": 0.1, "dog": 0.6, "fox": 0.3}, {"cat": 0.9, "dog": 0.05, "fox": 0.05}]
    panel = dict_bars_panel(rows, Context(HandlerView(), top_k=2), "scores")
    assert panel.data["samples"] == [(["dog", "fox"], [0.6, 0.3]), (["cat", "dog"], [0.9, 0.05])]
    assert panel.data["xlabel"] == "probability"
    assert dict_bars_panel([{"a": 5}], Context(HandlerView()), "s").data["xlabel"] == "value"


def test_the_figure_draws_one_bar_per_label_with_its_value():
    (ax,) = viz.show(torch.tensor([0.25, 0.75, 0.5])).get_axes()  # values, in order
    assert [round(p.get_width(), 2) for p in ax.patches] == [0.25, 0.75, 0.5]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["[0]", "[1]", "[2]"]
    (ax,) = viz.show(torch.tensor([0.25, 0.75]), handler=SimpleNamespace(mapping=["no", "yes"])).get_axes()
    assert [round(p.get_width(), 2) for p in ax.patches] == [0.75, 0.25]  # the mapping's width: ranked scores
    assert [t.get_text() for t in ax.get_yticklabels()] == ["yes", "no"]
    assert ax.get_xlim() == (0.0, 1.2) and ax.get_xlabel() == "probability"  # they sum to 1
