"""Panels → a matplotlib ``Figure`` (the drawing side of ``hk.show``), displayed as PNG in Jupyter.

Figures are made with ``matplotlib.figure.Figure``, not pyplot, so nothing is registered with
pyplot's figure manager and nothing is shown behind the caller's back; the style is set in an
``rc_context`` and never changes the user's global settings. Panels arrive validated and
bounded, and every text from the user's data is escaped (a ``$`` would start mathtext), so
matplotlib never sees something it cannot draw.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from typing import Any

from handlerkit.viz.panel import Panel

__all__ = ["STYLE", "display_as_png", "figure"]

#: The house style, applied while a figure is built (fonts small enough for tables of labels).
STYLE: dict[str, Any] = {
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 7,
    "figure.titlesize": 9,
    "image.interpolation": "antialiased",
}
MAX_COLUMNS = 3
#: The widest figure, in inches at matplotlib's 100 dpi: JupyterLab's output area at 100 %.
MAX_WIDTH = 12.0
_SMALLEST = 0.75  # panels shrink to this share of their size before a row loses a column


def _t(text: str) -> str:
    """User text made literal for matplotlib (no mathtext)."""
    return str(text).replace("$", r"\$")


def _wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.fill(line, width) or line for line in str(text).splitlines())


def figure(panels: Sequence[Panel], title: str | None = None) -> Any:
    """One figure holding `panels`, at most three a row, under `title`, at most ``MAX_WIDTH``
    inches wide (panels shrink a little, then a row holds fewer)."""
    import matplotlib
    from matplotlib.figure import Figure

    columns, scale = _layout(panels)
    rows = [list(panels[i : i + columns]) for i in range(0, len(panels), columns)]
    widths = [max(row[c].size[0] for row in rows if c < len(row)) * scale for c in range(columns)]
    heights = [max(p.size[1] for p in row) for row in rows]  # text keeps its size: heights do not shrink
    extra = 0.35 if title else 0.0
    with matplotlib.rc_context(STYLE):  # type: ignore[arg-type]  # matplotlib's stubs list the keys as Literals
        fig = Figure(figsize=(sum(widths), sum(heights) + extra), layout="constrained", dpi=100)
        if title:
            fig.suptitle(_t(_wrap(title, 30 * columns + 20)), fontsize=10, fontweight="bold")
        if len(panels) == 1 and not title:
            _draw(panels[0], fig)
        else:  # a panel in a subfigure keeps its own title under the figure's
            subfigs = fig.subfigures(len(rows), columns, squeeze=False, width_ratios=widths, height_ratios=heights)
            for r, row in enumerate(rows):
                for c in range(columns):
                    if c < len(row):
                        _draw(row[c], subfigs[r][c])
    return fig


def _layout(panels: Sequence[Panel]) -> tuple[int, float]:
    """Columns and a scale so that the widest row fits ``MAX_WIDTH``."""
    columns = max(1, min(len(panels), MAX_COLUMNS))
    while True:
        widths = [max(p.size[0] for p in panels[c::columns]) for c in range(columns)]
        scale = min(1.0, MAX_WIDTH / sum(widths))
        if scale >= _SMALLEST or columns == 1:
            return columns, scale
        columns -= 1


def _draw(panel: Panel, where: Any) -> None:
    width = max(30, int(panel.size[0] * 11))
    where.suptitle(_t(_wrap(panel.title, width)), fontsize=9)
    if panel.notes:
        where.supxlabel(_t(_wrap("; ".join(panel.notes), int(width * 1.3))), fontsize=7, color="0.35")
    _KINDS[panel.kind](panel.data, where)


def _card(data: dict[str, Any], where: Any) -> None:
    ax = where.add_subplot()
    ax.axis("off")
    lines = [
        wrapped for line in data["lines"] for wrapped in textwrap.wrap(str(line), 100, subsequent_indent="    ") or [""]
    ]
    ax.text(
        0.0, 1.0, _t("\n".join(lines[:30])), family="monospace", fontsize=7, va="top", ha="left", transform=ax.transAxes
    )


def _image(data: dict[str, Any], where: Any) -> None:
    ax = where.add_subplot()
    ax.imshow(data["grid"])
    ax.axis("off")
    legend = data.get("legend")
    if legend:
        from matplotlib.patches import Patch

        handles = [Patch(facecolor=colour, label=_t(label)) for label, colour in legend]
        where.legend(handles=handles, loc="outside right upper", frameon=False)


def _features(data: dict[str, Any], where: Any) -> None:
    import matplotlib

    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="white")
    ax = where.add_subplot()
    ax.imshow(data["grid"], cmap=cmap, vmin=0.0, vmax=1.0)
    ax.axis("off")


def _heatmap(data: dict[str, Any], where: Any) -> None:
    import numpy as np

    values = data["values"]
    finite = values[np.isfinite(values)]
    ax = where.add_subplot()
    shown = np.where(np.isfinite(values), values, np.nan)
    rows, cols = data.get("shape", values.shape)
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    image = ax.imshow(
        shown,
        cmap="viridis",
        aspect="auto",
        interpolation="nearest",
        vmin=low,
        vmax=high,
        extent=(-0.5, cols - 0.5, rows - 0.5, -0.5),
    )  # the tensor's indices, not the subsample's
    where.colorbar(image, ax=ax)
    labels = data.get("labels")
    if labels is not None:  # a small table: every value written in its cell, every index ticked
        ax.set_xticks(range(cols))
        ax.set_yticks(range(rows))
        middle = (low + high) / 2
        for (r, c), text in np.ndenumerate(np.asarray(labels, dtype=object)):
            dark = not np.isfinite(values[r, c]) or values[r, c] < middle  # viridis is dark below its middle
            ax.text(c, r, _t(text), ha="center", va="center", fontsize=7, color="white" if dark else "black")
    columns = data.get("columns")
    if columns is not None:  # each column named (the classes of a score per position)
        ax.set_xticks(range(cols), [_t(c[:12]) for c in columns], rotation=45, ha="right")
    ax.set_xlabel(_t(data.get("xlabel", "column")))
    ax.set_ylabel(_t(data.get("ylabel", "row")))


def _histogram(data: dict[str, Any], where: Any) -> None:
    ax = where.add_subplot()
    ax.stairs(data["counts"], data["edges"], fill=True, color="#1f77b4", alpha=0.85)
    ax.set_xlabel("value")
    ax.set_ylabel("count")


def _bars(data: dict[str, Any], where: Any) -> None:
    samples = data["samples"]
    axes = where.subplots(len(samples), 1, squeeze=False)[:, 0]
    unit = data.get("unit", False)
    for i, (ax, (labels, values)) in enumerate(zip(axes, samples)):
        values = [v if math.isfinite(v) else 0.0 for v in values]
        positions = list(range(len(values)))
        ax.barh(positions, values, color="#1f77b4", height=0.7)
        ax.set_yticks(positions, [_t(label[:24]) for label in labels])
        ax.invert_yaxis()
        if unit:
            ax.set_xlim(0.0, 1.2)
            ax.set_xticks([0.0, 0.25, 0.5, 0.75, 1.0])
        else:
            top = max([abs(v) for v in values] or [1.0]) or 1.0
            ax.set_xlim(min(0.0, min(values, default=0.0)) * 1.3, max(0.0, max(values, default=0.0)) + top * 0.3)
        for y, v in zip(positions, values):
            ax.text(max(v, 0.0), y, f" {v:.3f}" if unit else f" {v:.4g}", va="center", ha="left", fontsize=7)
        if len(samples) > 1:
            ax.set_title(f"[{i}]", loc="left", fontsize=7)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[-1].set_xlabel(_t(data.get("xlabel", "")))


def _lines(data: dict[str, Any], where: Any) -> None:
    series = data["series"]
    axes = where.subplots(len(series), 1, squeeze=False, sharex=True)[:, 0]
    for ax, (label, xs, ys) in zip(axes, series):
        ax.plot(xs, ys, color="#1f77b4", linewidth=0.8)
        ax.set_xlim(0, max(data["length"] - 1, 1))
        if len(series) > 1:
            ax.set_title(_t(label), loc="left", fontsize=7)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[-1].set_xlabel(_t(data["xlabel"]))


def _table(data: dict[str, Any], where: Any) -> None:
    ax = where.add_subplot()
    ax.axis("off")
    cells = [[_t(c) for c in row] for row in data["cells"]]
    columns = [_t(c) for c in data["columns"]] if data.get("columns") else None
    table = ax.table(cellText=cells, rowLabels=data["rows"], colLabels=columns, loc="center", cellLoc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(7)
    if columns:  # a JSON table: columns as wide as their texts, so the row labels stay inside
        table.auto_set_column_width(list(range(-1, len(columns))))


def _timeline(data: dict[str, Any], where: Any) -> None:
    """A row per request: its time to first chunk as a bar, a tick per chunk, the final answer
    as a diamond (each artist has a gid: ``ttfc``, ``chunks``, ``final``)."""
    ax = where.add_subplot()
    rows = data["rows"]
    for y, row in enumerate(rows):
        if row["first_ms"] is not None:
            ax.barh(y, row["first_ms"], height=0.5, color="#c6dbef", gid="ttfc")
        if row.get("first_text", True) and row["first_ms"] is not None:
            ax.text(row["first_ms"], y - 0.3, f" {row['first_ms']:.1f} ms", fontsize=6, va="bottom", color="#08519c")
        if row["chunks"]:
            ax.scatter(row["chunks"], [y] * len(row["chunks"]), marker="|", s=80, color="#1f77b4", gid="chunks")
        if row["final_ms"] is not None:
            ax.scatter([row["final_ms"]], [y], marker="D", s=24, color="#d62728", gid="final", zorder=3)
    ax.set_yticks(range(len(rows)), [_t(row["label"]) for row in rows])
    ax.set_ylim(len(rows) - 0.5, -0.7)
    ax.set_xlim(0, max(data["end_ms"], 1e-3) * 1.08)
    ax.set_xlabel(_t(data["xlabel"]))
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [
        Patch(facecolor="#c6dbef", label="time to first chunk"),
        Line2D([], [], marker="|", linestyle="", color="#1f77b4", label="chunk"),
        Line2D([], [], marker="D", linestyle="", color="#d62728", label="final answer"),
    ]
    where.legend(handles=handles, loc="outside upper right", fontsize=6, frameon=False)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


_STEP_COLOURS = {
    "joined": "#9ecae1",
    "running": "#3182bd",
    "finished": "#31a354",
    "cancelled": "#fd8d3c",
    "failed": "#d62728",
}


def _steps(data: dict[str, Any], where: Any) -> None:
    """A row per request, a square per step it was in, coloured by what became of it there
    (each state's squares one artist whose gid is the state's name)."""
    ax = where.add_subplot()
    labels = data["labels"]
    for state, cells in data["cells"].items():
        if cells:
            xs, ys = zip(*cells, strict=True)
            ax.scatter(xs, ys, marker="s", s=40, color=_STEP_COLOURS[state], gid=state, label=state)
    first, last = data["steps"]
    ax.set_xlim(first - 0.7, last + 0.7)
    ax.set_yticks(range(len(labels)), [_t(label) for label in labels])
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlabel(_t(data["xlabel"]))
    ax.xaxis.get_major_locator().set_params(integer=True)
    if any(data["cells"].values()):
        where.legend(loc="outside right upper", fontsize=6, frameon=False)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _axes(data: dict[str, Any], where: Any) -> None:
    """A user's picture: its function drawn on an Axes of its own."""
    data["draw"](where.add_subplot())


