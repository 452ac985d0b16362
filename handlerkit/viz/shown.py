"""What ``hk.show`` returns when some of its picture is HTML (a token table, a streamed run's
chunk texts, ranked lists with their scores): the figure and the HTML parts together.

When every panel is a picture, ``hk.show`` returns the matplotlib ``Figure`` itself. When some
are HTML, it returns a :class:`Shown`: Jupyter displays the figure (a PNG, inline as a data
URI) followed by the HTML parts; ``.figure`` is the Figure (None when every panel is HTML), and
a Figure's attributes are read through (``shown.savefig(...)``, ``shown.axes``).
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass, field
from typing import Any

from handlerkit.viz.panel import Panel
from handlerkit.viz.registry import escape, iter_html

__all__ = ["Shown"]


@dataclass
class Shown:
    """A figure and HTML parts (tables), displayed one under the other in Jupyter."""

    figure: Any
    panels: list[Panel] = field(default_factory=list)  # the HTML panels, in order
    title: str | None = None

    @property
    def html(self) -> list[str]:
        """The HTML parts, each under its title."""
        return list(iter_html(self.panels))

    def __getattr__(self, name: str) -> Any:
        figure = self.__dict__.get("figure")
        if figure is None or name.startswith("_"):
            raise AttributeError(name)
        return getattr(figure, name)

    def _png(self) -> str:
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png", bbox_inches="tight")
        return base64.b64encode(buffer.getvalue()).decode("ascii")

    def _repr_html_(self) -> str:
        parts = [f"<b>{escape(self.title)}</b>"] if self.title and self.figure is None else []
        if self.figure is not None:
            parts.append(f"<img src='data:image/png;base64,{self._png()}' style='max-width:100%'/>")
        parts += self.html
        return "<div class='handlerkit-shown'>" + "".join(parts) + "</div>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        try:
            return {"text/html": self._repr_html_(), "text/plain": repr(self)}
        except Exception as exc:  # IPython swallows errors in reprs: say it, then raise
            import warnings

            from handlerkit.errors import HandlerkitWarning

            warnings.warn(
                f"handlerkit: the picture could not render itself: {type(exc).__name__}: {exc}",
                HandlerkitWarning,
                stacklevel=2,
            )
            raise

    def __repr__(self) -> str:
        figure = "a figure and " if self.figure is not None else ""
        titles = ", ".join(p.title for p in self.panels)
        return f"<Shown: {figure}{len(self.panels)} HTML part(s): {titles}>"
