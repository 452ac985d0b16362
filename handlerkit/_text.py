"""Text helpers every module shares: tables (plain and HTML), byte sizes, "did you mean"."""

from __future__ import annotations

import html
import textwrap
from collections.abc import Iterable, Sequence
from typing import Any


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:.1f}"
    return str(value)


def render_text(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str = "", wrap: int | None = None) -> str:
    """A fixed-width table: numbers right-aligned, text left-aligned. With ``wrap``, a text cell
    wider than that wraps onto continuation lines of its row (a table of long messages, such as
    compile guards and fixes, then fits a terminal); one-line summaries are left whole."""
    numeric = [
        all(isinstance(row[i], (int, float)) and not isinstance(row[i], bool) for row in rows if row[i] is not None)
        and any(row[i] is not None for row in rows)
        for i in range(len(headers))
    ]
    wrapped = [[_wrapped(_cell(v), num, wrap) for v, num in zip(row, numeric)] for row in rows]
    widths = [len(h) for h in headers]
    for row in wrapped:
        for i, lines in enumerate(row):
            widths[i] = max(widths[i], *(len(part) for part in lines))

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return "  ".join(parts).rstrip()

    out = [title] if title else []
    if any(headers):  # a key/value table (all headers empty) has no header row
        out.append(line(list(headers)))
        out.append("  ".join("-" * w for w in widths))
    for row in wrapped:
        for k in range(max((len(lines) for lines in row), default=1)):
            out.append(line([lines[k] if k < len(lines) else "" for lines in row]))
    return "\n".join(out)


def _wrapped(text: str, numeric: bool, width: int | None) -> list[str]:
    """A cell's lines: one, unless ``width`` is given and the text is longer or holds line
    breaks; then its own breaks are kept and each line is wrapped at word boundaries (a word
    longer than the width is cut). Numbers never wrap."""
    if width is None or numeric or (len(text) <= width and "\n" not in text):
        return [text]
    lines: list[str] = []
    for part in text.split("\n"):
        lines.extend(textwrap.wrap(part, width, break_on_hyphens=False) or [""])
    return lines


def render_html(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str = "") -> str:
    """The same table as HTML for Jupyter (escaped; no scripts, no external CSS)."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers) if any(headers) else ""
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in row) + "</tr>" for row in rows)
    caption = f"<caption style='text-align:left'><b>{html.escape(title)}</b></caption>" if title else ""
    thead = f"<thead><tr>{head}</tr></thead>" if head else ""
    return f"<table class='handlerkit'>{caption}{thead}<tbody>{body}</tbody></table>"


def format_bytes(n: float | None) -> str:
    """``n`` bytes in binary units: ``format_bytes(12_900_000)`` → ``"12.3 MiB"``; None → ``"n/a"``."""
    if n is None:
        return "n/a"
    sign = "-" if n < 0 else ""
    value = float(abs(n))
    if value < 1024:
        return f"{sign}{int(value)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{sign}{value:.1f} {unit}"


def _squash(word: str) -> str:
    return word.lower().replace("_", "").replace("-", "")


def did_you_mean(word: str, candidates: Iterable[str], *, cutoff: float = 0.75, prefix: bool = False) -> str | None:
    """The candidate ``word`` was most likely meant to be, or None.

    Case, ``_`` and ``-`` are ignored first (``batch_size`` → ``batchSize``); with ``prefix``, a
    unique candidate that starts with ``word`` wins (``aot`` → ``aot_compile``); otherwise the
    closest spelling above ``cutoff`` (difflib's ratio).
    """
    import difflib

    choices = sorted(set(candidates))
    norm = _squash(word)
    for candidate in choices:
        if _squash(candidate) == norm:
            return candidate
    if prefix and len(norm) >= 3:
        prefixed = [c for c in choices if _squash(c).startswith(norm)]
        if len(prefixed) == 1:
            return prefixed[0]
    lowered = {c.lower(): c for c in choices}
    match = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=cutoff)
    return lowered[match[0]] if match else None


def suggestion(word: str, candidates: Iterable[str], *, cutoff: float = 0.75, prefix: bool = False) -> str:
    """``" (did you mean 'x'?)"`` for the closest candidate (see :func:`did_you_mean`), or ``""``."""
    near = did_you_mean(word, candidates, cutoff=cutoff, prefix=prefix)
    return f" (did you mean {near!r}?)" if near else ""
