"""The Stepper's live panes: one per request of a streamed batch, updated as each chunk arrives.

While ``h.stream(batch)`` runs (the Stepper's stream button), every chunk the handler sends is
appended to its request's pane at once (an ipywidgets ``HTML`` whose value is set from the
chunk generator, so a browser sees it while the cell still runs); when ``handle`` returns, each
pane gets its final answer, or says the stream did not end well. The text of every pane is kept
(``texts``) so a test reads what a person sees without a browser.
"""

from __future__ import annotations

import html
from typing import Any

__all__ = ["LivePanes"]

_MUTED = "color:#777"
_BEFORE = "click stream to run h.stream(batch): each request's chunks appear here as the handler sends them"


class LivePanes:
    """A ``VBox`` (``widget``) of one ``HTML`` pane per request (``panes``), fed chunk by chunk.

    Args:
        widgets: the ipywidgets module (the Stepper's, imported once there).
    """

    def __init__(self, widgets: Any) -> None:
        self._w = widgets
        # Until the first stream, the pane says what will appear in it (it is a tab of its own).
        self.widget = widgets.VBox([widgets.HTML(f"<div style='{_MUTED}'>{html.escape(_BEFORE)}</div>")])
        self.panes: list[Any] = []
        self._parts: list[list[str]] = []  # per request: what its chunks said, in order
        self._first_ms: list[float | None] = []
        self._footer: list[str] = []  # per request: its final line (answer, or what went wrong)

    @property
    def texts(self) -> list[str]:
        """Each pane as plain text: the chunks so far, then its final line once there is one."""
        return [self._text(i) for i in range(len(self.panes))]

    def start(self, count: int) -> None:
        """Empty panes for a batch of ``count`` requests, each waiting for its first chunk."""
        self.panes = [self._w.HTML() for _ in range(count)]
        self._parts = [[] for _ in range(count)]
        self._first_ms = [None] * count
        self._footer = ["waiting for the first chunk…"] * count
        self.widget.children = tuple(self.panes)
        for index in range(count):
            self._update(index)

    def add(self, chunk: Any) -> None:
        """One :class:`~handlerkit.worker.streaming.Chunk`, shown in its request's pane now; a chunk
        for a request id the batch does not hold is left out (the run's problems name it)."""
        index = chunk.index
        if index is None or not 0 <= index < len(self.panes):
            return
        if self._first_ms[index] is None:
            self._first_ms[index] = chunk.time_ms
        self._parts[index].append(chunk.text)
        self._footer[index] = f"streaming… {len(self._parts[index])} chunk(s), the last at {chunk.time_ms:.1f} ms"
        self._update(index)

    def finish(self, run: Any) -> None:
        """The final state: each request's answer (``run.output[i]``) and when it came, or that
        its stream ended without one."""
        streams = {s.index: s for s in getattr(run, "streams", ())}
        output = run.output if isinstance(run.output, list) else None
        for index in range(len(self.panes)):
            stream = streams.get(index)
            if stream is not None and stream.final_ms is None:
                self._footer[index] = "no final answer ended this stream (see the run's problems)"
            elif output is not None and index < len(output):
                at = f" at {run.handle_ms:.1f} ms" if run.handle_ms is not None else ""
                self._footer[index] = f"final answer{at}: {output[index]!s}"
            else:
                self._footer[index] = "no answer for this request"
            self._update(index)

    def fail(self, exc: BaseException) -> None:
        """``handle`` raised: every pane keeps its chunks and says so."""
        message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        for index in range(len(self.panes)):
            self._footer[index] = f"failed: {message}"
            self._update(index)

    def _text(self, index: int) -> str:
        return f"request {index}: {''.join(self._parts[index])}\n{self._footer[index]}"

    def _update(self, index: int) -> None:
        first = self._first_ms[index]
        first_note = f" · first chunk at {first:.1f} ms" if first is not None else ""
        body = html.escape("".join(self._parts[index]))
        self.panes[index].value = (
            f"<div><b>request {index}</b><span style='{_MUTED}'>{first_note}</span>"
            f"<pre style='margin:2px 0;white-space:pre-wrap'>{body}</pre>"
            f"<span style='{_MUTED}'>{html.escape(self._footer[index])}</span></div>"
        )
