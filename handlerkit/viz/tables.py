"""Tables: JSON-like values, what a handler's postprocess hands the client (a list of dicts,
strings, a ragged list), as rows and columns of short cell texts.

A list is one row per item; a dict or a string alone is one row. Rows of dicts take their keys
as columns (in order of first appearance), rows of lists their positions, anything else one
``value`` column. Cells are strings as they are and other values as compact JSON, cut to fit;
the notes say what was left out.
"""

from __future__ import annotations

from typing import Any

from handlerkit.viz.panel import Panel

__all__ = ["MAX_COLUMNS", "MAX_RECORDS", "MAX_ROWS", "cell_text", "json_table_panel", "records_panel", "table_html"]

MAX_ROWS, MAX_COLUMNS = 12, 6
MAX_RECORDS = 200  # rows of an HTML table of records
_KEPT = ("error", "fix")  # a failed request's keys: never the ones left out
LINE = 72  # characters in a row, shared by its cells
_DEPTH = 3  # levels of a nested cell value spelled out


def json_table_panel(value: Any, title: str) -> Panel:
    """A table of `value`: a list (one row per item), a dict or a string (one row)."""
    items = value if isinstance(value, (list, tuple)) else [value]
    rows = list(items[:MAX_ROWS])
    columns: list[Any]
    if rows and all(isinstance(r, dict) for r in rows):
        keys: dict[Any, None] = {}
        for r in rows:
            keys.update(dict.fromkeys(r))
        kept = [k for k in keys if k in _KEPT]
        columns = [k for k in keys if k not in _KEPT][: MAX_COLUMNS - len(kept)]
        columns = [k for k in keys if k in columns or k in kept]  # in order of first appearance
        count, what = len(keys), "keys"
        names = [str(k) for k in columns]
    elif rows and all(isinstance(r, (list, tuple)) for r in rows):
        count = max(len(r) for r in rows)
        columns, what = list(range(min(count, MAX_COLUMNS))), "positions"
        names = [f"[{i}]" for i in columns]
    else:
        columns, count, what, names = [None], 1, "", ["value"]
    width = max(8, LINE // len(columns))
    cells, cut = [], False
    for r in rows:
        row = []
        for c in columns:
            present = c is None or (c in r if isinstance(r, dict) else c < len(r))
            text = cell_text(r if c is None else r[c], width) if present else ""
            cut = cut or text.endswith("…")
            row.append(text)
        cells.append(row)
    notes = [
        n
        for n in (
            f"first {len(rows)} of {len(items)} rows" if len(rows) < len(items) else "",
            f"first {len(columns)} of {count} {what}" if len(columns) < count else "",
            f"cells cut at {width} characters" if cut else "",
        )
        if n
    ]
    return Panel(
        "table",
        title,
        {"cells": cells, "rows": [f"[{i}]" for i in range(len(cells))], "columns": names},
        notes,
        size=(6.4, 1.1 + 0.3 * len(cells)),
    )


def records_panel(lists: list[Any], title: str) -> Panel:
    """Per request, a (ragged) list of flat records (a ranker's ``[{"item_id": 3, "score":
    0.41}, ...]``) as an HTML table, a row per record: its request, its rank, then its keys,
    every value whole (the first ``MAX_RECORDS`` rows)."""
    from handlerkit._text import render_html
    from handlerkit.viz.registry import html_panel

    keys: dict[Any, None] = {}
    for records in lists:
        for r in records:
            keys.update(dict.fromkeys(r))
    rows = [
        [f"[{i}]", rank, *(r.get(k) for k in keys)] for i, records in enumerate(lists) for rank, r in enumerate(records)
    ]
    total = len(rows)
    body = render_html(["request", "#", *map(str, keys)], rows[:MAX_RECORDS])
    panel = html_panel(title, body)
    panel.notes = [f"lengths {[len(v) for v in lists]}"]
    if total > MAX_RECORDS:
        panel.notes.append(f"first {MAX_RECORDS} of {total} rows")
    return panel


def table_html(panel: Panel) -> Panel:
    """A table panel as HTML (its rows labelled), any other panel as it is."""
    from handlerkit._text import render_html
    from handlerkit.viz.registry import html_panel

    if panel.kind != "table":
        return panel
    data = panel.data
    rows = [[label, *cells] for label, cells in zip(data["rows"], data["cells"])]
    html = html_panel(panel.title, render_html(["", *data.get("columns", [])], rows))
    html.notes = list(panel.notes)
    return html


def cell_text(value: Any, width: int) -> str:
    """`value` in one line of at most `width` characters: a string as it is, anything else as
    compact JSON (nested values three levels deep)."""
    text = value if isinstance(value, str) else _compact(value, _DEPTH, width)
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "…"


def _compact(value: Any, depth: int, width: int) -> str:
    """Compact JSON of `value`, bounded: at most `width` items per container, `depth` levels."""
    import json

    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        if depth == 0:
            return "{…}" if value else "{}"
        inner = [
            f"{_compact(str(k), 0, width)}: {_compact(v, depth - 1, width)}" for k, v in list(value.items())[:width]
        ]
        return "{" + ", ".join(inner) + (", …" if len(value) > width else "") + "}"
    if isinstance(value, (list, tuple)):
        if depth == 0:
            return "[…]" if value else "[]"
        inner = [_compact(v, depth - 1, width) for v in value[:width]]
        return "[" + ", ".join(inner) + (", …" if len(value) > width else "") + "]"
    return type(value).__name__
