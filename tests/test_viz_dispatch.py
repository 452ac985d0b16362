"""handlerkit/viz/dispatch.py: the picture chosen for each kind of value, for StageResults and
Runs (the table in the module's docstring)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import NamedTuple

import numpy as np
import pytest
import torch

import handlerkit as hk
from _viz import classifier  # noqa: F401 (a fixture)
from _viz import NAMES, ROOT, kinds, panels, shape_masks, texts
from handlerkit import viz
from handlerkit.errors import StageError
from handlerkit.results import Run, StageResult
from handlerkit.viz.dispatch import MAX_ITEMS


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda: torch.rand(2, 3, 32, 32), ["images"]),
        (lambda: torch.rand(1, 32, 32), ["images"]),
        (lambda: torch.randint(0, 255, (2, 3, 16, 16), dtype=torch.uint8), ["images"]),
        (lambda: torch.rand(2, 8, 16, 16), ["features"]),
        (lambda: torch.rand(8, 16, 16), ["features"]),
        (lambda: torch.randint(0, 3, (2, 16, 16)), ["overlay"]),
        (lambda: torch.rand(2, 16, 16) > 0.5, ["overlay"]),
        (lambda: torch.randn(2, 5), ["bars"]),
        (lambda: torch.randn(64, 64), ["heatmap"]),
        (lambda: torch.randint(0, 100, (2, 10)), ["table"]),
        (lambda: torch.randn(10), ["bars"]),
        (lambda: torch.randn(1000), ["histogram"]),
        (lambda: torch.rand(1000) > 0.5, ["bars"]),
        (lambda: torch.rand(2, 2, 3, 8, 8), ["images"]),
        (lambda: np.random.default_rng(0).random((2, 3, 8, 8)), ["images"]),
        (lambda: np.random.default_rng(0).random((8, 8, 3)).astype(">f4")[::-1].T, ["images"]),
        (lambda: torch.zeros(0, 3), ["card"]),
        (lambda: torch.tensor(1.5), ["card"]),
        (lambda: torch.empty(2, 3, 8, 8, device="meta"), ["card"]),
        (lambda: [torch.rand(3, 8, 8), torch.rand(3, 8, 8)], ["images"]),
        (lambda: {"logits": torch.randn(2, 5), "pixels": torch.rand(2, 3, 8, 8)}, ["bars", "images"]),
        (lambda: [{"circle": 0.9, "star": 0.1}], ["bars"]),
        (lambda: [[{"circle": [1, 2, 10, 12], "score": 0.9}], []], ["overlay"]),
        (lambda: {"boxes": torch.tensor([[1.0, 2, 10, 12]]), "labels": torch.tensor([1])}, ["overlay"]),
        (lambda: [[0.1, 0.9], [0.8, 0.2]], ["bars"]),
        (lambda: torch.randint(0, 255, (28, 28), dtype=torch.uint8), ["heatmap"]),
        (lambda: [[[torch.rand(3, 8, 8)]]], ["images"]),
    ],
    ids=["images", "one-image", "uint8-images", "features", "channels", "int-mask", "bool-mask", "logits",
         "heatmap", "token-ids", "short-1d", "histogram", "bool-1d", "5d", "numpy", "numpy-odd", "empty", "0-d", "meta",
         "list-of-images", "dict", "score-dicts", "torchserve-detections", "torchvision-detection", "number-lists",
         "grey-uint8", "nested-lists"],
)
def test_the_picture_for_each_kind_of_value(make, expected):
    value = make()
    assert kinds(value) == expected
    fig = viz.show(value)
    fig.canvas.draw()  # rendering too must not raise
    assert fig.get_axes()


def test_an_inference_output_is_scores_and_other_stages_are_not():
    """[N, K] floats with N > 16 are a heat map, unless a model produced them (or K is the mapping's width)."""
    logits = torch.randn(20, 30)
    assert kinds(logits) == ["heatmap"]
    assert kinds(StageResult("preprocess", output=logits)) == ["heatmap"]
    assert kinds(StageResult("inference", output=logits)) == ["bars"]
    mapping = SimpleNamespace(mapping={str(i): f"c{i}" for i in range(30)})
    assert kinds(logits, handler=mapping) == ["bars"]


def test_a_segmentation_is_recognised_by_the_mapping_or_the_input_size(classifier):
    scores = torch.randn(len(NAMES), 5, 224, 224)
    assert kinds(StageResult("inference", input=classifier.pixels, output=scores)) == ["overlay"]
    assert kinds(scores, handler=classifier.handler) == ["overlay"]  # 5 classes = the mapping's width
    assert kinds(torch.randn(2, 7, 16, 16)) == ["features"]


def test_the_run_stage_picture_uses_the_input_image(classifier):
    masks = shape_masks(classifier.pixels, classifier.handler).long()
    result = StageResult("postprocess", output=masks, source=SimpleNamespace())  # no mapping: 0 is background
    panel = panels(result)[0]
    assert any("no input image known" in n for n in panel.notes)
    panel = panels(result, image=classifier.pixels)[0]  # image=
    assert not any("no input image known" in n for n in panel.notes)
    assert panel.data["legend"] == [("1", "#ff7f0e")]
    named = panels(result, handler=classifier.handler)[0]  # its mapping names class 0: drawn too
    assert named.data["legend"] == [("circle", "#1f77b4"), ("square", "#ff7f0e")]


def test_a_failing_stage_shows_its_error_and_a_run_with_nothing_to_draw_a_card():
    run = Run(output=["a"], stages={"postprocess": StageResult("postprocess", output=["a"])}, batch_size=1)
    assert kinds(run) == ["card"]
    assert panels(run)[0].title == "Run of 1 request(s): nothing to draw"
    assert panels(run)[0].data["lines"] == ["postprocess: list[1] of str"]
    assert kinds(StageResult("postprocess", output="done")) == ["card"]


def test_a_run_shows_the_stages_before_a_failed_one_and_its_error(classifier):
    original = ValueError("no labels")
    error = StageError("postprocess raised ValueError: no labels", stage="postprocess", original=original)
    stages = {**classifier.run.stages, "postprocess": StageResult("postprocess", error=error)}
    run = Run(output=None, stages=stages, batch_size=len(NAMES), source=classifier.handler)
    drawn = panels(run)
    assert [p.kind for p in drawn] == ["images", "bars", "card"]
    assert drawn[-1].title == "postprocess failed: ValueError"


def test_a_dict_or_list_shows_at_most_six_items_one_panel_each_named_by_its_path():
    many = {f"t{i}": torch.rand(3, 8, 8) for i in range(MAX_ITEMS + 2)}
    drawn = panels(many)
    assert len(drawn) == MAX_ITEMS and drawn[0].title.startswith("['t0']: Tensor[3, 8, 8]")

    class Pair(NamedTuple):
        pixels: torch.Tensor
        label: str

    assert panels(Pair(torch.rand(3, 8, 8), "x"))[0].title.startswith(".pixels: ")
    assert panels([torch.randn(10), "x"])[0].title.startswith("[0]: ")


def test_the_text_classifier_run_shows_its_tokens_and_scores():
    """EmbeddingBag input (ids + offsets) as one row per request, read with the handler's vocabulary."""
    model_dir = ROOT / "fixtures" / "models" / "text_classifier"
    h = hk.Harness("text_classifier", hk.MockContext.from_model_dir(str(model_dir)))
    run = h.run(hk.batch(hk.Request.text("the cat sat on the mat"), hk.Request.text("rain and wind today")))
    assert kinds(run) == ["table", "bars"]
    table = panels(run.stages["preprocess"])[0]
    assert table.data["cells"][0][0] == "the" and len(table.data["cells"]) == 2
    assert "vocabulary: handler.source_vocab" in table.notes
    labels = texts(viz.show(run))
    assert set(h.handler.mapping.values()) <= set(labels.split())
