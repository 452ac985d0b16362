"""handlerkit/viz/histogram.py: a tensor's distribution in a fixed number of bins, from a bounded
sample; booleans as two bars; NaN/Inf left out and counted."""

from __future__ import annotations

import numpy as np
import torch

from handlerkit import viz
from handlerkit.viz.histogram import HIST_BINS, HIST_SAMPLE, histogram_panel


def test_the_counts_are_the_values_in_each_bin():
    values = torch.cat([torch.zeros(10), torch.ones(30)])
    panel = histogram_panel(values, "h")
    counts, edges = panel.data["counts"], panel.data["edges"]
    assert panel.kind == "histogram" and len(counts) == HIST_BINS and len(edges) == HIST_BINS + 1
    assert (counts[0], counts[-1], counts.sum()) == (10, 30, 40) and (edges[0], edges[-1]) == (0.0, 1.0)
    assert panel.notes == []


def test_a_huge_tensor_is_sampled_and_says_so():
    panel = histogram_panel(torch.rand(3 * HIST_SAMPLE), "h")
    assert panel.data["counts"].sum() == HIST_SAMPLE
    assert panel.notes == [f"every 3th of {3 * HIST_SAMPLE:,} values"]


def test_nan_and_inf_are_left_out_and_counted_and_a_constant_gets_a_unit_range():
    panel = histogram_panel(torch.tensor([2.0, 2.0, float("nan"), float("inf")]), "h")
    assert panel.data["counts"].sum() == 2 and panel.notes == ["2 NaN/Inf values left out"]
    np.testing.assert_allclose(panel.data["edges"][[0, -1]], [1.5, 2.5])
    empty = histogram_panel(torch.full((3,), float("nan")), "h")
    assert empty.kind == "card" and empty.data["lines"] == [
        "Tensor[3] float32 cpu n=3 (12 B) no finite values NaN=3",
        "No picture: every value is NaN or ±Inf: there is no distribution to draw.",
    ]


def test_booleans_are_two_bars_of_counts():
    panel = histogram_panel(torch.tensor([True, False, True, True]), "b")
    assert panel.kind == "bars" and panel.data["samples"] == [(["False", "True"], [1, 3])]
    assert panel.data["xlabel"] == "count" and panel.data["unit"] is False


def test_the_figure_draws_the_bins_as_stairs():
    fig = viz.show(torch.cat([torch.zeros(10), torch.ones(30)]).long())  # integers: floats in a row are a signal
    (ax,) = fig.get_axes()
    (stairs,) = ax.patches
    assert list(stairs.get_data().values[[0, -1]]) == [10, 30] and ax.get_ylabel() == "count"
