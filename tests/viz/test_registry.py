"""handlerkit/viz/registry.py: hk.show chooses from a chain of pictures; a user's pictures
(hk.show.register, __handlerkit_show__) come first, each free to decline; built-ins are added
to the chain the same way (dispatch.VALUES, tensors.TENSORS)."""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.figure
import pytest
import torch
from _viz import drawn_images, kinds, panels, texts

import handlerkit as hk
from handlerkit.errors import HandlerkitError
from handlerkit.viz import dispatch, tensors
from handlerkit.viz.panel import Context, Panel
from handlerkit.viz.registry import registered
from handlerkit.viz.shown import Shown


@dataclass
class Reading:
    """A user's type: a sensor's readings with their unit."""

    values: list[float]
    unit: str


@dataclass
class Drawn(Reading):
    def __handlerkit_show__(self, ctx):
        return lambda ax: ax.plot(self.values, label=self.unit)


@pytest.fixture(autouse=True)
def no_leak():
    before = registered()
    yield
    assert registered() == before, "a test left a registration behind"


def test_a_type_with_handlerkit_show_draws_itself_on_an_axes():
    fig = hk.show(Drawn([1.0, 3.0, 2.0], "volt"))
    (ax,) = fig.axes
    assert list(ax.lines[0].get_ydata()) == [1.0, 3.0, 2.0] and ax.lines[0].get_label() == "volt"


def test_a_registered_type_is_drawn_by_its_function_only_inside_the_with_block():
    def draw(value, ctx):
        return Panel("card", f"{ctx.label or 'reading'} in {value.unit}", {"lines": [str(v) for v in value.values]})

    reading = Reading([0.5, 0.25], "amp")
    with hk.show.register(Reading, draw) as registration:
        assert registered()[0] is registration
        assert kinds(reading) == ["card"] and "0.25" in texts(hk.show(reading))
        # inside a stage value too, named by its path
        (panel,) = panels(hk.StageResult("preprocess", output={"r": reading}))
        assert panel.title == "preprocess output['r'] in amp"
    assert kinds(reading) == ["card"] and "No picture: a value of type Reading" in texts(hk.show(reading))


def test_a_predicate_can_decline_and_the_next_picture_draws():
    calls = []

    def only_long(value, ctx):
        calls.append(value.shape[0])
        return None if value.shape[0] < 100 else ctx.draw(value[:10])  # delegate: the built-in picture

    registration = hk.show.register(lambda v: isinstance(v, torch.Tensor) and v.dim() == 1, only_long)
    try:
        assert kinds(torch.randn(10)) == ["bars"]  # declined: the built-in bars
        (short,) = panels(torch.randn(1000))  # drawn: its first 10 values as bars, not a 1000-point line
        assert short.kind == "bars" and len(short.data["samples"][0][0]) == 10
        assert calls == [10, 1000, 10]  # ctx.draw goes through the chain again
    finally:
        registration.remove()
    assert kinds(torch.randn(1000)) == ["lines"]


def test_the_latest_registration_is_tried_first_and_unregister_removes_every_one():
    def first(value, ctx):
        return "<p>first</p>"

    def second(value, ctx):
        return "<p>second</p>"

    hk.show.register(Reading, first)
    hk.show.register(Reading, second)
    shown = hk.show(Reading([1.0], "x"))
    assert isinstance(shown, Shown) and shown.figure is None and "<p>second</p>" in shown._repr_html_()
    assert hk.show.unregister(second) == 1 and hk.show.unregister(first) == 1
    assert hk.show.unregister(first) == 0


def test_the_decorator_form_registers_and_returns_the_function():
    @hk.show.register(Reading)
    def as_html(value, ctx):
        return f"<b>{value.unit}</b>"

    try:
        assert callable(as_html) and "<b>ohm</b>" in hk.show(Reading([1.0], "ohm"))._repr_html_()
    finally:
        hk.show.unregister(as_html)


