"""The one rendering base every report and result uses.

A class that shows itself to a person subclasses :class:`Rendered` and supplies its content:
a one-line :meth:`~Rendered._summary` and one or more :class:`Table` s (plus optional notes).
The base turns that into:

- ``repr(x)``: one line, ``<StageResult preprocess ok 3.10 ms …>``, cheap enough for a list;
- ``str(x)``: the fixed-width tables, no line wider than 100 columns, for terminals and ``print``;
- ``_repr_mimebundle_``: ``text/plain`` (the same tables) and ``text/html`` for Jupyter: the
  tables in one container with handlerkit's small stylesheet (``_text.STYLE``), prose
  left-aligned, numbers right-aligned.

IPython swallows an exception raised inside a repr hook and shows a bare fallback instead, so
the hook warns first (a :class:`~handlerkit.errors.HandlerkitWarning` naming the class and the
error) and then re-raises.
"""

from __future__ import annotations

import html
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

from handlerkit._text import WIDTH, html_block, render_html, render_text, wrap_text
from handlerkit.errors import HandlerkitWarning

__all__ = ["Rendered", "Table"]


class Table(NamedTuple):
    """One table of a report. Empty ``headers`` (all ``""``) make a key/value table."""

    headers: Sequence[str]
    rows: Sequence[Sequence[Any]]
    title: str = ""
    wrap: int | None = None  # plain text: wrap text cells wider than this (HTML wraps itself)


class Rendered:
    """Base of every report and result; subclasses override :meth:`_summary` and :meth:`_tables`."""

    __slots__ = ()

    def _summary(self) -> str:
        """One line saying what this is and how it went."""
        raise NotImplementedError

    def _tables(self) -> list[Table]:
        """The tables, in display order."""
        raise NotImplementedError

    def _notes(self) -> list[str]:
        """Sentences shown after the tables."""
        return []

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._summary()}>"

    def __str__(self) -> str:
        parts = [wrap_text(self._summary(), WIDTH, "  ")]
        parts += [render_text(t.headers, t.rows, t.title, t.wrap) for t in self._tables() if t.rows]
        text = "\n\n".join(parts)
        notes = self._notes()
        return text + "".join("\n" + wrap_text(f"note: {n}", WIDTH, "      ") for n in notes)

    def _html(self) -> str:
        """The HTML view: the summary, the tables and the notes in one styled container."""
        parts = [f"<p class='hk-summary'><b>{html.escape(self._summary())}</b></p>"]
        parts += [render_html(t.headers, t.rows, t.title, style=False) for t in self._tables() if t.rows]
        notes = self._notes()
        if notes:
            parts.append("<ul class='hk-notes'>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
        return html_block("".join(parts))

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        try:
            return {"text/plain": str(self), "text/html": self._html()}
        except Exception as exc:
            warnings.warn(
                f"handlerkit: {type(self).__name__} could not render itself: {type(exc).__name__}: {exc}",
                HandlerkitWarning,
                stacklevel=2,
            )
            raise
