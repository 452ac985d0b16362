"""Lines: 1-d signals (audio, sensor readings, a sequence's values) drawn in order, one line per
row, each on its own axes.

A row longer than ``MAX_POINTS`` is reduced where it lives to the minimum and maximum of each of
``MAX_POINTS // 2`` equal buckets, drawn in that order: at the width of a figure the line looks
as the full one would (every peak kept), and only ``MAX_POINTS`` values per row reach the host.
"""

from __future__ import annotations

import math

import torch

from handlerkit.viz.cards import summary_card
from handlerkit.viz.panel import Panel, first

__all__ = ["MAX_LINES", "MAX_POINTS", "lines_panel"]

MAX_LINES = 8  # rows drawn, each a line on its own axes
MAX_POINTS = 2048  # values drawn per line


def lines_panel(x: torch.Tensor, title: str, labels: list[str] | None = None) -> Panel:
    """[R, T] real values as R lines over positions 0..T-1 (the first ``MAX_LINES``), labelled
    ``labels`` (default ``[0]``, ``[1]``...); NaN and ±Inf leave gaps."""
    whole, length = x, x.shape[1]
    x, r_note = first(x, MAX_LINES, "rows")
    with torch.no_grad():
        values = x.detach().float()
        finite = torch.isfinite(values)
        missing = int((~finite).sum().item())
        if missing == values.numel():
            return summary_card(title, whole, "every value is NaN or ±Inf: there is no line to draw")
        values = torch.where(finite, values, torch.nan)
        step = max(1, math.ceil(length / (MAX_POINTS // 2)))
        if step > 1:
            positions, values = _envelope(values, step)
        else:
            positions = torch.arange(length, dtype=torch.float32)
    ys = values.cpu().numpy()
    xs = positions.numpy()
    names = labels[: ys.shape[0]] if labels is not None else [f"[{i}]" for i in range(ys.shape[0])]
    series = [(name, xs, ys[i]) for i, name in enumerate(names)]
    notes = [
        n
        for n in (
            r_note,
            f"the min and max of every {step} values" if step > 1 else "",
            f"{missing} NaN/Inf values left as gaps" if missing else "",
        )
        if n
    ]
    return Panel(
        "lines",
        title,
        {"series": series, "length": length, "xlabel": "position"},
        notes,
        size=(6.4, 0.9 + 1.1 * len(series)),
    )


def _envelope(values: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The min and max of each bucket of `step` values, in that order, and their positions (the
    bucket's first index, twice). The last bucket is padded with its own last value."""
    rows, length = values.shape
    buckets = math.ceil(length / step)
    pad = buckets * step - length
    if pad:
        values = torch.cat([values, values[:, -1:].expand(rows, pad)], dim=1)
    grouped = values.view(rows, buckets, step)
    # nan-aware: a bucket with some NaN keeps its finite extremes; an all-NaN bucket stays a gap
    low = torch.where(torch.isnan(grouped), torch.inf, grouped).amin(2)
    high = torch.where(torch.isnan(grouped), -torch.inf, grouped).amax(2)
    gap = torch.isinf(low) & (low > 0)
    low, high = torch.where(gap, torch.nan, low), torch.where(gap, torch.nan, high)
    paired = torch.stack([low, high], dim=2).reshape(rows, 2 * buckets)
    starts = torch.arange(buckets, dtype=torch.float32) * step
    return torch.stack([starts, starts], dim=1).reshape(-1), paired
