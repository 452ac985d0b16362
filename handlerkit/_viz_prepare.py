"""Tensors → the bounded arrays a picture draws (torch side of ``hk.show``; no matplotlib).

Every preparer works where the tensor lives, subsamples first (at most ``max_images`` images or
channels, grids at most ``MAX_SIDE`` pixels a side, histograms of at most ``HIST_SAMPLE``
values, ``top_k`` bars) and copies only that bounded result to the host, so a huge tensor
draws as fast as a small one. Each returns a :class:`Panel` that ``_viz_draw`` turns into axes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from handlerkit._viz_handler import HandlerView

__all__ = ["Context", "Panel", "MAX_SIDE", "HIST_SAMPLE", "HIST_BINS"]

MAX_SIDE = 1024  # the longest side of a drawn grid, in pixels
HIST_SAMPLE = 1_000_000  # the most values a histogram reduces
HIST_BINS = 64
MAX_BAR_SAMPLES = 8
MAX_TOKEN_ROWS, MAX_TOKEN_COLS = 8, 12
# matplotlib's tab10, so class colours in overlays match their legend.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")


@dataclass
class Context:
    """What a picture may use besides the value: the handler's facts, limits, the input image."""

    view: HandlerView
    top_k: int = 5
    max_images: int = 16
    image: Any = None  # the input image batch ([N, C, H, W] or a list of [C, H, W]) for overlays
    scores: bool = False  # the value is a model's output (an inference stage): 2-d floats are scores


@dataclass
class Panel:
    """One picture: a kind ``_viz_draw`` knows, its title, notes and bounded data."""

    kind: str  # card, images, features, heatmap, histogram, bars, overlay, table
    title: str
    data: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    size: tuple[float, float] = (4.8, 4.0)  # inches


def colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def fmt_list(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.3g}" for v in values) + "]"


def columns(n: int) -> int:
    return max(1, math.ceil(math.sqrt(n)))