_KINDS = {
    "axes": _axes,
    "card": _card,
    "images": _image,
    "overlay": _image,
    "features": _features,
    "heatmap": _heatmap,
    "histogram": _histogram,
    "bars": _bars,
    "lines": _lines,
    "table": _table,
    "timeline": _timeline,
    "steps": _steps,
}


def display_as_png() -> None:
    """Make IPython display a returned Figure as PNG. matplotlib-inline registers that formatter
    only once pyplot loads its backend; show() never imports pyplot, so in a fresh kernel the
    Figure would print as ``<Figure size ...>``. A formatter already set (inline backend,
    ``%config InlineBackend.figure_formats``) is left alone."""
    import functools
    import sys

    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or not hasattr(shell, "display_formatter"):
        return
    from matplotlib.figure import Figure

    formatters = shell.display_formatter.formatters
    if any(Figure in getattr(f, "type_printers", {}) for f in formatters.values()):
        return
    from IPython.core.pylabtools import print_figure

    formatters["image/png"].for_type(Figure, functools.partial(print_figure, fmt="png", base64=True))


# ---------------------------------------------------------------------------------------------
# Maps, waveforms, attributions and segmentations (viz/maps.py, audio.py, explanations.py,
# overlays.py): each draws on its own scale with a colour bar or legend that matches it.
# ---------------------------------------------------------------------------------------------


