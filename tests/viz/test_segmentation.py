"""handlerkit/viz/overlays.py's segmentations as drawn: a class's pixels in its legend colour
(over the input image in grey, so the hue stays the legend's), the legend listing only the
classes present, and the built-in segmenter's answer (``[class, probability]`` per pixel)
drawn as its class mask."""

from __future__ import annotations

import colorsys

import matplotlib.colors
import numpy as np
import pytest
import torch
from _viz import IMAGES, ROOT, panels, pixel, rendered

import handlerkit as hk
from handlerkit.viz.draw import figure
from handlerkit.viz.handler_view import HandlerView
from handlerkit.viz.overlays import ALPHA, colour, pixel_classes_panel, segmentation_panel
from handlerkit.viz.panel import Context

SEGMENTER = ROOT / "fixtures" / "models" / "image_segmenter"


@pytest.fixture(scope="module")
def segmented():
    h = hk.Harness("image_segmenter", hk.MockContext.from_model_dir(str(SEGMENTER)))
    run = h.run(hk.batch(*(hk.Request.from_file(IMAGES / n) for n in ("circle.png", "star.jpg", "square.png"))))
    return h, run


def legend_colours(fig) -> dict[str, tuple[float, float, float]]:
    return {
        t.get_text(): matplotlib.colors.to_rgb(p.get_facecolor())
        for legend in fig.legends
        for t, p in zip(legend.get_texts(), legend.get_patches())
    }


def test_a_class_s_drawn_pixels_have_its_legend_colour_s_hue_over_a_coloured_photo():
    photo = torch.zeros(1, 3, 40, 40, dtype=torch.uint8)
    photo[0, 0], photo[0, 1], photo[0, 2] = 40, 120, 200  # blue: a blend would pull every colour to it
    classes = torch.zeros(1, 40, 40, dtype=torch.long)
    classes[0, :, :20] = 1  # left half: cat (orange in the palette), right half background
    view = HandlerView(mapping={"0": "background", "1": "cat", "2": "dog"})
    panel = segmentation_panel(classes, Context(view, image=photo), "s")
    fig = figure([panel])
    assert legend_colours(fig) == {"cat": matplotlib.colors.to_rgb(colour(1))}  # dog is absent: not listed
    ax = next(ax for ax in fig.get_axes() if ax.get_images())
    layer = ax.get_images()[1].get_array()
    np.testing.assert_allclose(layer[20, 5, :3], matplotlib.colors.to_rgb(colour(1)))  # the legend's colour
    assert layer[20, 5, 3] == ALPHA and layer[20, 35, 3] == 0.0
    picture = rendered(fig)
    drawn = pixel(fig, picture, ax, 0.2, 0.5)
    hue = colorsys.rgb_to_hsv(*drawn)[0]
    assert hue == pytest.approx(colorsys.rgb_to_hsv(*matplotlib.colors.to_rgb(colour(1)))[0], abs=0.01)
    background = pixel(fig, picture, ax, 0.8, 0.5)
    assert background.max() - background.min() < 0.02  # the photo in grey


def test_the_segmenter_s_answer_is_its_class_mask_with_the_legend_s_colours(segmented):
    h, run = segmented
    result = run.stages["postprocess"]
    (panel,) = panels(result)
    assert panel.kind == "overlay" and panel.title.endswith(": class per pixel")
    assert panel.notes[0] == "the answer's [class, probability] pairs: each pixel's class drawn"
    classes = torch.tensor(run.output)[..., 0].long()
    present = sorted(c for c in torch.unique(classes).tolist() if not h.handler.mapping[str(c)] == "__background__")
    assert [label for label, _ in panel.data["legend"]] == [h.handler.mapping[str(c)] for c in present]
    layer = panel.data["mask"]  # the grid: 2 x 2 images of 224 with 2-pixel padding
    centre = int(classes[0, 112, 112])
    np.testing.assert_allclose(layer[2 + 112, 2 + 112, :3], matplotlib.colors.to_rgb(colour(centre)))
    assert all(p.kind == "overlay" for p in panels(run)[1:3])  # inference scores and the answer alike


def test_pairs_that_are_no_classes_and_probabilities_are_declined():
    ctx = Context(HandlerView(), stage="postprocess")
    flow = torch.randn(1, 16, 16, 2)  # optical flow: not whole numbers
    assert pixel_classes_panel(flow, ctx, "f") is None
    pairs = torch.stack([torch.randint(0, 3, (1, 16, 16)).float(), torch.rand(1, 16, 16) * 2], dim=3)
    assert pixel_classes_panel(pairs, ctx, "p") is None  # "probabilities" above 1
    pairs[..., 1] /= 2
    assert pixel_classes_panel(pairs, Context(HandlerView(), stage="preprocess"), "p") is None  # model input
    assert pixel_classes_panel(pairs, ctx, "p").kind == "overlay"
