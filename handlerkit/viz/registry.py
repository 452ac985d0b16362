"""The chain of pictures: how ``hk.show`` chooses, and how a user adds a picture of their own.

A picture is a function tried in order; each may decline by returning None, and the first
that answers draws the value (treescope's handler chain and ``__treescope_repr__`` work so).
Three kinds of entry, tried in this order:

1. **yours**, most recent first: ``hk.show.register(type_or_predicate, draw)``;
2. **your type's own**: a ``__handlerkit_show__(self, ctx)`` method on the value's class;
3. **the built-ins** (``dispatch.VALUES``, then ``dispatch.TENSORS`` for a tensor), from most
   to least specific; the table in ``dispatch``'s docstring lists them.

A user's ``draw(value, ctx)`` (and ``__handlerkit_show__(ctx)``) returns one of:

- None: decline (the next picture in the chain is tried);
- a :class:`~handlerkit.viz.panel.Panel`, or a list of them;
- a function of a matplotlib ``Axes`` (``lambda ax: ax.plot(xs)``): drawn in a panel of its own;
- a matplotlib ``Figure``: drawn into a panel as an image;
- HTML: a ``str`` or an object with ``_repr_html_`` (``hk.show`` then returns a ``Shown``);
- ``ctx.draw(other)``: the built-in pictures of another value (a field of yours, say).

``ctx`` is a :class:`~handlerkit.viz.panel.Context`: ``ctx.label`` names the value (``"preprocess
output['mask']"``), ``ctx.view`` holds the handler's labels and vocabulary, ``ctx.image`` the
input image, ``ctx.stage`` the stage.

``register`` returns a :class:`Registration`: ``.remove()`` it, or use it in a ``with`` block
so the picture holds only inside (tests do, so no registration leaks).

A built-in picture has the same shape as the panel modules' functions:
``(x: Tensor, ctx, title) -> Panel | None`` in ``TENSORS`` and ``(value, ctx, label) ->
list[Panel] | None`` in ``VALUES``; ``Chain.add(draw, before="name")`` places a new one.
"""

from __future__ import annotations

import html as html_module
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from handlerkit.errors import HandlerkitError
from handlerkit.viz.panel import Context, Panel

__all__ = ["Chain", "Entry", "Registration", "as_panels", "register", "registered", "unregister", "user_panels"]


@dataclass
class Entry:
    """One picture of a chain: its name (for ``before=``, errors and tests) and its function."""

    name: str
    draw: Callable[..., Any]


class Chain:
    """Pictures tried in order, each free to decline (return None); the first answer wins."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.entries: list[Entry] = []

    def add(self, draw: Callable[..., Any], *, name: str | None = None, before: str | None = None) -> Entry:
        """Add `draw` under `name` (default: its ``__name__``), last or just before `before`.

        Raises:
            ValueError: `name` is taken, or `before` names no entry (the names are listed).
        """
        name = name if name is not None else str(getattr(draw, "__name__", repr(draw)))
        if name in self.names():
            raise ValueError(f"{self.what}: a picture named {name!r} is already in the chain")
        entry = Entry(name, draw)
        if before is None:
            self.entries.append(entry)
        else:
            self.entries.insert(self._index(before), entry)
        return entry

    def remove(self, name: str) -> None:
        """Take the picture `name` out of the chain."""
        del self.entries[self._index(name)]

    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def first(self, *args: Any) -> Any:
        """The first answer that is not None, of the entries called with `args`, or None."""
        for entry in self.entries:
            out = entry.draw(*args)
            if out is not None:
                return out
        return None

    def _index(self, name: str) -> int:
        for i, entry in enumerate(self.entries):
            if entry.name == name:
                return i
        raise ValueError(f"{self.what}: no picture named {name!r}; the chain is {self.names()}")


# ---------------------------------------------------------------------------------------------
# The user's pictures
# ---------------------------------------------------------------------------------------------


@dataclass(eq=False)
class Registration:
    """A picture registered with ``hk.show.register``; ``remove()`` it, or use it in ``with``."""

    when: type | tuple[type, ...] | Callable[[Any], bool]
    draw: Callable[[Any, Context], Any]

    def matches(self, value: Any) -> bool:
        if isinstance(self.when, (type, tuple)):
            return isinstance(value, self.when)
        return bool(self.when(value))

    def remove(self) -> None:
        """Stop using this picture (again: nothing)."""
        if self in _USER:
            _USER.remove(self)

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


_USER: list[Registration] = []


def register(
    when: type | tuple[type, ...] | Callable[[Any], bool], draw: Callable[[Any, Context], Any] | None = None
) -> Any:
    """Draw the values `when` matches with `draw`, before every built-in picture.

    Args:
        when: a type (or tuple of types) the value is an instance of, or a predicate
            ``value -> bool``.
        draw: ``draw(value, ctx)`` returning a Panel, a list of them, a function of a matplotlib
            Axes, a Figure, HTML, or None to decline (see the module docstring). Without it,
            ``register(when)`` is a decorator.

    Returns:
        The :class:`Registration` (``.remove()``; a context manager), or, as a decorator, `draw`.

    Raises:
        TypeError: `when` is neither a type nor callable, or `draw` is not callable.

    Example::

        @hk.show.register(Tokens)
        def draw_tokens(value, ctx):
            return ctx.draw(value.ids)
    """
    if not isinstance(when, (type, tuple)) and not callable(when):
        raise TypeError(f"show.register(): when must be a type or a predicate, got {type(when).__name__}")
    if draw is None:

        def decorator(fn: Callable[[Any, Context], Any]) -> Callable[[Any, Context], Any]:
            register(when, fn)
            return fn

        return decorator
    if not callable(draw):
        raise TypeError(f"show.register(): draw must be callable, got {type(draw).__name__}")
    registration = Registration(when, draw)
    _USER.insert(0, registration)  # the most recent first: a later picture overrides
    return registration


def unregister(draw: Callable[[Any, Context], Any]) -> int:
    """Remove every registration of `draw`; the number removed."""
    gone = [r for r in _USER if r.draw is draw]
    for r in gone:
        r.remove()
    return len(gone)


def registered() -> list[Registration]:
    """The user's registrations, in the order they are tried."""
    return list(_USER)