def _map_axes(where: Any, count: int) -> list[Any]:
    """`count` axes, at most four a row, sharing both axes' scales."""
    per_row = min(count, 4)
    rows = -(-count // per_row)
    axes = where.subplots(rows, per_row, squeeze=False, sharex=True, sharey=True).ravel()
    for ax in axes[count:]:
        ax.set_visible(False)
    return list(axes[:count])


def _maps(data: dict[str, Any], where: Any) -> None:
    """A heat map per request on one colour scale (the data's min..max) with one colour bar;
    time × frequency maps with row 0 (the lowest frequency) at the bottom."""
    import matplotlib

    rows, cols = data["shape"]
    low, high = data["limits"]
    if low == high:
        low, high = low - 0.5, high + 0.5
    cmap = matplotlib.colormaps[data["cmap"]].with_extremes(bad="white")
    bottom_up = data["low_at_bottom"]
    axes = _map_axes(where, len(data["maps"]))
    image = None
    for ax, values, label in zip(axes, data["maps"], data["labels"]):
        extent = (-0.5, cols - 0.5, -0.5, rows - 0.5) if bottom_up else (-0.5, cols - 0.5, rows - 0.5, -0.5)
        image = ax.imshow(
            values,
            cmap=cmap,
            vmin=low,
            vmax=high,
            aspect="auto",
            interpolation="nearest",
            origin="lower" if bottom_up else "upper",
            extent=extent,
        )  # the tensor's indices, not the subsample's
        ax.set_title(_t(label), fontsize=7, loc="left")
    for ax in axes:
        if ax.get_subplotspec().is_last_row():
            ax.set_xlabel(_t(data["xlabel"]))
        if ax.get_subplotspec().is_first_col():
            ax.set_ylabel(_t(data["ylabel"]))
    if image is not None:
        where.colorbar(image, ax=axes, shrink=0.9)


def _waveform(data: dict[str, Any], where: Any) -> None:
    """A waveform per clip over time in seconds, amplitude in [-1, 1]."""
    series = data["series"]
    axes = where.subplots(len(series), 1, squeeze=False, sharex=True)[:, 0]
    end = max(length / rate for length, rate in zip(data["lengths"], data["rates"]))
    for ax, (label, xs, ys), rate in zip(axes, series, data["rates"]):
        ax.plot(xs / rate, ys, color="#1f77b4", linewidth=0.6)
        ax.set_xlim(0, end)
        ax.set_ylim(-1.05, 1.05)
        ax.set_ylabel("amplitude")
        if label:
            ax.set_title(_t(label), loc="left", fontsize=7)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[-1].set_xlabel(_t(data["xlabel"]))


def _attributions(data: dict[str, Any], where: Any) -> None:
    """Per request, attributions as a diverging heat map (limits ±limit, 0 the neutral colour)
    over its grey input image, opaque in proportion to |value|; one symmetric colour bar."""
    import matplotlib
    import matplotlib.cm
    import matplotlib.colors
    import numpy as np

    limit = data["limit"]
    cmap = matplotlib.colormaps[data["cmap"]]
    norm = matplotlib.colors.Normalize(vmin=-limit, vmax=limit)
    axes = where.subplots(1, len(data["values"]), squeeze=False)[0]
    image = None
    for ax, values, base, label in zip(axes, data["values"], data["images"], data["labels"]):
        if base is not None:
            ax.imshow(base, cmap="gray", vmin=0.0, vmax=1.0, interpolation="antialiased")
            alpha = np.clip(np.abs(values) / limit, 0.0, 1.0) * 0.85
        else:
            alpha = None
        image = ax.imshow(values, cmap=cmap, norm=norm, alpha=alpha, interpolation="nearest")
        ax.set_title(_t(label), fontsize=7, loc="left")
        ax.axis("off")
    if image is not None:
        bar = where.colorbar(matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap), ax=list(axes), shrink=0.85)
        bar.set_label("attribution")


def _overlay(data: dict[str, Any], where: Any) -> None:
    """The input image (a segmentation's in grey), a segmentation's class masks over it in
    their legend colours (an RGBA layer, ``mask``), and the legend."""
    ax = where.add_subplot()
    ax.imshow(data["grid"])
    if data.get("mask") is not None:
        ax.imshow(data["mask"], interpolation="nearest")
    ax.axis("off")
    if data.get("legend"):
        from matplotlib.patches import Patch

        handles = [Patch(facecolor=colour, label=_t(label)) for label, colour in data["legend"]]
        where.legend(handles=handles, loc="outside right upper", frameon=False)


_KINDS.update(maps=_maps, waveform=_waveform, attributions=_attributions, overlay=_overlay)
