"""Bars: a model's class scores or logits as the top-k of each row (labelled from the handler's
mapping), a short tensor's values in order, and postprocessed ``{label: score}`` dicts."""

from __future__ import annotations

import torch

from handlerkit.viz.panel import Context, Panel, finite_range, first

__all__ = ["bars_from", "bars_panel", "dict_bars_panel", "values_panel"]

MAX_BAR_SAMPLES = 8  # rows of bars in one panel


def bars_panel(scores: torch.Tensor, ctx: Context, title: str) -> Panel:
    """[N, K] scores as the top-k bars of each row, labelled from the mapping."""
    scores, n_note = first(scores, min(ctx.max_images, MAX_BAR_SAMPLES), "rows")
    values = torch.nan_to_num(scores.float(), nan=-torch.inf)
    bounds = finite_range(values)
    unit = bounds is not None and bounds[0] >= 0 and bounds[1] <= 1
    if unit:
        sums_one = bool(((values.sum(1) - 1).abs() < 1e-3).all())
        xlabel = "probability" if sums_one else "score"
    else:
        values, xlabel = torch.softmax(values, dim=1), "softmax(logits)"
        unit = True
    k = min(ctx.top_k, values.shape[1])
    top, index = torch.topk(values, k, dim=1)
    samples = [([ctx.view.label(i) for i in idx], vals) for idx, vals in zip(index.tolist(), top.tolist())]
    notes = [
        n
        for n in (
            n_note,
            f"top {k} of {scores.shape[1]} classes" if k < scores.shape[1] else "",
            f"labels from {ctx.view.mapping_at}" if ctx.view.mapping else "",
        )
        if n
    ]
    return bars_from(samples, xlabel, unit, title, notes)


def values_panel(x: torch.Tensor, title: str) -> Panel:
    """A short 1-d tensor's values, in order, one bar each, labelled by position (class labels
    belong to a model's scores only: ``bars_panel``)."""
    values = x.float().cpu().tolist()
    return bars_from([([f"[{i}]" for i in range(len(values))], values)], "value", False, title, [])


def dict_bars_panel(rows: list[dict], ctx: Context, title: str) -> Panel:
    """Postprocessed ``{label: score}`` dicts (TorchServe's ImageClassifier) as top-k bars."""
    shown = rows[: min(ctx.max_images, MAX_BAR_SAMPLES)]
    samples = []
    for row in shown:
        ranked = sorted(row.items(), key=lambda kv: -float(kv[1]))[: ctx.top_k]
        samples.append(([str(k) for k, _ in ranked], [float(v) for _, v in ranked]))
    values = [v for _, vs in samples for v in vs]
    unit = bool(values) and all(0 <= v <= 1 for v in values)
    notes = [f"first {len(shown)} of {len(rows)} rows"] if len(shown) < len(rows) else []
    return bars_from(samples, "probability" if unit else "value", unit, title, notes)


def bars_from(
    samples: list[tuple[list[str], list[float]]], xlabel: str, unit: bool, title: str, notes: list[str]
) -> Panel:
    """A bars panel of ``(labels, values)`` rows; `unit` draws them on a 0-1 axis."""
    rows = sum(len(labels) for labels, _ in samples)
    return Panel(
        "bars",
        title,
        {"samples": samples, "xlabel": xlabel, "unit": unit},
        notes,
        size=(4.8, 0.9 + 0.55 * len(samples) + 0.17 * rows),
    )
