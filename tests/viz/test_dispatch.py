"""handlerkit/viz/dispatch.py: the picture chosen for each kind of value, for StageResults and
Runs (the table in the module's docstring)."""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np
import pytest
import torch
from _viz import FEATURES, NAMES, ROOT, SPECIES, classifier, kinds, panels, shape_masks, tabular, texts  # noqa: F401 (fixtures)

import handlerkit as hk
from conftest import png_bytes
from handlerkit import viz
from handlerkit.errors import StageError
from handlerkit.recording.results import Run, StageResult
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
        (lambda: torch.randn(2, 5), ["heatmap"]),
        (lambda: torch.randn(64, 64), ["heatmap"]),
        (lambda: torch.randint(0, 100, (2, 10)), ["html"]),
        (lambda: torch.randn(10), ["bars"]),
        (lambda: torch.randn(1000), ["lines"]),
        (lambda: torch.randn(2, 1, 16000), ["lines"]),
        (lambda: torch.randn(1, 2, 1, 500), ["lines"]),
        (lambda: (torch.randn(3, 800) * 3000).to(torch.int16), ["lines"]),
        (lambda: torch.randint(0, 1000, (1000,)), ["histogram"]),
        (lambda: torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]), ["heatmap"]),
        (lambda: torch.rand(1000) > 0.5, ["bars"]),
        (lambda: torch.rand(2, 2, 3, 8, 8), ["images"]),
        (lambda: np.random.default_rng(0).random((2, 3, 8, 8)), ["images"]),
        (lambda: np.random.default_rng(0).random((8, 8, 3)).astype(">f4")[::-1].T, ["images"]),
        (lambda: torch.zeros(0, 3), ["card"]),
        (lambda: torch.tensor(1.5), ["card"]),
        (lambda: torch.empty(2, 3, 8, 8, device="meta"), ["card"]),
        (lambda: [torch.rand(3, 8, 8), torch.rand(3, 8, 8)], ["images"]),
        (lambda: {"logits": torch.randn(2, 5), "pixels": torch.rand(2, 3, 8, 8)}, ["heatmap", "images"]),
        (lambda: [{"circle": 0.9, "star": 0.1}], ["bars"]),
        (lambda: [[{"circle": [1, 2, 10, 12], "score": 0.9}], []], ["overlay"]),
        (lambda: {"boxes": torch.tensor([[1.0, 2, 10, 12]]), "labels": torch.tensor([1])}, ["overlay"]),
        (lambda: [[0.1, 0.9], [0.8, 0.2]], ["heatmap"]),
        (lambda: [{"label": "cat", "probability": 0.9}], ["table"]),
        (lambda: ["a cat", "a dog"], ["table"]),
        (lambda: "a cat", ["table"]),
        (lambda: [[1, 2], [3]], ["table"]),
        (lambda: png_bytes(), ["images"]),
        (lambda: [bytearray(png_bytes()), png_bytes(8, 8)], ["images"]),
        (lambda: b"not an image", ["card"]),
        (lambda: [{"body": bytearray(png_bytes())}], ["images"]),
        (lambda: object(), ["card"]),
        (lambda: torch.randint(0, 255, (28, 28), dtype=torch.uint8), ["heatmap"]),
        (lambda: [[[torch.rand(3, 8, 8)]]], ["images"]),
    ],
    ids=["images", "one-image", "uint8-images", "features", "channels", "int-mask", "bool-mask", "small-matrix",
         "heatmap", "token-ids", "short-1d", "signal", "audio-batch", "4d-rows", "int16-pcm", "int-histogram",
         "attention-mask", "bool-1d", "5d", "numpy", "numpy-odd", "empty", "0-d", "meta", "list-of-images", "dict",
         "score-dicts", "torchserve-detections", "torchvision-detection", "number-lists", "dicts", "strings", "string",
         "ragged", "png-bytes", "list-of-bytes", "not-an-image", "request-rows", "object", "grey-uint8",
         "nested-lists"],
)
def test_the_picture_for_each_kind_of_value(make, expected):
    value = make()
    assert kinds(value) == expected
    fig = viz.show(value)
    if expected == ["html"]:  # a table of text, shown as HTML: no figure
        assert fig.figure is None and "<table class='handlerkit'>" in fig._repr_html_()
        return
    fig.canvas.draw()  # rendering too must not raise
    assert fig.get_axes()


@pytest.mark.torchserve
def test_the_tabular_handler_s_features_answers_and_scores_each_get_their_picture(tabular):
    """The issue's case: a TorchServe BaseHandler with JSON features in and {label, probability}
    out drew its input features as class bars (with a bogus class "3") and its answers as an
    empty figure. Now: the features as a table of values, the scores as bars, the answers as a table."""
    stages = tabular.run.stages
    features = panels(stages["preprocess"])[0]
    assert features.kind == "heatmap"
    assert features.data["labels"] == [[f"{v:.3g}" for v in row] for row in FEATURES]
    fig = viz.show(stages["preprocess"])
    image_ax = fig.axes[0]
    assert len(image_ax.texts) == 12 and [t.get_text() for t in image_ax.texts][:4] == ["5.1", "3.5", "1.4", "0.2"]
    assert not any(p.kind == "bars" for p in panels(stages["preprocess"]))

    scores = viz.show(stages["inference"], top_k=2)
    assert sum(len(ax.patches) for ax in scores.get_axes()) == len(FEATURES) * 2
    labels = {t.get_text() for ax in scores.get_axes() for t in ax.get_yticklabels()}
    assert labels <= set(SPECIES) and "3" not in labels

    answers = panels(stages["postprocess"])[0]
    assert answers.kind == "table" and answers.data["columns"] == ["label", "probability"]
    assert answers.data["cells"] == [[row["label"], f"{row['probability']:.4g}"] for row in tabular.run.output]
    drawn = texts(viz.show(stages["postprocess"]))
    assert all(row["label"] in drawn for row in tabular.run.output)
    assert kinds(tabular.run) == ["heatmap", "bars", "table"]


