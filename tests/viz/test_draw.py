"""handlerkit/viz/draw.py: panels as one matplotlib Figure (at most three a row, sized by its
panels, user text literal), and the PNG display of a Figure in IPython."""

from __future__ import annotations

import sys
import types

import matplotlib
import numpy as np
import pytest
from _viz import texts
from matplotlib.figure import Figure

from handlerkit.viz.draw import MAX_COLUMNS, display_as_png, figure
from handlerkit.viz.panel import Panel


def card(title: str, size=(2.0, 1.0)) -> Panel:
    return Panel("card", title, {"lines": [f"{title} line"]}, size=size)


def test_panels_are_laid_out_three_a_row_and_the_figure_is_sized_by_them():
    panels = [card(f"p{i}", size=(1.6 + 0.8 * i, 1.0 + i)) for i in range(5)]
    fig = figure(panels, "five")
    cells = fig.subfigs  # a 2 x 3 grid, the last cell empty
    assert len(cells) == 2 * MAX_COLUMNS and fig.get_suptitle() == "five"
    assert [s.get_suptitle() for s in cells[:5]] == [f"p{i}" for i in range(5)] and cells[5].axes == []
    widths = [4.0, 4.8, 3.2]  # the widest panel of each column: p3, p4, p2
    heights = [3.0, 5.0]  # the tallest of each row: p2, p4
    assert tuple(fig.get_size_inches()) == pytest.approx((sum(widths), sum(heights) + 0.35))  # + the title


def test_a_figure_is_at_most_1200_pixels_wide_panels_shrinking_then_rows_holding_fewer():
    """JupyterLab's output area shows a figure of at most 1200 px at 100 %."""
    three = figure([card(f"p{i}", size=(4.8, 2.0)) for i in range(3)], "three")  # 14.4 in: shrunk to 12
    assert three.get_size_inches()[0] * three.dpi == pytest.approx(1200) and len(three.subfigs) == 3
    wide = figure([card(f"p{i}", size=(6.4, 2.0)) for i in range(3)], "wide")  # 19.2 in: two a row
    assert wide.get_size_inches()[0] * wide.dpi <= 1200 and len(wide.subfigs) == 4
    assert [s.get_suptitle() for s in wide.subfigs[:3]] == ["p0", "p1", "p2"] and wide.subfigs[3].axes == []


def test_one_panel_without_a_title_is_the_figure_itself():
    fig = figure([card("alone")])
    assert fig.subfigs == [] and fig.get_suptitle() == "alone" and "alone line" in texts(fig)


def test_user_text_is_literal_never_mathtext():
    panel = Panel("table", "$x$ costs $5", {"cells": [["$a$", "b"]], "rows": ["[0]"]}, ["$note$"])
    fig = figure([panel])
    assert fig.get_suptitle() == r"\$x\$ costs \$5"
    fig.canvas.draw()  # an unescaped "$a$" would be drawn as math, a lone "$" fails
    assert r"\$a\$" in texts(fig) and r"\$note\$" in texts(fig)


def test_an_overlay_legend_uses_the_panel_s_colours():
    data = {"grid": np.zeros((4, 4, 3), dtype=np.uint8), "legend": [("cat", "#ff7f0e"), ("dog", "#2ca02c")]}
    fig = figure([Panel("overlay", "o", data)])
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["cat", "dog"]
    assert [matplotlib.colors.to_hex(p.get_facecolor()) for p in legend.get_patches()] == ["#ff7f0e", "#2ca02c"]


def test_a_heat_map_is_indexed_like_the_tensor_not_its_subsample():
    data = {"values": np.array([[0.0, np.inf], [1.0, 2.0]]), "shape": (20, 20)}
    fig = figure([Panel("heatmap", "h", data)])
    ax = fig.axes[0]
    (image,) = ax.get_images()
    assert image.get_extent() == [-0.5, 19.5, 19.5, -0.5] and image.get_clim() == (0.0, 2.0)
    assert len(fig.axes) == 2  # the colour bar


def test_a_small_heat_map_writes_each_value_legibly_on_its_colour():
    values = np.array([[0.0, 1.0], [np.nan, 0.9]])
    data = {"values": values, "shape": (2, 2), "labels": [["0", "1"], ["nan", "0.9"]], "ylabel": "request"}
    ax = figure([Panel("heatmap", "h", data)]).axes[0]
    assert [(t.get_text(), t.get_color()) for t in ax.texts] == [
        ("0", "white"), ("1", "black"), ("nan", "white"), ("0.9", "black")]  # white on viridis' dark half
    assert [t.get_position() for t in ax.texts][1] == (1, 0)  # (column, row)
    assert list(ax.get_xticks()) == [0, 1] and ax.get_ylabel() == "request"


def test_a_table_with_columns_has_a_header_row():
    data = {"cells": [["cat", "0.9"]], "rows": ["[0]"], "columns": ["label", "$p$"]}
    (table,) = figure([Panel("table", "t", data)]).axes[0].tables
    cells = {key: cell.get_text().get_text() for key, cell in table.get_celld().items()}
    assert cells[(0, 1)] == r"\$p\$" and cells[(1, 0)] == "cat" and cells[(1, -1)] == "[0]"


def test_bars_of_a_unit_axis_and_of_free_values():
    samples = [(["a", "b"], [0.7, 0.3]), (["c", "d"], [0.6, float("nan")])]
    fig = figure([Panel("bars", "b", {"samples": samples, "xlabel": "probability", "unit": True})])
    assert len(fig.axes) == 2 and [ax.get_title(loc="left") for ax in fig.axes] == ["[0]", "[1]"]
    assert [p.get_width() for p in fig.axes[1].patches] == [0.6, 0.0]  # NaN drawn as 0
    assert fig.axes[0].get_xlim() == (0.0, 1.2) and fig.axes[-1].get_xlabel() == "probability"
    fig = figure([Panel("bars", "v", {"samples": [(["x", "y"], [-2.0, 4.0])], "xlabel": "value"})])
    low, high = fig.axes[0].get_xlim()
    assert low == pytest.approx(-2.6) and high == pytest.approx(4.0 + 4.0 * 0.3)


class _Formatter:
    def __init__(self, printers=None):
        self.type_printers = dict(printers or {})

    def for_type(self, cls, func):
        self.type_printers[cls] = func


def _shell(formatters: dict) -> types.SimpleNamespace:
    return types.SimpleNamespace(display_formatter=types.SimpleNamespace(formatters=formatters))


def test_a_figure_is_registered_for_png_display_once_and_an_existing_formatter_is_kept(monkeypatch):
    import IPython

    png = _Formatter()
    monkeypatch.setattr(IPython, "get_ipython", lambda: _shell({"image/png": png, "text/plain": _Formatter()}))
    display_as_png()
    printer = png.type_printers[Figure]
    assert printer.keywords == {"fmt": "png", "base64": True}
    svg_only = _Formatter({Figure: "svg printer"})
    png = _Formatter()
    monkeypatch.setattr(IPython, "get_ipython", lambda: _shell({"image/png": png, "image/svg+xml": svg_only}))
    display_as_png()  # the user's %config InlineBackend.figure_formats = ['svg']
    assert Figure not in png.type_printers
    monkeypatch.setitem(sys.modules, "IPython", None)
    display_as_png()  # no IPython: nothing to do