def test_a_users_figure_becomes_a_panel_of_its_pixels():
    def draw(value, ctx):
        fig = matplotlib.figure.Figure(figsize=(2, 1), dpi=50)
        fig.patch.set_facecolor((1.0, 0.0, 0.0))
        return fig

    with hk.show.register(Reading, draw):
        (image,) = drawn_images(hk.show(Reading([1.0], "x")))
    assert image.shape == (50, 100, 3) and (image.reshape(-1, 3) == [255, 0, 0]).all()


def test_a_failing_or_malformed_picture_is_named_with_its_fix():
    def broken(value, ctx):
        raise KeyError("unit")

    with hk.show.register(Reading, broken):
        with pytest.raises(HandlerkitError, match=r"your picture .*broken raised KeyError: 'unit'") as info:
            hk.show(Reading([1.0], "x"))
    assert (
        info.value.fix
        == "fix test_a_failing_or_malformed_picture_is_named_with_its_fix.<locals>.broken, or take it out: hk.show.unregister(broken)"
    )
    with hk.show.register(Reading, lambda v, c: 42):
        with pytest.raises(HandlerkitError, match=r"returned int; a picture returns a Panel"):
            hk.show(Reading([1.0], "x"))
    with pytest.raises(TypeError, match=r"when must be a type or a predicate, got int"):
        hk.show.register(3, print)


def test_a_built_in_of_the_panel_modules_shape_is_added_to_the_chain_in_one_line():
    """How a new kind of picture joins: ``(x, ctx, title) -> Panel | None``, here ahead of the
    built-in float maps it overrides."""

    def one_channel_maps(x: torch.Tensor, ctx: Context, title: str) -> Panel | None:
        if x.dim() == 4 and x.shape[1] == 1 and x.is_floating_point() and float(x.max()) > 1.5:
            return Panel("card", f"{title}: map", {"lines": ["a float map"]})
        return None

    tensors.TENSORS.add(one_channel_maps, before="maps")
    try:
        names = tensors.TENSORS.names()
        assert names.index("one_channel_maps") == names.index("maps") - 1
        assert kinds(torch.rand(2, 1, 16, 16) * 3.5) == ["card"]
        assert kinds(torch.rand(2, 1, 16, 16)) == ["images"]  # declined: pixels in [0, 1]
        with pytest.raises(ValueError, match=r"already in the chain"):
            tensors.TENSORS.add(one_channel_maps)
    finally:
        tensors.TENSORS.remove("one_channel_maps")
    with pytest.raises(ValueError, match=r"no picture named 'nope'; the chain is \['attributions'"):
        tensors.TENSORS.add(one_channel_maps, before="nope")


def test_the_module_docstrings_list_every_built_in_picture_in_the_chain_s_order():
    for module, chain in ((dispatch, dispatch.VALUES), (tensors, tensors.TENSORS)):
        places = [module.__doc__.index(f"``{name}``  ") for name in chain.names()]
        assert places == sorted(places)


def test_a_built_in_of_the_value_shape_is_added_before_the_image_bytes():
    """``(value, ctx, label) -> list[Panel] | None``: WAV bytes, say, before images are tried."""

    def riff_bytes(value, ctx: Context, label: str) -> list[Panel] | None:
        if isinstance(value, (bytes, bytearray)) and bytes(value[:4]) == b"RIFF":
            return [Panel("card", f"{label}: audio", {"lines": [f"{len(value)} bytes"]})]
        return None

    dispatch.VALUES.add(riff_bytes, before="encoded_images")
    try:
        (panel,) = panels(hk.StageResult("preprocess", input=None, output=b"RIFF" + bytes(40)))
        assert panel.title == "preprocess output: audio" and panel.data["lines"] == ["44 bytes"]
        assert "No picture" in texts(hk.show(b"\x00" * 12))  # declined: not RIFF, then no image either
    finally:
        dispatch.VALUES.remove("riff_bytes")
    assert "riff_bytes" not in dispatch.VALUES.names()
