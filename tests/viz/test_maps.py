"""handlerkit/viz/maps.py: float maps that are not pixels drawn as heat maps on the data's own
scale with a colour bar, time × frequency with low frequencies at the bottom, a panel per
request; the rule that tells a map from an image. Drawn on the new user's audio handler (WAV →
``log1p|STFT|`` → CNN), not on the image fixtures."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
import torch
from _new_users import AUDIO_RATE, audio_dir, wav_bytes
from _viz import kinds, panels, pixel, rendered

import handlerkit as hk
from handlerkit import viz
from handlerkit.recording.results import StageResult
from handlerkit.viz.handler_view import HandlerView
from handlerkit.viz.images import unit_images
from handlerkit.viz.maps import is_map, maps_panel
from handlerkit.viz.panel import Context

TONES = (220.0, 880.0, 2000.0)


@pytest.fixture(scope="module")
def sounds(tmp_path_factory):
    """The audio handler run on three tones and a noise: its preprocess output is [4, 1, 129, 63]."""
    model_dir = audio_dir(tmp_path_factory.mktemp("sounds") / "sounds")
    h = hk.Harness.open(model_dir)
    bodies = [wav_bytes(f) for f in TONES] + [wav_bytes(None)]
    run = h.run(hk.batch(*(hk.Request.from_bytes(b, "audio/wav") for b in bodies)))
    return run


def test_a_spectrogram_is_a_heat_map_per_request_on_its_own_scale_not_black(sounds):
    result = sounds.stages["preprocess"]
    x = result.output
    (panel,) = panels(result)
    assert panel.kind == "maps" and panel.data["labels"] == ["request 0", "request 1", "request 2", "request 3"]
    assert panel.data["limits"] == (x.min().item(), x.max().item()) and panel.data["low_at_bottom"]
    assert panel.data["xlabel"] == "time (frame)" and panel.data["ylabel"] == "frequency (bin)"
    assert panel.notes[0] == f"time × frequency, low frequencies at the bottom; one colour scale 0 … {x.max():.3g} (the data's)"
    # Each tone's brightest row is its frequency's bin (bin = f / rate * n_fft), bin 0 the lowest.
    for i, frequency in enumerate(TONES):
        brightest = int(panel.data["maps"][i].mean(1).argmax())
        assert brightest == round(frequency / AUDIO_RATE * 256)


def test_the_low_frequency_bin_is_the_bottom_row_of_the_drawn_picture_and_the_colour_bar_spans_the_data():
    x = torch.full((2, 1, 40, 30), 0.25)
    x[:, 0, 0, :] = 3.5  # bin 0, the lowest frequency: the loudest
    x[1, 0, -1, :] = -1.5  # request 1's highest bin: the quietest value
    fig = viz.show(x)
    heat_axes = [ax for ax in fig.get_axes() if ax.get_images()]
    (bar,) = [ax for ax in fig.get_axes() if not ax.get_images()]  # the colour bar's axes
    images = [ax.get_images()[0] for ax in heat_axes]
    assert images[-1].colorbar is not None and images[-1].colorbar.ax is bar  # one bar for all
    assert {(im.norm.vmin, im.norm.vmax) for im in images} == {(-1.5, 3.5)} and bar.get_ylim() == (-1.5, 3.5)
    assert [ax.get_title(loc="left") for ax in heat_axes] == ["request 0", "request 1"]
    picture = rendered(fig)
    cmap = matplotlib.colormaps["magma"]
    for ax in heat_axes:  # the bottom row is bin 0 (3.5, the brightest), the top row bin 39
        bottom, top = pixel(fig, picture, ax, 0.5, 0.01), pixel(fig, picture, ax, 0.5, 0.99)
        np.testing.assert_allclose(bottom, cmap(1.0)[:3], atol=2 / 255)
        assert bottom.sum() > top.sum() + 1.0
    np.testing.assert_allclose(pixel(fig, picture, heat_axes[1], 0.5, 0.99), cmap(0.0)[:3], atol=2 / 255)
    assert heat_axes[0].get_xlabel() == "time (frame)" and heat_axes[0].get_ylabel() == "frequency (bin)"


def test_pixels_stay_images_and_maps_are_told_by_their_values():
    ctx = Context(HandlerView(), stage="preprocess")
    grey = torch.rand(2, 1, 28, 28)  # ToTensor's [0, 1]
    eight_bit = torch.randint(0, 256, (2, 1, 28, 28)).float()  # 8-bit pixels held as floats
    log_power = torch.rand(2, 1, 28, 40) * 3.5  # log1p|STFT|: inside [0, 255], not whole numbers
    decibels = torch.rand(1, 64, 101) * -80  # a dB mel spectrogram, [1, F, T]
    assert not is_map(grey, ctx) and not is_map(eight_bit, ctx)
    assert is_map(log_power, ctx) and is_map(decibels, ctx)
    normalised = Context(HandlerView(mean=[0.13], std=[0.31], normalize_at="handler.transform"), stage="preprocess")
    assert not is_map(log_power, normalised)  # the handler says it normalises images: pixels
    assert not is_map(torch.rand(2, 3, 28, 40) * 3.5, ctx) and not is_map(torch.rand(4, 8, 8) * 3, ctx)
    assert kinds(grey) == ["images"] and kinds(eight_bit) == ["images"] and kinds(log_power) == ["maps"]


def test_a_later_stage_s_map_or_a_square_one_keeps_row_0_at_the_top():
    depth = torch.rand(1, 1, 12, 20) * 9 + 0.5
    assert maps_panel(depth, Context(HandlerView(), stage="inference"), "d").data["low_at_bottom"] is False
    square = maps_panel(torch.rand(1, 1, 16, 16) * 5, Context(HandlerView()), "a").data
    assert square["low_at_bottom"] is False and (square["xlabel"], square["ylabel"]) == ("column", "row")
    assert maps_panel(torch.rand(1, 1, 16, 16), Context(HandlerView()), "p") is None  # pixels: declined


def test_a_tall_map_is_subsampled_and_many_requests_bounded_with_notes():
    x = torch.randn(20, 1, 2000, 30)
    panel = maps_panel(x, Context(HandlerView(), max_images=16), "big")
    assert len(panel.data["maps"]) == 8 and panel.data["maps"][0].shape[0] <= 512
    assert panel.data["shape"] == (2000, 30) and "first 8 of 20 requests" in panel.notes
    assert panel.data["limits"] == (x.min().item(), x.max().item())  # the whole tensor's scale


def test_non_pixel_values_in_0_255_are_rescaled_not_divided_by_255():
    x, note = unit_images(torch.tensor([[[[0.0, 1.75], [3.5, 0.5]]]]).expand(1, 3, 2, 2), HandlerView())
    assert x.max().item() == 1.0 and "each image rescaled to its own range" in note
    x, note = unit_images(torch.full((1, 3, 2, 2), 51.0), HandlerView())
    assert note == "0-255 values scaled to [0, 1]" and torch.allclose(x, torch.full((1, 3, 2, 2), 0.2))


def test_a_run_of_the_audio_handler_draws_its_spectrograms_as_maps(sounds):
    assert kinds(sounds)[0] == "maps"
    fig = viz.show(StageResult("preprocess", input=None, output=sounds.stages["preprocess"].output))
    assert fig.get_size_inches()[0] * fig.dpi <= 1200  # fits JupyterLab's output width
