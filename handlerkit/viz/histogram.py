"""A histogram: the distribution of a tensor's values, from a bounded sample."""

from __future__ import annotations

import math

import torch

from handlerkit.viz.cards import summary_card
from handlerkit.viz.panel import Panel

__all__ = ["HIST_BINS", "HIST_SAMPLE", "histogram_panel"]

HIST_SAMPLE = 1_000_000  # the most values a histogram reduces
HIST_BINS = 64


def histogram_panel(x: torch.Tensor, title: str) -> Panel:
    """The distribution of values: ``HIST_BINS`` bins of at most ``HIST_SAMPLE`` values (booleans:
    two bars, False and True)."""
    flat = x.reshape(-1)
    notes = []
    step = max(1, math.ceil(flat.numel() / HIST_SAMPLE))
    if step > 1:
        flat = flat[::step]
        notes.append(f"every {step}th of {x.numel():,} values")
    if flat.dtype == torch.bool:
        true = int(flat.sum().item())
        return Panel(
            "bars",
            title,
            {"samples": [(["False", "True"], [flat.numel() - true, true])], "xlabel": "count", "unit": False},
            notes,
            size=(4.8, 2.0),
        )
    values = flat.float()
    finite = values[torch.isfinite(values)]
    if finite.numel() < values.numel():
        notes.append(f"{values.numel() - finite.numel()} NaN/Inf values left out")
    if finite.numel() == 0:
        return summary_card(title, x, "every value is NaN or ±Inf: there is no distribution to draw")
    low, high = torch.aminmax(finite)
    low_v, high_v = float(low), float(high)
    if low_v == high_v:
        low_v, high_v = low_v - 0.5, high_v + 0.5
    counts = torch.histc(finite, bins=HIST_BINS, min=low_v, max=high_v).cpu().numpy()
    edges = torch.linspace(low_v, high_v, HIST_BINS + 1).numpy()
    return Panel("histogram", title, {"counts": counts, "edges": edges}, notes, size=(4.8, 3.0))
