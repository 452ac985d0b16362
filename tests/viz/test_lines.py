"""handlerkit/viz/lines.py: signals as one line per row, long rows reduced to a min/max envelope
that keeps every peak, at most MAX_LINES rows, NaN and Inf left as gaps."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from handlerkit.viz.draw import figure
from handlerkit.viz.lines import MAX_LINES, MAX_POINTS, lines_panel


def test_a_short_row_is_drawn_value_for_value():
    x = torch.linspace(-1, 1, 100).unsqueeze(0)
    panel = lines_panel(x, "s")
    ((label, xs, ys),) = panel.data["series"]
    assert panel.kind == "lines" and label == "[0]" and panel.notes == []
    np.testing.assert_array_equal(xs, np.arange(100))
    np.testing.assert_allclose(ys, x[0].numpy())


def test_a_long_row_keeps_the_min_and_max_of_each_bucket_in_max_points_values():
    t = torch.arange(100_000, dtype=torch.float32)
    x = torch.sin(2 * math.pi * t / 5000).unsqueeze(0)
    x[0, 54_321] = 9.0  # one sample spike
    x[0, 99_999] = -9.0  # in the last, padded bucket
    panel = lines_panel(x, "s")
    (_, xs, ys), step = panel.data["series"][0], math.ceil(100_000 / (MAX_POINTS // 2))
    assert len(ys) <= MAX_POINTS and len(xs) == len(ys)
    assert ys.max() == 9.0 and ys.min() == -9.0
    assert xs[np.argmax(ys)] == (54_321 // step) * step  # the spike's bucket
    assert panel.notes == [f"the min and max of every {step} values"] and panel.data["length"] == 100_000


def test_at_most_max_lines_rows_each_named_and_nan_left_as_gaps():
    x = torch.zeros(MAX_LINES + 3, 80)
    x[0, 5] = float("nan")
    x[1, 7] = float("inf")
    labels = [f"row {i}" for i in range(MAX_LINES + 3)]
    panel = lines_panel(x, "s", labels)
    assert [name for name, _, _ in panel.data["series"]] == labels[:MAX_LINES]
    assert panel.notes == [f"first {MAX_LINES} of {MAX_LINES + 3} rows", "2 NaN/Inf values left as gaps"]
    assert np.isnan(panel.data["series"][0][2][5]) and np.isnan(panel.data["series"][1][2][7])


def test_a_bucket_keeps_its_finite_extremes_and_an_all_nan_bucket_is_a_gap():
    x = torch.zeros(1, 4 * MAX_POINTS)  # buckets of 8 values
    x[0, :8] = float("nan")
    x[0, 8:16] = torch.tensor([float("nan"), 1, 2, 3, float("nan"), -1, 0, 0])
    ys = lines_panel(x, "s").data["series"][0][2]
    assert np.isnan(ys[:2]).all() and list(ys[2:4]) == [-1.0, 3.0]


def test_a_row_without_finite_values_is_a_card_saying_so():
    panel = lines_panel(torch.full((2, 100), float("nan")), "s")
    assert panel.kind == "card"
    assert panel.data["lines"][-1] == "No picture: every value is NaN or ±Inf: there is no line to draw."


def test_the_figure_draws_one_axes_and_one_line_per_row():
    x = torch.stack([torch.linspace(0, 1, 300), torch.linspace(1, -2, 300)])
    fig = figure([lines_panel(x, "two")])
    assert len(fig.axes) == 2 and [len(ax.lines) for ax in fig.axes] == [1, 1]
    assert [ax.get_title(loc="left") for ax in fig.axes] == ["[0]", "[1]"]
    assert fig.axes[1].lines[0].get_ydata()[-1] == pytest.approx(-2.0)
    assert fig.axes[-1].get_xlabel() == "position" and fig.axes[0].get_xlim() == (0.0, 299.0)
