"""Token tables: token ids as their vocabulary entries (the ids themselves without one), as an
HTML table a row per request: selectable text, every position, no word cut.

A row's tokens are split into its words and, after them, its n-grams (TorchServe's text
handlers append every bigram after the words: ``the cat sat`` → ``the, cat, sat, the cat, cat
sat``); unknown entries (``<unk>``, ``[UNK]``, an id outside the vocabulary) are counted with
their positions, so a reader sees what the model did not know.
"""

from __future__ import annotations

import itertools
import re

import torch

from handlerkit.viz.panel import Context, Panel

__all__ = ["MAX_TOKEN_COLS", "MAX_TOKEN_ROWS", "is_unknown", "split_ngrams", "tokens_panel"]

MAX_TOKEN_ROWS, MAX_TOKEN_COLS = 64, 512  # requests and positions in the table
SEPARATOR = " · "  # between tokens: a token may hold a space (an n-gram) or be a word piece
_UNKNOWN = {"<unk>", "[unk]", "<oov>", "[oov]"}
_OUTSIDE = re.compile(r"<-?\d+\?>")  # HandlerView's spelling of an id outside the vocabulary


def tokens_panel(ids: torch.Tensor, ctx: Context, title: str, offsets: torch.Tensor | None = None) -> Panel:
    """[N, L] token ids as a table of their vocabulary entries (ids without a vocabulary); a 1-d
    ``ids`` with ``offsets`` (EmbeddingBag input, TorchServe's text handlers) is one row per offset."""
    from handlerkit._text import render_html
    from handlerkit.viz.registry import html_panel

    if offsets is not None:
        starts = offsets[: MAX_TOKEN_ROWS + 1].tolist() + [ids.shape[0]]
        rows = [ids[a : min(b, a + MAX_TOKEN_COLS)].tolist() for a, b in itertools.pairwise(starts)][:MAX_TOKEN_ROWS]
        count, longest = offsets.shape[0], max(b - a for a, b in itertools.pairwise(starts))
    else:
        rows = ids[:MAX_TOKEN_ROWS, :MAX_TOKEN_COLS].tolist()
        count, longest = ids.shape[0], ids.shape[1]
    cells: list[list[str]] = []
    table = []
    vocabulary = ctx.view.lookup is not None
    for i, row in enumerate(rows):
        words = ctx.view.tokens(row)
        texts = [_cell(w) for w in words] if words is not None else [str(t) for t in row]
        cells.append(texts)
        if not vocabulary:
            table.append([f"[{i}]", len(texts), SEPARATOR.join(texts)])
            continue
        k = split_ngrams(texts)
        unknown = [p for p, t in enumerate(texts) if is_unknown(t)]
        marked = f"{len(unknown)} at {', '.join(map(str, unknown))}" if unknown else ""
        table.append([f"[{i}]", len(texts), SEPARATOR.join(texts[:k]), SEPARATOR.join(texts[k:]), marked])
    headers = ["request", "tokens", "words", "n-grams after the words", "unknown (positions)"]
    html = render_html(headers if vocabulary else ["request", "tokens", "ids"], table)
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
        if vocabulary
        else "ids: no vocabulary on the handler (vocab, source_vocab or tokenizer)"
    )
    panel = html_panel(title, html)
    panel.data["cells"] = cells
    panel.notes = notes
    return panel


def is_unknown(token: str) -> bool:
    """Whether a vocabulary entry stands for what the vocabulary lacks."""
    return token.lower() in _UNKNOWN or bool(_OUTSIDE.fullmatch(token))


def split_ngrams(tokens: list[str]) -> int:
    """How many of `tokens` are words, the rest the bigrams a text handler appended: `tokens`
    are k words then k - 1 entries that hold a space (or are unknown); else all are words."""
    k = (len(tokens) + 1) // 2
    words, grams = tokens[:k], tokens[k:]
    if (
        len(tokens) >= 3
        and len(tokens) == 2 * k - 1
        and not any(" " in w for w in words)
        and all(" " in g or is_unknown(g) for g in grams)
        and any(" " in g for g in grams)
    ):
        return k
    return len(tokens)


def _cell(text: str) -> str:
    return text.replace("\n", "\\n")