def user_panels(value: Any, ctx: Context, label: str) -> list[Panel] | None:
    """The first answer of the user's registrations, then of the type's ``__handlerkit_show__``."""
    shown = replace(ctx, label=label)
    for registration in list(_USER):
        if registration.matches(value):
            out = _call(registration.draw, value, shown)
            if out is not None:
                return as_panels(out, label or _named(value), registration.draw)
    method = getattr(type(value), "__handlerkit_show__", None)
    if method is not None and not isinstance(value, type):
        out = _call(lambda v, c: method(v, c), value, shown, name=f"{type(value).__qualname__}.__handlerkit_show__")
        if out is not None:
            return as_panels(out, label or _named(value), method)
    return None


def _call(draw: Callable[[Any, Context], Any], value: Any, ctx: Context, name: str | None = None) -> Any:
    try:
        return draw(value, ctx)
    except HandlerkitError:
        raise
    except Exception as exc:
        name = name or getattr(draw, "__qualname__", repr(draw))
        raise HandlerkitError(
            f"show(): your picture {name} raised {type(exc).__name__}: {exc}",
            fix=f"fix {name}, or take it out: hk.show.unregister({getattr(draw, '__name__', 'draw')})",
        ) from exc


def _named(value: Any) -> str:
    from handlerkit.summaries import describe

    return describe(value)


def as_panels(out: Any, title: str, draw: Any = None) -> list[Panel]:
    """What a user's picture returned, as panels (module docstring).

    Raises:
        TypeError: it returned something else (named, with what it may return).
    """
    if isinstance(out, Panel):
        return [out]
    if isinstance(out, (list, tuple)) and out and all(isinstance(p, Panel) for p in out):
        return list(out)
    if isinstance(out, str):
        return [html_panel(title, out)]
    if type(out).__name__ == "Figure" and hasattr(out, "canvas"):  # (a Figure has a _repr_html_ too)
        return [figure_panel(title, out)]
    if hasattr(out, "_repr_html_"):
        return [html_panel(title, out._repr_html_() or "")]
    if callable(out):
        return [Panel("axes", title, {"draw": out})]
    name = getattr(draw, "__qualname__", "a picture")
    raise TypeError(
        f"show(): {name} returned {type(out).__name__}; a picture returns a Panel, a list of Panels, "
        "a function of a matplotlib Axes, a Figure, HTML (str or _repr_html_), or None to decline"
    )


def html_panel(title: str, html: str) -> Panel:
    """A panel of HTML (a table, a text): shown as HTML beside the figure, never as pixels."""
    return Panel("html", title, {"html": html}, size=(0.0, 0.0))


def figure_panel(title: str, fig: Any) -> Panel:
    """A matplotlib Figure made by the user, drawn into a panel as its pixels."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    pixels = np.asarray(canvas.buffer_rgba())[..., :3].copy()
    width, height = fig.get_size_inches()
    return Panel("images", title, {"grid": pixels}, size=(min(float(width), 6.4), min(float(height), 4.8) + 0.4))


def escape(text: Any) -> str:
    return html_module.escape(str(text))


def titled(title: str, body: str) -> str:
    """An HTML part under its title."""
    return f"<div class='handlerkit-part'><b>{escape(title)}</b>{body}</div>" if title else body


def iter_html(panels: list[Panel]) -> Iterator[str]:
    for p in panels:
        if p.kind == "html":
            notes = f"<div style='color:#555'>{escape('; '.join(p.notes))}</div>" if p.notes else ""
            yield titled(p.title, p.data["html"] + notes)
