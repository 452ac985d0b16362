"""The built-in pictures of a tensor (:mod:`handlerkit.viz.tensors`, the table in its docstring):
class scores only for a model output of the mapping's width, signals, rows of the leading dims,
token ids and their attention mask."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from _viz import kinds, panels

from handlerkit import viz
from handlerkit.recording.results import StageResult


def test_bars_only_for_a_model_output_whose_width_is_the_mapping_s():
    """[N, K] floats are class scores only where a model made them and the mapping has K labels."""
    logits = torch.randn(20, 30)
    thirty = SimpleNamespace(mapping={str(i): f"c{i}" for i in range(30)})
    assert kinds(StageResult("inference", output=logits, source=thirty)) == ["bars"]
    assert kinds(StageResult("postprocess", output=logits, source=thirty)) == ["bars"]
    assert kinds(logits, handler=thirty) == ["bars"]  # alone: the caller chose the handler
    assert kinds(StageResult("preprocess", output=logits, source=thirty)) == ["heatmap"]  # the model's input
    assert kinds(StageResult("inference", output=logits)) == ["heatmap"]  # no mapping
    assert kinds(StageResult("inference", output=torch.randn(20, 29), source=thirty)) == ["heatmap"]  # other width
    assert kinds(StageResult("inference", output=torch.randn(30), source=thirty)) == ["bars"]  # one row
    assert kinds(StageResult("preprocess", output=torch.randn(30), source=thirty)) == ["bars"]  # values, in order
    assert panels(StageResult("preprocess", output=torch.randn(30), source=thirty))[0].data["samples"][0][0][:2] == [
        "[0]", "[1]"]


def test_a_signal_is_one_line_per_row_and_its_peaks_survive_the_reduction():
    t = torch.arange(16000, dtype=torch.float32) / 16000
    audio = torch.stack([torch.sin(2 * math.pi * 5 * t), 0.5 * torch.cos(2 * math.pi * 3 * t)]).unsqueeze(1)
    audio[0, 0, 1234] = 7.0  # a click
    fig = viz.show(StageResult("preprocess", output=audio))
    lines = [line for ax in fig.get_axes() for line in ax.lines]
    assert len(fig.get_axes()) == 2 and len(lines) == 2
    first, second = (line.get_ydata() for line in lines)
    assert first.max() == 7.0 and first.min() == pytest.approx(-1.0, abs=1e-3)
    assert second.max() == pytest.approx(0.5, abs=1e-3)
    assert [ax.get_title(loc="left") for ax in fig.get_axes()] == ["[0, 0]", "[1, 0]"]


def test_a_tensor_that_is_no_image_is_read_as_rows_of_its_last_dim():
    """[N, C, T] with T not an image's side: a row per (n, c), as lines or a heat map by size."""
    many = panels(torch.randn(10, 2, 30))[0]  # 20 rows of 30: a heat map whose rows say what they are
    assert many.kind == "heatmap" and many.data["shape"] == (20, 30)
    assert many.data["ylabel"] == "row (index of the leading dims [10, 2])"
    assert many.notes[0] == "a row per index of the leading dims [10, 2]"
    ids = panels(torch.randint(2, 50, (2, 1, 7)), handler=SimpleNamespace(vocab=[f"w{i}" for i in range(50)]))[0]
    assert ids.kind == "html" and len(ids.data["cells"]) == 2  # integers: token ids, a row each
    assert kinds(torch.rand(1, 3, 2, 40)) == ["heatmap"]  # 3 x 2 rows of 40: not an image, too short for lines


def test_class_scores_per_position_are_a_heat_map_with_a_column_per_class_whatever_the_length():
    """A tagger's [N, L, K] output, K the mapping's width: the same picture for 6 words (an
    image's size) as for 3, each class a named column; the model's input is never labelled so."""
    tagger = SimpleNamespace(mapping={"0": "DET", "1": "NOUN", "2": "VERB", "3": "ADP", "4": "ADJ"})
    for words in (6, 3):
        scores = torch.randn(2, words, 5)
        (panel,) = panels(StageResult(stage="inference", input=None, output=scores), handler=tagger)
        assert panel.kind == "heatmap" and panel.data["shape"] == (2 * words, 5)
        assert panel.data["columns"] == ["DET", "NOUN", "VERB", "ADP", "ADJ"] and panel.data["xlabel"] == "class"
        assert panel.notes == [f"a row per index of the leading dims [2, {words}]", "labels from handler.mapping"]
        assert panel.data["labels"][words] == [f"{v:.3g}" for v in scores[1, 0].tolist()]  # [1, 0]: row `words`
    (ax, _) = viz.show(scores, handler=tagger).get_axes()  # the heat map and its colour bar
    assert [t.get_text() for t in ax.get_xticklabels()] == ["DET", "NOUN", "VERB", "ADP", "ADJ"]
    assert ax.get_xlabel() == "class" and len(ax.texts) == 2 * 3 * 5
    assert kinds(StageResult(stage="preprocess", input=None, output=torch.randn(2, 6, 5)), handler=tagger) == [
        "features"
    ]
    assert kinds(torch.randn(2, 6, 4), handler=tagger) == ["features"]  # not the mapping's width


def test_token_ids_are_a_table_and_their_attention_mask_a_heat_map_of_0_and_1():
    words = SimpleNamespace(vocab=["[PAD]", "[CLS]", "the", "cat"])
    encoded = {"input_ids": torch.tensor([[1, 2, 3, 0]]), "attention_mask": torch.tensor([[1, 1, 1, 0]])}
    ids, mask = panels(encoded, handler=words)
    assert ids.kind == "html" and ids.data["cells"] == [["[CLS]", "the", "cat", "[PAD]"]]
    assert mask.kind == "heatmap" and mask.data["labels"] == [["1", "1", "1", "0"]]
