"""Cards: text where no picture fits (a value's summary and the sentence saying why it has no
picture) and a failed stage's error (its result's, or a StageError's) with its fix."""

from __future__ import annotations

from typing import Any

from handlerkit.errors import StageError
from handlerkit.recording.results import StageResult
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


def error_card(failed: StageResult | StageError) -> Panel:
    """A failed stage, by its result or by its StageError alone: the error's first line (stage,
    handler, request, exception) as the title, where it was raised and its fix below. The
    StageError alone also says where the input the stage failed on is kept (the harness keeps
    it; the error does not)."""
    error = failed.error if isinstance(failed, StageResult) else failed
    lines = str(error).splitlines() if error is not None else []
    if not lines:  # a result without its error: say what is known
        return card(f"{failed.stage} failed", [])
    if isinstance(failed, StageError) and failed.stage not in ("initialize", "reload"):
        lines.append(f"  its input: h.results[{failed.stage!r}].input; hk.show(h.last_run) draws the stages that ran")
    return card(lines[0], lines[1:])  # "preprocess failed in H for request 1: KeyError: ...", said once
