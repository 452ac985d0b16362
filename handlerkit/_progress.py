"""Progress bars for long work (compiling, warm-up, timing, sweeps, reports).

In a notebook a bar is an ipywidgets progress bar, shown under a display id so that closing it
replaces its output by an empty widget view: JupyterLab hides that, nbval skips it, and a saved
notebook keeps no bar (tqdm's notebook widget left its first text, ``0%| | 0/12``, frozen in
every notebook saved outside CI). In a terminal it is tqdm's text bar. A bar is drawn only where a
person is watching: ``progress=True`` forces it, ``progress=False`` silences it, and the
default (``None``) asks :func:`wanted`: off when ``HANDLERKIT_PROGRESS`` is ``0``/``false``/
``off``, off under CI (``CI`` set), on in an IPython kernel, on when stderr is a terminal,
off otherwise (a pipe, a log file). The test suite sets ``HANDLERKIT_PROGRESS=0`` so that the
notebooks' stored outputs and the CI log stay free of bars.
"""

from __future__ import annotations

import html
import importlib.util
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

__all__ = ["Bar", "bar", "wanted"]

T = TypeVar("T")
_OFF = {"0", "false", "off", "no"}
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
_REDRAW_S = 0.1  # a notebook bar's least time between redraws (each is a message to the browser)


def _in_kernel() -> bool:
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    try:
        ip = shell.get_ipython()
    except Exception:
        return False
    return ip is not None and "IPKernelApp" in getattr(ip, "config", {})


def wanted(progress: bool | None = None) -> bool:
    """Whether to draw a bar: the explicit choice, else the environment decides (see module doc)."""
    if progress is not None:
        return bool(progress)
    setting = os.environ.get("HANDLERKIT_PROGRESS")
    if setting is not None:
        return setting.strip().lower() not in _OFF
    if os.environ.get("CI"):
        return False
    if _in_kernel():
        return True
    stream = sys.stderr
    return stream is not None and hasattr(stream, "isatty") and stream.isatty()


class Bar:
    """A tqdm bar, or nothing: ``update``/``set_description``/``close`` are no-ops when off."""

    def __init__(self, total: int | None, desc: str, progress: bool | None = None) -> None:
        self._bar: Any = None
        if wanted(progress):
            widgets = _in_kernel() and importlib.util.find_spec("ipywidgets") is not None
            self._bar = _WidgetBar(total, desc) if widgets else _tqdm()(total=total, desc=desc, leave=False)

    def update(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def set_description(self, desc: str) -> None:
        if self._bar is not None:
            self._bar.set_description(desc, refresh=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def bar(iterable: Iterable[T], desc: str, total: int | None = None, progress: bool | None = None) -> Iterator[T]:
    """Iterate ``iterable`` with a bar (when :func:`wanted`); closed when the loop ends or breaks."""
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    with Bar(total, desc, progress) as shown:
        for item in iterable:
            yield item
            shown.update()


class _WidgetBar:
    """A bar in a notebook: a label (``timing H: 7/12``) and an ``IntProgress``, redrawn at most
    every :data:`_REDRAW_S` and at the end; closing it empties its output (see the module doc).
    ``n``, ``total``, ``update``, ``set_description`` and ``close`` are tqdm's."""

    def __init__(self, total: int | None, desc: str) -> None:
        import ipywidgets as w
        from IPython.display import display

        self.n, self.total, self.desc = 0, total, desc
        self._progress = w.IntProgress(value=0, min=0, max=max(total or 0, 1), layout=w.Layout(width="240px"))
        self._progress.layout.display = None if total else "none"  # no total: the count alone
        self._label = w.HTML()
        self._box = w.HBox([self._label, self._progress])
        self._drawn_at = 0.0
        self._draw()
        self._handle = display(self._box, display_id=True)

    @property
    def text(self) -> str:
        """What the label says: ``desc: n/total`` (``desc: n`` without a total)."""
        return f"{self.desc}: {self.n}/{self.total}" if self.total else f"{self.desc}: {self.n}"

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.n == self.total or time.monotonic() - self._drawn_at >= _REDRAW_S:
            self._draw()

    def set_description(self, desc: str, refresh: bool = True) -> None:
        self.desc = desc
        if refresh:
            self._draw()

    def _draw(self) -> None:
        self._drawn_at = time.monotonic()
        self._label.value = f"<span style='font-family:monospace'>{html.escape(self.text)}</span>"
        self._progress.value = min(self.n, self._progress.max)

    def close(self) -> None:
        # Not the widget alone: its output would keep the text it was displayed with.
        self._handle.update({WIDGET_VIEW: {"version_major": 2, "version_minor": 0, "model_id": ""}}, raw=True)
        for widget in (self._label, self._progress, self._box):
            widget.close()


def _tqdm() -> Any:
    from tqdm import tqdm  # the text bar (tqdm.auto's notebook widget left frozen text behind)

    return tqdm
