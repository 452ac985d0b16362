"""handlerkit/viz/explanations.py: attributions (the ``explain`` stage's output, captum's
Integrated Gradients from the built-in image classifier) drawn as a diverging heat map over the
grey input image: limits symmetric around 0, 0 the neutral colour, a colour bar."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
import torch
from _viz import CLASSIFIER, IMAGES, kinds, panels, pixel, rendered

import handlerkit as hk
from handlerkit import viz
from handlerkit.recording.results import StageResult
from handlerkit.viz.explanations import ATTRIBUTION_CMAP, attributions_panel
from handlerkit.viz.handler_view import HandlerView
from handlerkit.viz.panel import Context


@pytest.fixture(scope="module")
def explained():
    """The image classifier asked for an explanation of two images (header explain: True)."""
    h = hk.Harness("image_classifier", hk.MockContext.from_model_dir(str(CLASSIFIER)))
    requests = [hk.Request.from_file(IMAGES / n).with_headers(explain="True") for n in ("circle.png", "star.jpg")]
    return h.run(hk.batch(*requests))


def test_the_classifier_s_explanation_is_an_attribution_map_with_a_symmetric_colour_bar(explained):
    assert kinds(explained) == ["images", "attributions"]
    panel = panels(explained)[1]
    values = torch.tensor(explained.output).sum(1)  # [2, 224, 224], channels summed
    assert panel.data["labels"] == ["request 0", "request 1"] and len(panel.data["images"]) == 2
    np.testing.assert_allclose(panel.data["values"][1], values[1].numpy(), rtol=1e-5, atol=1e-7)
    limit = panel.data["limit"]
    assert limit == pytest.approx(float(torch.quantile(values.abs().flatten(), 0.99)), rel=1e-6)
    fig = viz.show(explained.stages["explain"])
    maps = [im for ax in fig.get_axes() for im in ax.get_images() if im.get_cmap().name == ATTRIBUTION_CMAP]
    assert len(maps) == 2 and {(im.norm.vmin, im.norm.vmax) for im in maps} == {(-limit, limit)}
    (bar,) = [ax for ax in fig.get_axes() if ax.get_ylabel() == "attribution"]
    low, high = bar.get_ylim()
    assert low == -high == -limit  # symmetric around 0
    neutral = matplotlib.colormaps[ATTRIBUTION_CMAP](maps[0].norm(0.0))
    assert maps[0].norm(0.0) == 0.5 and neutral == matplotlib.colormaps[ATTRIBUTION_CMAP](0.5)
    assert min(neutral[:3]) > 0.9 and max(neutral[:3]) - min(neutral[:3]) < 0.03  # near-white, no hue


def test_zero_shows_the_grey_input_and_signs_show_red_and_blue():
    image = torch.full((1, 3, 32, 32), 0.5)  # a mid-grey input image in [0, 1]
    attributions = torch.zeros(1, 3, 32, 32)
    attributions[0, :, :16, 16:] = 1.0  # top right: raises the score
    attributions[0, :, 16:, 16:] = -1.0  # bottom right: lowers it
    result = StageResult("explain", input=image, output=attributions)
    fig = viz.show(result)
    ax = next(ax for ax in fig.get_axes() if ax.get_images())
    picture = rendered(fig)
    grey = pixel(fig, picture, ax, 0.25, 0.5)  # attribution 0: the image shows, uncoloured
    assert grey.max() - grey.min() < 0.02 and abs(grey.mean() - 0.5) < 0.03
    red, blue = pixel(fig, picture, ax, 0.75, 0.75), pixel(fig, picture, ax, 0.75, 0.25)
    cmap = matplotlib.colormaps[ATTRIBUTION_CMAP]  # ±limit: the map's ends, 85 % opaque over the grey
    np.testing.assert_allclose(red, 0.85 * np.array(cmap(1.0)[:3]) + 0.15 * 0.5, atol=0.02)
    np.testing.assert_allclose(blue, 0.85 * np.array(cmap(0.0)[:3]) + 0.15 * 0.5, atol=0.02)


def test_only_the_explain_stage_s_output_is_an_attribution():
    x = torch.randn(1, 3, 16, 16)
    assert attributions_panel(x, Context(HandlerView(), stage="inference"), "t") is None
    assert attributions_panel(x, Context(HandlerView()), "t") is None  # a value alone: no stage
    assert attributions_panel(torch.randn(1, 5, 16, 16), Context(HandlerView(), stage="explain"), "t") is None
    zero = attributions_panel(torch.zeros(1, 1, 8, 8), Context(HandlerView(), stage="explain"), "t")
    assert zero.data["limit"] == 1.0 and zero.notes[-1] == "no input image known"
