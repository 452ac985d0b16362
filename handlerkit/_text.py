"""Text helpers every module shares: tables (plain and HTML), numbers, byte sizes, "did you mean"."""

from __future__ import annotations

import html
import math
import textwrap
from collections.abc import Iterable, Sequence
from typing import Any

#: How wide a report's text may be: a terminal, and ``print`` in a notebook, without wrapping.
WIDTH = 100

# One small stylesheet, scoped to handlerkit's own markup, shipped once with every HTML output.
# JupyterLab right-aligns every cell of rendered HTML with
# ``:not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon td`` (specificity 0,2,1); our cell rules name
# the table's class and the cell's (0,2,2 or more), so they win without !important. A notebook
# opened untrusted has its <style> blocks stripped by JupyterLab's sanitizer, which keeps inline
# ``style`` attributes: so cells also carry their alignment inline (see _td).
STYLE = (
    "<style>"
    "div.handlerkit{max-width:100%;overflow-x:auto}"
    "div.handlerkit table.handlerkit{max-width:100%;table-layout:auto;margin:0 0 0.6em 0;"
    "border-collapse:collapse}"
    "div.handlerkit table.handlerkit caption{text-align:left;caption-side:top;padding:0.2em 0}"
    "table.handlerkit td.hk-text,table.handlerkit th.hk-text{text-align:left;vertical-align:top}"
    # break-all is only the untrusted view's fallback (see _td): with this sheet, words break
    # only where they must (!important: the one way a sheet overrides an inline style)
    "table.handlerkit td.hk-text{overflow-wrap:anywhere;word-break:normal!important;white-space:pre-wrap}"
    "table.handlerkit td.hk-num,table.handlerkit th.hk-num{text-align:right;vertical-align:top;"
    "font-variant-numeric:tabular-nums}"
    "table.handlerkit td.hk-num{white-space:nowrap}"
    "table.handlerkit th{white-space:normal;overflow-wrap:normal}"
    "table.handlerkit td.hk-key{font-weight:600;white-space:nowrap}"
    "div.handlerkit p.hk-summary{margin:0.2em 0 0.4em 0;overflow-wrap:anywhere}"
    "div.handlerkit ul.hk-notes{margin:0.2em 0;padding-left:1.4em}"
    "</style>"
)