def test_bytes_that_decode_are_their_image_pixel_for_pixel():
    from PIL import Image

    encoded = png_bytes(40, 24, seed=3)
    panel = panels(encoded)[0]
    expected = np.array(Image.open(io.BytesIO(encoded)).convert("RGB"))
    assert panel.kind == "images" and panel.notes == ["decoded from PNG bytes"]
    np.testing.assert_array_equal(panel.data["grid"], expected)  # one image: no grid padding
    (image,) = viz.show(encoded).axes[0].get_images()
    np.testing.assert_array_equal(image.get_array(), expected)
    two = panels([encoded, png_bytes(20, 24, seed=4)], max_images=1)[0]  # bounded like any image grid
    assert two.notes[0] == "first 1 of 2 images" and two.data["grid"].shape == expected.shape


def test_a_failing_stage_shows_its_error_and_a_run_with_nothing_to_draw_a_card():
    run = Run(output=[None], stages={"postprocess": StageResult("postprocess", output=[object()])}, batch_size=1)
    assert kinds(run) == ["card"]
    assert panels(run)[0].title == "Run of 1 request(s): nothing to draw"
    assert panels(run)[0].data["lines"] == [
        "postprocess: list[1] of object",
        "No picture: no stage returned a tensor, an array, image bytes, text or JSON data.",
    ]
    (panel,) = panels(StageResult("postprocess", output=None))
    assert panel.title == "postprocess output" and panel.data["lines"] == ["None", "No picture: the value is None."]
    assert kinds(StageResult("postprocess", output="done")) == ["table"]


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


def test_a_run_shows_the_stages_before_a_failed_one_and_its_error(classifier):
    original = ValueError("no labels")
    error = StageError("postprocess raised ValueError: no labels", stage="postprocess", original=original)
    stages = {**classifier.run.stages, "postprocess": StageResult("postprocess", error=error)}
    run = Run(output=None, stages=stages, batch_size=len(NAMES), source=classifier.handler)
    drawn = panels(run)
    assert [p.kind for p in drawn] == ["images", "bars", "card"]
    assert drawn[-1].title == "postprocess raised ValueError: no labels"


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
    assert kinds(run) == ["html", "bars"]
    table = panels(run.stages["preprocess"])[0]
    assert table.data["cells"][0][0] == "the" and len(table.data["cells"]) == 2
    assert "vocabulary: handler.source_vocab" in table.notes
    labels = texts(viz.show(run).figure)
    assert set(h.handler.mapping.values()) <= set(labels.split())


# ---------------------------------------------------------------------------------------------
# Errors: a StageError, and a run that failed
# ---------------------------------------------------------------------------------------------


def _failed_ranker_run(tmp_path):
    from _new_users import ranker_dir, ranker_request

    h = hk.Harness.open(ranker_dir(tmp_path / "recs"))
    h.run(hk.batch(hk.Request.json(ranker_request(1, [1, 2]))))
    bad = hk.batch(hk.Request.json(ranker_request(1, [1, 2])), hk.Request.json(ranker_request(2, [99])))
    with pytest.raises(StageError) as info:
        h.run(bad)
    return h, info.value


def test_a_stage_error_shows_its_card_and_where_its_input_is_kept(tmp_path):
    h, error = _failed_ranker_run(tmp_path)
    [panel] = panels(error)
    assert panel.kind == "card" and panel.title == error.message.splitlines()[0]
    lines = panel.data["lines"]
    assert any(line.startswith(f"  at {error.location[0]}:{error.location[1]}: ") for line in lines)
    assert f"  fix: {error.fix.splitlines()[0]}" in lines
    assert lines[-1] == "  its input: h.results['inference'].input; hk.show(h.last_run) draws the stages that ran"
    assert h.results["inference"].input is h.last_run.stages["inference"].input  # where the card says
    shown = texts(viz.show(error))
    assert "No picture" not in shown
    assert "inference failed in RecsHandler" in shown and "its input: h.results['inference'].input" in shown


def test_a_failed_run_shows_its_error_first_and_is_titled_so(tmp_path):
    h, error = _failed_ranker_run(tmp_path)
    drawn = panels(h.last_run)
    assert drawn[0].kind == "card" and drawn[0].title == error.message.splitlines()[0]
    assert [p.title for p in drawn].count(drawn[0].title) == 1  # said once
    assert not any("its input" in line for line in drawn[0].data["lines"])  # the run is the stages that ran
    assert viz.show(h.last_run).get_suptitle() == "Run of 2 request(s): inference failed"
