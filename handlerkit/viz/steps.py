"""A sequence's steps: requests × steps, each cell what became of the request in that worker call.

:class:`~handlerkit.sequences.Sequences` keeps one :class:`~handlerkit.sequences.Step` per worker
call; this panel draws them as a grid, a row per request (in the order they first ran) and a
column per step: ``joined`` (sent for the first time, it stays), ``running`` (called again: its
answer said ``ts_stream_next: true``), ``finished`` (it left), ``cancelled`` (its sequence's
cancel request ended it) or ``failed`` (the batch failed). A request that joined and finished in
one step is drawn ``finished``: its row starts there. At most ``MAX_ROWS`` requests and the last
``MAX_STEPS`` steps are drawn; what is left out is noted.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from handlerkit.sequences import Sequences, Step
from handlerkit.viz.panel import Panel

__all__ = ["MAX_ROWS", "MAX_STEPS", "STATES", "steps_panel"]

MAX_ROWS = 24  # requests drawn, a row each
MAX_STEPS = 120  # the last steps drawn, a column each
#: The cell states, in the legend's order (``Step.state_of``).
STATES = ("joined", "running", "finished", "cancelled", "failed")


def steps_panel(steps: Sequences | Iterable[Step]) -> Panel:
    """The grid of ``steps`` (a :class:`Sequences`, or its steps, e.g. ``seqs.run()``'s)."""
    taken = list(steps.steps if isinstance(steps, Sequences) else steps)
    notes: list[str] = []
    shown = taken[-MAX_STEPS:]
    if len(shown) < len(taken):
        notes.append(f"the last {len(shown)} of {len(taken)} steps")
    order: dict[str, str] = {}  # request id -> its sequence, in the order they first ran
    for step in shown:
        for rid, seq in zip(step.request_ids, step.sequence_ids, strict=True):
            order.setdefault(rid, seq)
    if len(order) > MAX_ROWS:
        notes.insert(0, f"first {MAX_ROWS} of {len(order)} requests")
    rows = list(order)[:MAX_ROWS]
    place = {rid: y for y, rid in enumerate(rows)}
    cells: dict[str, list[tuple[int, int]]] = {state: [] for state in STATES}
    for step in shown:
        for rid in step.request_ids:
            if rid in place:
                cells[step.state_of(rid)].append((step.index, place[rid]))
    ended = [(step.index, seq) for step in shown for seq in step.ended]
    notes += [f"step {index} ended sequence {seq}" for index, seq in ended[:4]]
    labels = [f"{rid[:8]} ({_short_id(order[rid])})" for rid in rows]
    counts = ", ".join(f"{len(cells[s])} {s}" for s in STATES if cells[s])
    title = f"{len(taken)} step(s), {len(order)} request(s): {counts}" if taken else "no step has run yet"
    first = shown[0].index if shown else 0
    last = shown[-1].index if shown else 0
    data: dict[str, Any] = {"labels": labels, "cells": cells, "steps": (first, last), "xlabel": "step"}
    return Panel("steps", title, data, notes, size=(min(4.0 + 0.08 * len(shown), 12.0), 1.2 + 0.3 * len(rows)))


def _short_id(sequence_id: str) -> str:
    """A sequence id short enough for a row label (the frontend's ``ts-seq-<uuid4>`` cut)."""
    return sequence_id[:15] if sequence_id.startswith("ts-seq-") else sequence_id[:20]