def cell_side(n: int) -> int:
    """The longest side of each of `n` images in a grid of at most ``MAX_SIDE`` pixels
    (``make_grid`` pads each by 2)."""
    return max(1, (MAX_SIDE - 2) // columns(n) - 2)


def shrink(x: torch.Tensor, side: int) -> tuple[torch.Tensor, int]:
    """A strided view whose last two dims are at most `side` (no copy), and the stride."""
    step = max(1, math.ceil(max(x.shape[-2], x.shape[-1]) / max(side, 1)))
    return (x[..., ::step, ::step] if step > 1 else x), step


def finite_range(x: torch.Tensor) -> tuple[float, float] | None:
    """min and max of the finite values (one transfer), or None when there are none."""
    finite = torch.isfinite(x)
    inf = torch.full((), float("inf"), dtype=x.dtype, device=x.device)
    low, high, count = torch.stack([
        torch.where(finite, x, inf).min(), torch.where(finite, x, -inf).max(), finite.sum().to(x.dtype)
    ]).tolist()
    return (low, high) if count else None


def unit_images(x: torch.Tensor, view: HandlerView) -> tuple[torch.Tensor, str]:
    """[N, C, H, W] pixels as floats in [0, 1], de-normalised with the handler's mean and std
    when it has them, and a note saying how."""
    if x.dtype == torch.uint8:
        return x.float() / 255.0, "uint8 pixels"
    x = x.float()
    channels = x.shape[1]
    note = ""
    if view.mean and view.std and len(view.mean) in (1, channels) and len(view.std) in (1, channels):
        mean = torch.tensor(view.mean, device=x.device).view(1, -1, 1, 1)
        std = torch.tensor(view.std, device=x.device).view(1, -1, 1, 1)
        x = x * std + mean
        note = f"de-normalised: mean={fmt_list(view.mean)} std={fmt_list(view.std)} ({view.normalize_at})"
    elif view.mean:
        note = f"not de-normalised: {view.normalize_at} normalises {len(view.mean)} channels, the image has {channels}"
    bounds = finite_range(x)
    x = torch.nan_to_num(x, nan=0.0, posinf=1.0, neginf=0.0)
    if bounds is None or (bounds[0] >= -0.1 and bounds[1] <= 1.1):  # resizing overshoots a little
        return x.clamp(0, 1), note or "values in [0, 1]"
    if bounds[0] >= 0 and bounds[1] <= 255:
        return (x / 255.0).clamp(0, 1), (note + "; " if note else "") + "0-255 values scaled to [0, 1]"
    flat = x.flatten(1)
    low, high = flat.amin(1).view(-1, 1, 1, 1), flat.amax(1).view(-1, 1, 1, 1)
    why = "after de-normalising" if note.startswith("de-") else "no Normalize found on the handler" if not note else ""
    why = f" ({why})" if why else ""
    return ((x - low) / (high - low).clamp(min=1e-12)).clamp(0, 1), (note + "; " if note else "") + (
        f"each image rescaled to its own range{why}")


def grid(images: list[torch.Tensor] | torch.Tensor, pad_value: float = 1.0) -> Any:
    """Images ([C, H, W] each, same dtype) as one [H, W, C] numpy grid, padded to one size."""
    from torchvision.utils import make_grid

    if isinstance(images, list):
        height = max(i.shape[-2] for i in images)
        width = max(i.shape[-1] for i in images)
        images = torch.stack([torch.nn.functional.pad(i, (0, width - i.shape[-1], 0, height - i.shape[-2]),
                                                      value=0) for i in images])
    pad = pad_value if images.is_floating_point() else int(pad_value * 255)
    out = make_grid(images, nrow=columns(images.shape[0]), padding=2, pad_value=pad)
    return out.permute(1, 2, 0).cpu().numpy()


def leading(x: torch.Tensor, ndim: int) -> tuple[torch.Tensor, str]:
    """Index 0 along the leading dims until `x` has `ndim` dims (a 5-d video → its first clip)."""
    if x.dim() <= ndim:
        return x, ""
    extra = x.dim() - ndim
    return x[(0,) * extra], f"index [{', '.join(['0'] * extra)}] of a {x.dim()}-d tensor"


def first(x: torch.Tensor, n: int, what: str) -> tuple[torch.Tensor, str]:
    if x.shape[0] <= n:
        return x, ""
    return x[:n], f"first {n} of {x.shape[0]} {what}"


# ---------------------------------------------------------------------------------------------
# Panels
# ---------------------------------------------------------------------------------------------


def card(title: str, lines: list[str]) -> Panel:
    lines = lines[:24]
    return Panel("card", title, {"lines": lines}, size=(6.4, 0.5 + 0.17 * (len(lines) + 2)))


def images_panel(x: torch.Tensor, ctx: Context, title: str) -> Panel:
    """[N, C, H, W] (C 1 or 3) as a grid, de-normalised."""
    x, n_note = first(x, ctx.max_images, "images")
    x, step = shrink(x, cell_side(x.shape[0]))
    x01, note = unit_images(x, ctx.view)
    notes = [n for n in (n_note, note, f"every {step}th pixel" if step > 1 else "") if n]
    return Panel("images", title, {"grid": grid(x01)}, notes, size=(4.8, 4.4))


def features_panel(x: torch.Tensor, ctx: Context, title: str) -> Panel:
    """[C, H, W] as a grid of channels, each scaled to its own range."""
    x, c_note = first(x, ctx.max_images, "channels")
    x, step = shrink(x, cell_side(x.shape[0]))
    x = x.float()
    flat = x.flatten(1)
    finite = torch.isfinite(flat)
    low = torch.where(finite, flat, torch.inf).amin(1).view(-1, 1, 1)
    high = torch.where(finite, flat, -torch.inf).amax(1).view(-1, 1, 1)
    scaled = (x - low) / (high - low).clamp(min=1e-12)
    scaled = torch.where(torch.isfinite(x), scaled.clamp(0, 1), torch.nan)
    picture = grid(scaled.unsqueeze(1), pad_value=float("nan"))[..., 0]
    notes = [n for n in (c_note, "each channel scaled to its own range", f"every {step}th pixel" if step > 1 else "")
             if n]
    return Panel("features", title, {"grid": picture}, notes, size=(4.8, 4.4))


def heatmap_panel(x: torch.Tensor, title: str) -> Panel:
    """A 2-d float tensor as an image with a colour bar."""
    shape = tuple(x.shape)
    x, step = shrink(x, MAX_SIDE)
    values = x.float().cpu().numpy()
    notes = [f"every {step}th row and column"] if step > 1 else []
    return Panel("heatmap", title, {"values": values, "shape": shape}, notes, size=(4.8, 4.0))


def histogram_panel(x: torch.Tensor, title: str) -> Panel:
    """The distribution of values: ``HIST_BINS`` bins of at most ``HIST_SAMPLE`` values."""
    flat = x.reshape(-1)
    notes = []
    step = max(1, math.ceil(flat.numel() / HIST_SAMPLE))
    if step > 1:
        flat = flat[::step]
        notes.append(f"every {step}th of {x.numel():,} values")
    if flat.dtype == torch.bool:
        true = int(flat.sum().item())
        return Panel("bars", title, {"samples": [(["False", "True"], [flat.numel() - true, true])], "xlabel": "count",
                                     "unit": False}, notes, size=(4.8, 2.0))
    values = flat.float()
    finite = values[torch.isfinite(values)]
    if finite.numel() < values.numel():
        notes.append(f"{values.numel() - finite.numel()} NaN/Inf values left out")
    if finite.numel() == 0:
        return card(title, ["no finite values to draw", *notes])
    low, high = torch.aminmax(finite)
    low_v, high_v = float(low), float(high)
    if low_v == high_v:
        low_v, high_v = low_v - 0.5, high_v + 0.5
    counts = torch.histc(finite, bins=HIST_BINS, min=low_v, max=high_v).cpu().numpy()
    edges = torch.linspace(low_v, high_v, HIST_BINS + 1).numpy()
    return Panel("histogram", title, {"counts": counts, "edges": edges}, notes, size=(4.8, 3.0))


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
    notes = [n for n in (n_note, f"top {k} of {scores.shape[1]} classes" if k < scores.shape[1] else "",
                         f"labels from {ctx.view.mapping_at}" if ctx.view.mapping else "") if n]
    return bars_from(samples, xlabel, unit, title, notes)


def bars_from(samples: list[tuple[list[str], list[float]]], xlabel: str, unit: bool, title: str,
              notes: list[str]) -> Panel:
    rows = sum(len(labels) for labels, _ in samples)
    return Panel("bars", title, {"samples": samples, "xlabel": xlabel, "unit": unit}, notes,
                 size=(4.8, 0.9 + 0.55 * len(samples) + 0.17 * rows))


def values_panel(x: torch.Tensor, ctx: Context, title: str) -> Panel:
    """A short 1-d tensor's values, in order, one bar each."""
    values = x.float().cpu().tolist()
    labels = [ctx.view.label(i) if ctx.view.mapping and len(ctx.view.mapping) == len(values) else f"[{i}]"
              for i in range(len(values))]
    return bars_from([(labels, values)], "value", False, title, [])


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


def tokens_panel(ids: torch.Tensor, ctx: Context, title: str, offsets: torch.Tensor | None = None) -> Panel:
    """[N, L] token ids as a table of their vocabulary entries (ids without a vocabulary); a 1-d
    ``ids`` with ``offsets`` (EmbeddingBag input, TorchServe's text handlers) is one row per offset."""
    if offsets is not None:
        starts = offsets[: MAX_TOKEN_ROWS + 1].tolist() + [ids.shape[0]]
        rows = [ids[a:min(b, a + MAX_TOKEN_COLS)].tolist() for a, b in zip(starts, starts[1:])][:MAX_TOKEN_ROWS]
        count, longest = offsets.shape[0], max(b - a for a, b in zip(starts, starts[1:]))
    else:
        rows = ids[:MAX_TOKEN_ROWS, :MAX_TOKEN_COLS].tolist()
        count, longest = ids.shape[0], ids.shape[1]
    width = max(len(row) for row in rows)
    cells = []
    for row in rows:
        words = ctx.view.tokens(row)
        texts = [_cell(w) for w in (words if words is not None else [str(i) for i in row])]
        cells.append(texts + [""] * (width - len(texts)))
    notes = [n for n in (f"first {MAX_TOKEN_ROWS} of {count} rows" if count > MAX_TOKEN_ROWS else "",
                         f"first {MAX_TOKEN_COLS} of {longest} positions" if longest > MAX_TOKEN_COLS else "")
             if n]
    notes.append(f"vocabulary: {ctx.view.vocab_at}" if ctx.view.lookup is not None
                 else "ids: no vocabulary on the handler (vocab, source_vocab or tokenizer)")
    return Panel("table", title, {"cells": cells, "rows": [f"[{i}]" for i in range(len(cells))]}, notes,
                 size=(6.4, 0.9 + 0.3 * len(cells)))


def _cell(text: str, width: int = 10) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "…"
