"""A streamed run's chunk timeline: requests × time, a mark per chunk, the final answer marked,
and each request's time to first chunk as a bar from ``handle``'s call to its first chunk.

A streaming handler's run (:class:`~handlerkit.recording.results.Run` with ``chunks``) keeps each chunk's
time in ms since ``handle`` was called (:mod:`handlerkit.worker.streaming`); this panel draws them a row
per request of the batch, at most ``MAX_ROWS`` rows and ``MAX_MARKS`` marks a row (evenly
picked beyond that, the first and the last kept). A request that got no chunk has its final
answer alone; chunks for request ids the batch does not hold, and frames with an error code,
are counted in the notes (the run's problems say what is wrong with them).
"""

from __future__ import annotations

from typing import Any

from handlerkit.recording.results import Run
from handlerkit.viz.panel import Panel

__all__ = ["MAX_MARKS", "MAX_ROWS", "chunk_panels", "chunk_text_panel", "short_id", "timeline_panel"]

MAX_ROWS = 16  # requests drawn, a row each
MAX_MARKS = 2048  # chunk marks drawn per request


def chunk_panels(run: Run) -> list[Panel]:
    """A streamed run's timeline, then its chunks' texts (an HTML table)."""
    return [timeline_panel(run), chunk_text_panel(run)]


def short_id(request_id: str) -> str:
    """A request id short enough for a row label: a UUID's first 8 characters."""
    return request_id if len(request_id) <= 12 else request_id[:8] + "…"


def chunk_text_panel(run: Run) -> Panel:
    """A row per request: its chunks' payloads as text, in order, and its final answer (as
    the client reads them), every character there (the first ``MAX_ROWS`` requests)."""
    from handlerkit._text import render_html
    from handlerkit.viz.registry import html_panel

    streams = {s.index: s for s in run.streams}
    answers = run.output if isinstance(run.output, list) else []
    rows: list[tuple[str, int, list[str], str]] = []
    for index in range(min(max(run.batch_size, max(streams, default=-1) + 1), MAX_ROWS)):
        stream = streams.get(index)
        chunks = [c for c in stream.chunks if c.frame_code == 200] if stream is not None else []
        final = answers[index] if index < len(answers) else None
        label = f"{index} ({short_id(stream.request_id)})" if stream is not None else str(index)
        rows.append((label, len(chunks), [_text(c.body) for c in chunks], _text(final) if final is not None else ""))
    by_character = all(len(t) <= 1 for row in rows for t in row[2])  # a character a chunk: read as one text
    between = "" if by_character else " · "
    texts = "chunk texts, in order (a character each)" if by_character else "chunk texts, in order (· between chunks)"
    body = render_html(
        ["request", "chunks", texts, "final answer"], [(a, n, between.join(t), f) for a, n, t, f in rows]
    )
    return html_panel(f"chunk texts: {len(run.chunks)} chunks", body)


def _text(body: Any) -> str:
    if isinstance(body, (bytes, bytearray)):
        try:
            return bytes(body).decode("utf-8")
        except UnicodeDecodeError:
            return f"<{len(body)} bytes>"
    return str(body)


def timeline_panel(run: Run) -> Panel:
    """The chunk timeline of a streamed ``run`` (one that kept ``run.chunks``)."""
    streams = {s.index: s for s in run.streams}
    count = max(run.batch_size, max(streams, default=-1) + 1)
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for index in range(min(count, MAX_ROWS)):
        stream = streams.get(index)
        if stream is None:  # no chunk: its answer came with handle's return
            rows.append({"label": f"request {index}", "chunks": [], "first_ms": None, "final_ms": run.handle_ms})
            continue
        times = _bounded([c.time_ms for c in stream.chunks])
        rows.append(
            {
                "label": f"request {index} ({short_id(stream.request_id)})",
                "chunks": times,
                "first_ms": stream.first_chunk_ms,
                "final_ms": stream.final_ms,
            }
        )
        if len(times) < len(stream.chunks):
            notes.append(f"request {index}: {len(times)} of its {len(stream.chunks)} chunks marked")
        if stream.final_ms is None:
            notes.append(f"request {index}: no final answer ended its stream")
    if count > MAX_ROWS:
        notes.insert(0, f"first {MAX_ROWS} of {count} requests")
    strays = sum(1 for c in run.chunks if c.index is None)
    if strays:
        notes.append(f"{strays} chunk(s) for request ids not in the batch, not drawn")
    failed = sum(1 for c in run.chunks if c.index is not None and c.frame_code != 200)
    if failed:
        notes.append(f"{failed} chunk(s) in frames with an error code, not drawn")
    firsts = [f"{s.first_chunk_ms:.1f} ms" for s in run.streams[:MAX_ROWS]]
    if firsts and len(set(firsts)) == 1:  # one batch, one first frame: said once
        notes.insert(0, f"time to first chunk {firsts[0]}" + (" (every request)" if len(firsts) > 1 else ""))
    elif firsts:
        notes.insert(0, "time to first chunk " + ", ".join(f"{s.index}: {t}" for s, t in zip(run.streams, firsts)))
    shown: set[str] = set()
    for row in rows:  # a bar's value written once, where it first appears
        text = f"{row['first_ms']:.1f} ms" if row["first_ms"] is not None else None
        row["first_text"] = text is not None and text not in shown and len(set(firsts)) > 1
        shown.add(text or "")
    title = f"chunks: {len(run.chunks)} sent to {len(run.streams)} of {run.batch_size} request(s)"
    end = run.handle_ms if run.handle_ms is not None else max((c.time_ms for c in run.chunks), default=0.0)
    data = {"rows": rows, "end_ms": end, "xlabel": "ms since handle was called"}
    return Panel("timeline", title, data, notes, size=(6.4, 1.2 + 0.35 * len(rows)))


def _bounded(times: list[float]) -> list[float]:
    """At most ``MAX_MARKS`` of ``times``, evenly picked, the first and the last kept."""
    if len(times) <= MAX_MARKS:
        return times
    last = len(times) - 1
    return [times[round(i * last / (MAX_MARKS - 1))] for i in range(MAX_MARKS)]
