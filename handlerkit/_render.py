"""The one rendering base every report and result uses.

A class that shows itself to a person subclasses :class:`Rendered` and supplies its content:
a one-line :meth:`~Rendered._summary` and one or more :class:`Table` s (plus optional notes).
The base turns that into:

- ``repr(x)``: one line, ``<StageResult preprocess ok 3.10 ms …>``, cheap enough for a list;
- ``str(x)``: the fixed-width tables, for terminals and ``print``;
- ``_repr_mimebundle_``: ``text/plain`` (the same tables) and ``text/html`` for Jupyter.

IPython swallows an exception raised inside a repr hook and shows a bare fallback instead, so
the hook warns first (a :class:`~handlerkit.errors.HandlerkitWarning` naming the class and the
error) and then re-raises.
"""

from __future__ import annotations

import html
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

from handlerkit._text import render_html, render_text
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
        parts = [self._summary()]
        parts += [render_text(t.headers, t.rows, t.title, t.wrap) for t in self._tables() if t.rows]
        text = "\n\n".join(parts)
        notes = self._notes()
        return text + "".join(f"\nnote: {n}" for n in notes)

    def _html(self) -> str:
        parts = [f"<p><b>{html.escape(self._summary())}</b></p>"]
        parts += [render_html(t.headers, t.rows, t.title) for t in self._tables() if t.rows]
        notes = self._notes()
        if notes:
            parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
        return "".join(parts)

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
