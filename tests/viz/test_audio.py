"""handlerkit/viz/audio.py: WAV and raw 16-bit PCM bytes drawn as waveforms over time, carrying
their samples for a notebook's player; ``hk.show(batch)`` drawing every request's input, one
panel per request. Drawn on the new user's audio (``_new_users.wav_bytes``) and PNG bytes."""

from __future__ import annotations

import io
import math
import struct
import wave

import numpy as np
import torch
from _new_users import AUDIO_RATE, png_bytes, truncated_wav, wav_bytes
from _viz import panels
from matplotlib.figure import Figure

import handlerkit as hk
from handlerkit import viz
from handlerkit.viz.audio import MAX_REQUESTS, audio_panels, players, players_html, read_wav
from handlerkit.viz.handler_view import HandlerView
from handlerkit.viz.panel import Context
from handlerkit.viz.shown import Shown


def wav(samples: list[list[int]], *, width: int, rate: int) -> bytes:
    """A WAV of `samples` (one list per channel) at `width` bytes a sample."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(len(samples))
        w.setsampwidth(width)
        w.setframerate(rate)
        frames = [v for frame in zip(*samples) for v in frame]
        w.writeframes(struct.pack(f"<{len(frames)}{'B' if width == 1 else 'h'}", *frames))
    return out.getvalue()


def test_wav_bytes_are_a_waveform_over_seconds_not_no_picture():
    body = wav_bytes(440.0)
    fig = viz.show(body)
    (ax,) = fig.get_axes()
    assert ax.get_xlabel() == "time (s)" and ax.get_ylabel() == "amplitude" and ax.get_xlim() == (0.0, 1.0)
    (line,) = ax.get_lines()
    ys = line.get_ydata()
    assert 0.79 < np.nanmax(ys) <= 0.8 and -0.8 <= np.nanmin(ys) < -0.79  # the 0.8 sine's peaks kept
    assert "No picture" not in " ".join(t.get_text() for t in fig.texts)
    (panel,) = panels(body)
    assert panel.kind == "waveform" and panel.title == "audio" and panel.notes[:2] == ["8000 Hz; 1 s", "WAV"]
    samples, rate = read_wav(body)
    expected = [0.8 * 32767 * math.sin(2 * math.pi * 440 * i / AUDIO_RATE) / 32768 for i in range(5)]
    np.testing.assert_allclose(samples[0, :5].numpy(), expected, atol=1 / 32768)


def test_the_waveform_carries_its_samples_for_a_player():
    (panel,) = panels(wav_bytes(440.0))
    ((label, samples, rate),) = panel.data["audio"]
    assert rate == AUDIO_RATE and samples.shape == (AUDIO_RATE,) and samples.dtype == np.float32
    ((name, player),) = players([panel])
    assert name == "audio"
    assert player.data[:4] == b"RIFF"
    assert "<audio" in player._repr_html_()
    decoded, decoded_rate = read_wav(player.data)  # the player plays the request's samples
    assert decoded_rate == AUDIO_RATE and torch.allclose(decoded[0], torch.from_numpy(samples), atol=1 / 32767)


def test_show_puts_a_player_under_the_waveform_in_a_notebook():
    shown = viz.show([wav_bytes(440.0), wav_bytes(880.0)])
    assert isinstance(shown, Shown) and len(shown.figure.get_axes()) == 2  # a waveform each, one under the other
    page = shown._repr_html_()
    assert page.index("data:image/png") < page.index("<audio") and page.count("<audio") == 2
    assert [p.title for p in shown.panels] == ["listen"]
    assert isinstance(viz.show(png_bytes()), Figure)  # no audio, no player: a plain figure


def test_8_bit_stereo_is_read_and_its_first_channel_drawn():
    body = wav([[128, 255, 0, 128], [128, 128, 128, 128]] * 1, width=1, rate=4)
    samples, rate = read_wav(body)
    assert rate == 4 and samples.shape == (2, 4)
    assert samples[0].tolist() == [0.0, 127 / 128, -1.0, 0.0]
    (panel,) = audio_panels(body, Context(HandlerView()), "body")
    assert panel.notes[:2] == ["4 Hz; 1 s", "WAV, 2 channels (the first drawn)"] and panel.title == "body: audio"


def test_bytes_that_are_no_wav_are_declined():
    ctx = Context(HandlerView())
    assert audio_panels(truncated_wav(), ctx, "") is None and audio_panels(png_bytes(), ctx, "") is None
    assert read_wav(b"RIFF\x00\x00\x00\x00WAVEjunk") is None
    (card,) = panels(truncated_wav())  # as before: no picture, and why
    assert card.kind == "card" and card.data["lines"][-1] == "No picture: 30 bytes that PIL cannot read as an image."
    empty = wav([[]], width=2, rate=8000)
    (panel,) = panels(empty)
    assert panel.kind == "card" and panel.data["lines"][-1] == "No picture: the audio holds no samples."


def test_a_batch_draws_every_request_s_input_one_panel_per_request():
    tone = torch.tensor([math.sin(2 * math.pi * 5 * i / 100) for i in range(100)])
    pcm = (tone * 16000).to(torch.int16).numpy().tobytes()
    batch = hk.batch(
        hk.Request.from_bytes(wav_bytes(880.0), "audio/wav"),
        hk.Request.from_bytes(png_bytes(24, 16), "image/png"),
        hk.Request.json({"user_id": 3, "item_ids": [4, 9, 17]}),
        hk.Request.from_bytes(pcm, "audio/L16;rate=100"),
        hk.Request.from_bytes(pcm, "audio/pcm"),
    )
    drawn = panels(batch)
    assert [p.kind for p in drawn] == ["waveform", "images", "table", "waveform", "waveform"]
    assert [p.title.split(":")[0] for p in drawn] == [f"request {i}" for i in range(5)]
    assert drawn[1].data["grid"].shape[:2] == (16, 24)
    raw = drawn[3]
    assert raw.data["rates"] == [100] and raw.notes[:2] == ["100 Hz; 1 s", "raw 16-bit PCM"]
    np.testing.assert_allclose(raw.data["audio"][0][1], (tone * 16000).to(torch.int16).float() / 32768)
    assert drawn[4].notes[1] == "raw 16-bit PCM, rate not given: 16000 Hz assumed"
    fig = viz.show(batch)
    assert len([ax for ax in fig.get_axes() if ax.get_lines()]) == 3
    assert all(3 * p.size[0] * fig.dpi <= 1200 for p in drawn if p.kind == "waveform")  # three a row fit
    assert [name for name, _ in players(drawn)] == ["request 0: audio", "request 3: audio", "request 4: audio"]
    html = players_html(drawn)
    assert html.count("<audio") == 3 and html.count("data:audio/wav;base64,") == 3 and "request 3: audio" in html
    assert players_html(drawn[1:3]) == ""


def test_a_large_batch_draws_its_first_requests_and_says_so():
    batch = hk.batch(*(hk.Request.from_bytes(wav_bytes(200.0 + i), "audio/wav") for i in range(MAX_REQUESTS + 2)))
    drawn = panels(batch)
    assert len(drawn) == MAX_REQUESTS and drawn[-1].notes[-1] == f"the first {MAX_REQUESTS} of 8 requests drawn"


def test_a_list_of_wavs_is_a_line_and_a_player_each_the_first_eight():
    bodies = [wav_bytes(200.0 + 100 * i, seconds=0.5 + 0.1 * i) for i in range(10)]
    (panel,) = panels(bodies)
    assert [label for label, _, _ in panel.data["series"]] == [f"[{i}]" for i in range(8)]
    assert [len(samples) for _, samples, _ in panel.data["audio"]] == [4000 + 800 * i for i in range(8)]
    assert panel.notes[:2] == ["8000 Hz; 0.5 s, 0.6 s, 0.7 s, 0.8 s, 0.9 s, 1 s, 1.1 s, 1.2 s", "first 8 of 10 clips"]
    assert not any("gaps" in n for n in panel.notes)  # a shorter clip's end is no gap