def format_number(value: float) -> str:
    """A number as a person reads it: 3 significant digits, whole numbers kept whole.

    ``100.0`` → ``"100"``, ``61890.9`` → ``"61891"``, ``45.192`` → ``"45.2"``, ``3.104`` → ``"3.10"``,
    ``0.012345`` → ``"0.0123"``; ints are printed as they are.
    """
    if isinstance(value, int):
        return str(value)
    if math.isnan(value) or math.isinf(value):
        return str(value)
    rounded = abs(float(f"{value:.3g}"))
    if rounded == 0:
        return "0"
    if rounded < 1e-3:
        return f"{value:.2e}"
    decimals = max(0, 2 - math.floor(math.log10(rounded)))
    return f"{value:.{decimals}f}"


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return format_number(value)
    return str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def numeric_columns(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[bool]:
    """Which columns hold numbers only (empty cells aside): those are right-aligned."""
    return [
        all(_is_number(row[i]) for row in rows if row[i] is not None and row[i] != "")
        and any(_is_number(row[i]) for row in rows)
        for i in range(len(headers))
    ]


def render_text(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str = "", wrap: int | None = None, width: int = WIDTH
) -> str:
    """A fixed-width table: numbers right-aligned, text left-aligned, no line wider than ``width``.

    Text cells wrap at word boundaries onto continuation lines of their row when the table
    would be wider than ``width`` (the widest text columns give way first), and at ``wrap``
    characters when that is given; a cell's own line breaks are kept. Numbers never wrap.
    """
    numeric = numeric_columns(headers, rows)
    cells = [[_cell(v) for v in row] for row in rows]
    natural = [max([len(h)] + [len(p) for row in cells for p in row[i].split("\n")]) for i, h in enumerate(headers)]
    caps = [w if num or wrap is None else min(w, max(wrap, len(h))) for w, num, h in zip(natural, numeric, headers)]
    budget = width - 2 * (len(headers) - 1)
    texts = [i for i, num in enumerate(numeric) if not num]
    # A column gives way down to its longest word (an id, a path), so words stay whole where they can.
    floors = [
        min(_LONGEST_WORD, max([_NARROWEST] + [len(w) for row in cells for w in row[i].split()]))
        for i in range(len(headers))
    ]
    while sum(caps) > budget and texts:
        shrinkable = [i for i in texts if caps[i] > floors[i]]
        if not shrinkable:
            break
        caps[max(shrinkable, key=lambda i: caps[i] - floors[i])] -= 1
    if sum(caps) > budget and any(headers):
        # Too many columns for the width: words would be cut to nothing. Each row becomes a
        # block of "header  value" lines instead, the way a terminal reads a wide record.
        return _records(headers, cells, title, width)
    wrapped = [[_wrapped(text, num, cap) for text, num, cap in zip(row, numeric, caps)] for row in cells]
    head = [_wrapped(h, False, cap) for h, cap in zip(headers, caps)]
    widths = [max([len(part) for part in lines] + [0]) for lines in head]
    for row in wrapped:
        for i, lines in enumerate(row):
            widths[i] = max(widths[i], *(len(part) for part in lines))

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return "  ".join(parts).rstrip()

    def lines_of(row: Sequence[list[str]]) -> list[str]:
        depth = max((len(lines) for lines in row), default=1)
        return [line([lines[k] if k < len(lines) else "" for lines in row]) for k in range(depth)]

    out = textwrap.wrap(title, width) if title else []
    if any(headers):  # a key/value table (all headers empty) has no header row
        out += lines_of(head)
        out.append("  ".join("-" * w for w in widths))
    for row in wrapped:
        out += lines_of(row)
    return "\n".join(out)


_NARROWEST = 16  # a text column narrower than this cuts words of paths and guards into shreds
_LONGEST_WORD = 48  # a word longer than this (a long path) may be cut to fit


def _records(headers: Sequence[str], cells: Sequence[Sequence[str]], title: str, width: int) -> str:
    """A table too wide for ``width`` as one block of ``header  value`` lines per row (empty
    values left out), blocks apart by a blank line."""
    key = max(len(h) for h in headers)
    out = textwrap.wrap(title, width) if title else []
    for n, row in enumerate(cells):
        if n:
            out.append("")
        for h, value in zip(headers, row):
            if value == "":
                continue
            lines = _wrapped(value, False, max(_NARROWEST, width - key - 2))
            out.append(f"{h.ljust(key)}  {lines[0]}".rstrip())
            out += [f"{'':{key}}  {more}".rstrip() for more in lines[1:]]
    return "\n".join(out)


def _wrapped(text: str, numeric: bool, width: int) -> list[str]:
    """A cell's lines: its own line breaks kept, each line wrapped at word boundaries to
    ``width`` (a word longer than that is cut). Numbers never wrap."""
    if numeric or (len(text) <= width and "\n" not in text):
        return [text]
    lines: list[str] = []
    for part in text.split("\n"):
        lines.extend(textwrap.wrap(part, width, break_on_hyphens=False, replace_whitespace=False) or [""])
    return lines


def wrap_text(text: str, width: int = WIDTH, indent: str = "") -> str:
    """A paragraph (or several, one per line) wrapped to ``width``; continuation lines indented."""
    out = []
    for part in text.split("\n"):
        out += textwrap.wrap(part, width, subsequent_indent=indent, break_on_hyphens=False) or [""]
    return "\n".join(out)


_SHORT = 20  # a text cell this short stays on one line: "severity", "recompiles", "GB0124"


def _td(text: str, numeric: bool, tag: str = "td") -> str:
    kind = "hk-num" if numeric else "hk-text"
    body = html.escape(text).replace("\n", "<br>")
    # Long text may break anywhere (paths, guards, URLs), so a table fits the output area; a
    # short cell must not, or the browser shrinks its column to one letter ("sev/erit/y").
    if tag == "th":  # a header wraps between its words only: "first call ms" over a narrow column
        style = "text-align:right" if numeric else "text-align:left"
    elif numeric:
        style = "text-align:right;white-space:nowrap"
    elif len(text) <= _SHORT:
        style = "text-align:left;white-space:nowrap"
    elif any(len(word) > _SHORT for word in text.split()):
        # a path, a URL, a guard: JupyterLab's sanitizer keeps word-break (not overflow-wrap:
        # anywhere) in an untrusted notebook, so the break is said inline too
        style = "text-align:left;word-break:break-all"
    else:
        style = "text-align:left"
    return f"<{tag} class='{kind}' style='{style}'>{body}</{tag}>"


def html_block(inner: str) -> str:
    """``inner`` markup inside handlerkit's scoped container, with the stylesheet (once per output)."""
    return f"<div class='handlerkit'>{STYLE}{inner}</div>"


def html_table(body_rows: Iterable[str], title: str = "", head: str = "") -> str:
    """A ``<table class='handlerkit'>`` of ready-made ``<tr>`` rows (escaped by the caller)."""
    caption = f"<caption style='text-align:left'><b>{html.escape(title)}</b></caption>" if title else ""
    thead = f"<thead><tr>{head}</tr></thead>" if head else ""
    return f"<table class='handlerkit'>{caption}{thead}<tbody>{''.join(body_rows)}</tbody></table>"


def html_row(cells: Sequence[Any], numeric: Sequence[bool] | None = None) -> str:
    """One ``<tr>``: each cell escaped and marked text (left) or number (right)."""
    numeric = numeric if numeric is not None else [_is_number(v) for v in cells]
    return "<tr>" + "".join(_td(_cell(v), num) for v, num in zip(cells, numeric)) + "</tr>"


def render_html(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str = "", *, style: bool = True) -> str:
    """The same table as HTML for Jupyter (escaped; no scripts, no external CSS): text cells
    marked ``hk-text`` and left-aligned, number cells ``hk-num``, right-aligned with tabular
    digits. With ``style`` (the default) it comes in its container with the stylesheet; a report
    of several tables passes ``style=False`` and adds :func:`html_block` once."""
    numeric = numeric_columns(headers, rows)
    head = "".join(_td(h, num, "th") for h, num in zip(headers, numeric)) if any(headers) else ""
    markup = html_table((html_row(row, numeric) for row in rows), title, head)
    return html_block(markup) if style else markup


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
