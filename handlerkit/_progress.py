"""Progress bars for long work (compiling, warm-up, timing, sweeps, reports).

``tqdm.auto`` draws a widget in Jupyter and text in a terminal. A bar is drawn only where a
person is watching: ``progress=True`` forces it, ``progress=False`` silences it, and the
default (``None``) asks :func:`wanted`: off when ``HANDLERKIT_PROGRESS`` is ``0``/``false``/
``off``, off under CI (``CI`` set), on in an IPython kernel, on when stderr is a terminal,
off otherwise (a pipe, a log file). The test suite sets ``HANDLERKIT_PROGRESS=0`` so that the
notebooks' stored outputs and the CI log stay free of bars.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

__all__ = ["Bar", "bar", "wanted"]

T = TypeVar("T")
_OFF = {"0", "false", "off", "no"}


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
            self._bar = _tqdm()(total=total, desc=desc, leave=False)

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


def _tqdm() -> Any:
    # tqdm.auto picks the notebook widget in a kernel, which needs ipywidgets; without it tqdm
    # would warn "IProgress not found" and draw nothing useful, so fall back to text there.
    if _in_kernel() and importlib.util.find_spec("ipywidgets") is not None:
        from tqdm.auto import tqdm
    else:
        from tqdm import tqdm
    return tqdm
