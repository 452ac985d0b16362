"""handlerkit/viz/panel.py: the bounds every panel keeps (grid cells, strided views, the first n),
the finite range read in one transfer, and which values may be a model's output."""

from __future__ import annotations

import math

import torch

from handlerkit.viz.handler_view import HandlerView
from handlerkit.viz.panel import MAX_SIDE, Context, cell_side, columns, finite_range, first, shrink


def test_a_grid_of_cells_fits_in_max_side_pixels():
    for n in (1, 2, 4, 5, 16, 100):
        cols = columns(n)
        assert cols == math.ceil(math.sqrt(n))
        assert cols * (cell_side(n) + 2) + 2 <= MAX_SIDE  # make_grid pads each cell by 2


def test_shrink_is_a_strided_view_no_larger_than_side():
    x = torch.arange(100.0).reshape(10, 10)
    small, step = shrink(x, 4)
    assert step == 3 and small.shape == (4, 4) and small.data_ptr() == x.data_ptr()
    assert small[1, 1] == x[3, 3]
    same, step = shrink(x, 10)
    assert step == 1 and same is x


def test_first_keeps_n_and_says_what_was_left_out():
    kept, note = first(torch.zeros(5, 2), 3, "rows")
    assert kept.shape[0] == 3 and note == "first 3 of 5 rows"
    kept, note = first(torch.zeros(2, 2), 3, "rows")
    assert kept.shape[0] == 2 and note == ""


def test_finite_range_ignores_nan_and_inf():
    assert finite_range(torch.tensor([float("nan"), -2.0, float("inf"), 5.0])) == (-2.0, 5.0)
    assert finite_range(torch.tensor([float("nan"), float("-inf")])) is None


def test_every_stage_but_the_model_s_input_may_hold_its_output():
    may = {stage: Context(HandlerView(), stage=stage).model_output
           for stage in (None, "initialize", "preprocess", "inference", "postprocess", "handle")}
    assert may == {None: True, "initialize": False, "preprocess": False, "inference": True, "postprocess": True,
                   "handle": True}
