"""What ``hk.show`` returns when part of its picture is HTML (:mod:`handlerkit.viz.shown`): the
figure and the HTML parts together, the figure's attributes read through."""

from __future__ import annotations

import re

import matplotlib.figure
import numpy as np
import pytest
import torch

import handlerkit as hk
from handlerkit.viz.panel import Panel
from handlerkit.viz.shown import Shown


def test_an_html_answer_is_shown_with_the_figure_and_the_figure_is_read_through():
    with hk.show.register(str, lambda v, c: f"<i>{v}</i>" if v.startswith("note") else None):
        shown = hk.show({"pixels": torch.rand(1, 3, 8, 8), "text": "note this"})
    assert isinstance(shown, Shown) and isinstance(shown.figure, matplotlib.figure.Figure)
    assert shown.axes == shown.figure.axes  # a Figure's attributes read through
    bundle = shown._repr_mimebundle_()
    html = bundle["text/html"]
    assert re.search(r"<img src='data:image/png;base64,[A-Za-z0-9+/=]{100,}'", html)
    assert html.index("<img") < html.index("<i>note this</i>") and "[&#x27;text&#x27;]" in html
    assert bundle["text/plain"].startswith("<Shown: a figure and 1 HTML part(s)")
    assert isinstance(hk.show(np.ones((2, 3, 8, 8))), matplotlib.figure.Figure)  # pictures only: a Figure


def test_a_shown_that_cannot_render_warns_and_raises():
    shown = Shown(None, [Panel("html", "t", {"html": "<p>x</p>"})])
    assert shown._repr_mimebundle_()["text/html"].endswith("<p>x</p></div></div>")
    shown.panels[0].data.clear()
    with pytest.warns(hk.HandlerkitWarning, match=r"handlerkit: the picture could not render itself: KeyError"):
        with pytest.raises(KeyError):
            shown._repr_mimebundle_()
