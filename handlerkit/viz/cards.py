"""Cards: text where no picture fits (a value's summary and the sentence saying why it has no
picture) and a failed stage's error with its fix."""

from __future__ import annotations

from typing import Any

from handlerkit.results import StageResult
from handlerkit.summaries import summary
from handlerkit.viz.panel import Panel

__all__ = ["card", "error_card", "summary_card"]

MAX_LINES = 24


def card(title: str, lines: list[str]) -> Panel:
    """A panel of text lines (the first ``MAX_LINES``), sized to them."""
    lines = lines[:MAX_LINES]
    return Panel("card", title, {"lines": lines}, size=(6.4, 0.5 + 0.17 * (len(lines) + 2)))


def summary_card(title: str, value: Any, why: str) -> Panel:
    """`value`'s summary (``hk.summary``) and ``No picture: <why>.`` as its last line."""
    lines = summary(value).splitlines()[: MAX_LINES - 1]
    return card(title, [*lines, f"No picture: {why}."])


def error_card(result: StageResult) -> Panel:
    """A failed stage: the error's first line (stage, handler, request, exception) as the title,
    where it was raised and its fix below."""
    lines = str(result.error).splitlines() if result.error is not None else []
    if not lines:  # a result without its error: say what is known
        return card(f"{result.stage} failed", [])
    return card(lines[0], lines[1:])  # "preprocess failed in H for request 1: KeyError: ...", said once
