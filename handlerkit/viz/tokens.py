"""Token tables: token ids as their vocabulary entries (the ids themselves without one)."""

from __future__ import annotations

import itertools

import torch

from handlerkit.viz.panel import Context, Panel

__all__ = ["MAX_TOKEN_COLS", "MAX_TOKEN_ROWS", "tokens_panel"]

MAX_TOKEN_ROWS, MAX_TOKEN_COLS = 8, 12


def tokens_panel(ids: torch.Tensor, ctx: Context, title: str, offsets: torch.Tensor | None = None) -> Panel:
    """[N, L] token ids as a table of their vocabulary entries (ids without a vocabulary); a 1-d
    ``ids`` with ``offsets`` (EmbeddingBag input, TorchServe's text handlers) is one row per offset."""
    if offsets is not None:
        starts = offsets[: MAX_TOKEN_ROWS + 1].tolist() + [ids.shape[0]]
        rows = [ids[a : min(b, a + MAX_TOKEN_COLS)].tolist() for a, b in itertools.pairwise(starts)][:MAX_TOKEN_ROWS]
        count, longest = offsets.shape[0], max(b - a for a, b in itertools.pairwise(starts))
    else:
        rows = ids[:MAX_TOKEN_ROWS, :MAX_TOKEN_COLS].tolist()
        count, longest = ids.shape[0], ids.shape[1]
    width = max(len(row) for row in rows)
    cells = []
    for row in rows:
        words = ctx.view.tokens(row)
        texts = [_cell(w) for w in (words if words is not None else [str(i) for i in row])]
        cells.append(texts + [""] * (width - len(texts)))
    notes = [
        n
        for n in (
            f"first {MAX_TOKEN_ROWS} of {count} rows" if count > MAX_TOKEN_ROWS else "",
            f"first {MAX_TOKEN_COLS} of {longest} positions" if longest > MAX_TOKEN_COLS else "",
        )
        if n
    ]
    notes.append(
        f"vocabulary: {ctx.view.vocab_at}"
        if ctx.view.lookup is not None
        else "ids: no vocabulary on the handler (vocab, source_vocab or tokenizer)"
    )
    return Panel(
        "table",
        title,
        {"cells": cells, "rows": [f"[{i}]" for i in range(len(cells))]},
        notes,
        size=(6.4, 0.9 + 0.3 * len(cells)),
    )


def _cell(text: str, width: int = 10) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "…"
