"""``hk.show``: the picture of a stage's input or output, and ``hk.summary``: its one-line numbers.

``show(obj)`` takes a :class:`~handlerkit.recording.results.StageResult`, a :class:`~handlerkit.recording.results.Run`,
or any stage value (a tensor, an array, bytes, text, JSON, a list / dict of them), picks the
picture from what the data is (images, a feature table's values, signals as lines, token
tables, a model's class scores as bars, JSON as a table, image bytes decoded, a streamed run's
chunks on a timeline, a sequence's steps as requests × steps; a summary card saying why when nothing fits), and returns a matplotlib
``Figure`` (Jupyter displays it; nothing is shown behind your back, and pyplot is not used). The handler that produced a result
(``.source``) supplies what the pictures need: the mean and std of its ``Normalize`` transform
(images are de-normalised), its label ``mapping`` (a model output's bars and legends) and its
vocabulary (token tables). ``handler=`` overrides it; ``image=`` gives the input image for
overlays when the object does not carry one.

When some panels are HTML (a token table, a streamed run's chunk texts, ranked lists with their
scores), ``show`` returns a :class:`~handlerkit.viz.shown.Shown` (the figure and the tables,
displayed together; ``.figure`` is the Figure); when every panel is a picture, the ``Figure``.

Your own pictures come first: ``hk.show.register(MyType_or_predicate, draw)`` or a
``__handlerkit_show__(self, ctx)`` method on your type (``registry`` says what ``draw`` returns).

``show`` reads top-down through the package:

1. ``handler_view``: what the pictures read from the handler (mean/std, labels, vocabulary);
2. ``registry``: the chain of pictures (yours first, each free to decline); ``dispatch`` and
   ``tensors``: the built-in pictures of values and of tensors in the chain's order, each with
   its table;
3. the panels, one module per kind: ``images`` (image grids, decoded image bytes, feature
   maps, heat maps with their values), ``bars`` (class scores, values, ``{label: score}``
   dicts), ``lines`` (signals), ``histogram``, ``overlays`` (masks and boxes on the input
   image), ``tokens`` (token tables), ``tables`` (JSON-like values), ``cards`` (text: a
   summary saying why there is no picture, a failed stage's error), ``chunks`` (a streamed
   run's chunk timeline), ``steps`` (``hk.Sequences``' per-step batches); ``panel`` holds what they share (``Panel``, the bounds);
4. ``draw``: the panels as one matplotlib ``Figure``, displayed as PNG in Jupyter; ``shown``:
   the figure with the HTML panels.
"""

from __future__ import annotations

from typing import Any

from handlerkit._optional import require
from handlerkit.errors import HandlerkitError
from handlerkit.recording.results import Run
from handlerkit.summaries import describe, summary

__all__ = ["show", "summary"]


class Show:
    """``hk.show``: call it to draw a value; ``hk.show.register`` adds a picture of your own."""

    def __call__(
        self,
        obj: Any,
        *,
        handler: Any = None,
        image: Any = None,
        top_k: int = 5,
        max_images: int = 16,
        title: str | None = None,
    ) -> Any:
        """The picture of `obj` (see :func:`_show`)."""
        return _show(obj, handler=handler, image=image, top_k=top_k, max_images=max_images, title=title)

    @staticmethod
    def register(when: Any, draw: Any = None) -> Any:
        """Draw the values `when` (a type or a predicate) matches with ``draw(value, ctx)``,
        before every built-in picture; ``with hk.show.register(...):`` scopes it. See
        :func:`handlerkit.viz.registry.register`."""
        from handlerkit.viz.registry import register

        return register(when, draw)

    @staticmethod
    def unregister(draw: Any) -> int:
        """Remove every registration of `draw`; the number removed."""
        from handlerkit.viz.registry import unregister

        return unregister(draw)

    @staticmethod
    def registered() -> list[Any]:
        """Your registrations, in the order they are tried."""
        from handlerkit.viz.registry import registered

        return registered()

    def __repr__(self) -> str:
        return "<hk.show: show(obj) draws it; show.register(type_or_predicate, draw) adds a picture>"


show = Show()


def _show(
    obj: Any, *, handler: Any = None, image: Any = None, top_k: int = 5, max_images: int = 16, title: str | None = None
) -> Any:
    """The picture of `obj`: a matplotlib ``Figure``, or a ``Shown`` when some of it is HTML.

    Args:
        obj: a StageResult, a Run, ``hk.Sequences`` (or a list of its steps), or a stage
            value: a tensor (or numpy array), bytes, text, JSON-like data, or a list / dict of
            them. A value without a picture is drawn as its summary card, whose last line says why.
            Your pictures (``show.register``, ``__handlerkit_show__``) are tried first.
        handler: the handler whose transforms, ``mapping`` and vocabulary the picture uses
            (default: ``obj.source``, the handler that produced it); a Harness works too.
        image: the input image batch ``[N, C, H, W]`` for segmentation and detection overlays
            (default: the Run's preprocess output, or the StageResult's input).
        top_k: bars per row for class scores.
        max_images: the most images (or channels) drawn.
        title: the figure's title.

    Raises:
        HandlerkitError: drawing failed in a way not foreseen (it names what came).
        ImportError: matplotlib is missing (with the pip command).
    """
    require("matplotlib", feature="hk.show", extra="notebook")
    for name, value in (("top_k", top_k), ("max_images", max_images)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"show(): {name} must be an int, got {type(value).__name__}")
        if value < 1:
            raise ValueError(f"show(): {name} must be at least 1, got {value}")
    from handlerkit.viz.dispatch import panels_for
    from handlerkit.viz.draw import display_as_png, figure
    from handlerkit.viz.handler_view import view_for

    if title is None and isinstance(obj, Run):
        title = f"Run of {obj.batch_size} request(s)" + (f": {obj.error.stage} failed" if obj.error else "")
        answers = obj.output if isinstance(obj.output, list) and not obj.error else []
        failed = [i for i, a in enumerate(answers) if isinstance(a, dict) and "error" in a and "fix" in a]
        title += f": request {', '.join(map(str, failed))} failed" if failed else ""
    try:
        view = view_for(obj, handler)
        panels = panels_for(obj, view, image=image, top_k=top_k, max_images=max_images)
        pictures = [p for p in panels if p.kind != "html"]
        fig = figure(pictures, title) if pictures else None
    except HandlerkitError:
        raise
    except Exception as exc:  # a case we did not foresee: name what came, not torch's or matplotlib's frame
        raise HandlerkitError(
            f"show() could not draw {describe(obj)}: {type(exc).__name__}: {exc}",
            fix="draw it yourself meanwhile (hk.summary(obj) gives its numbers), and report the case",
        ) from exc
    display_as_png()
    html = [p for p in panels if p.kind == "html"]
    html += _players(pictures)
    if not html:
        return fig
    from handlerkit.viz.shown import Shown

    return Shown(fig, html, title)


def _players(pictures: list[Any]) -> list[Any]:
    """An ``Audio`` player per clip the waveforms carry, as one HTML panel under the figure (none
    without IPython, where nothing could play them)."""
    import importlib.util

    if importlib.util.find_spec("IPython") is None or not any(p.kind == "waveform" for p in pictures):
        return []
    from handlerkit.viz.audio import players_html
    from handlerkit.viz.registry import html_panel

    players = players_html(pictures)
    return [html_panel("listen", players)] if players else []


Show.__call__.__doc__ = _show.__doc__  # hk.show? in Jupyter shows the whole story
