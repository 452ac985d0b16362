"""Audio: WAV (and raw 16-bit PCM) bytes drawn as a waveform over time, carrying the samples for
a player; and a request :class:`~handlerkit.worker.batches.Batch` drawn as its requests' inputs.

A waveform panel (kind ``waveform``) holds, besides its bounded lines, ``data["audio"]``: a
list of ``(label, samples, rate)``, mono float32 in [-1, 1] at most ``MAX_PLAYER_SECONDS``
long, which :func:`players` turns into ``IPython.display.Audio`` players for a notebook.

How audio is told: bytes that begin with a RIFF/WAVE header are WAV (PCM, 8/16/32-bit, any
rate, the first channel drawn and played); a request parameter whose content type is
``audio/L16``, ``audio/pcm``, ``audio/x-raw`` or ``audio/raw`` is raw little-endian int16 at the
content type's ``rate=`` (16 kHz without one). Other bytes are not audio (bare bytes of
unknown type stay undrawn here: any even-length file reads as int16 samples).
"""

from __future__ import annotations

import io
import wave
from collections.abc import Callable
from typing import Any

import torch

from handlerkit.viz.cards import card, summary_card
from handlerkit.viz.lines import MAX_LINES, lines_panel
from handlerkit.viz.panel import Context, Panel

__all__ = [
    "MAX_PLAYER_SECONDS",
    "MAX_REQUESTS",
    "audio_panels",
    "batch_panels",
    "pcm_samples",
    "players",
    "players_html",
    "read_wav",
    "waveform_panel",
]

MAX_PLAYER_SECONDS = 30.0  # the longest clip a player carries (a notebook keeps it in its output)
MAX_REQUESTS = 6  # requests drawn by hk.show(batch), one panel each
PCM_TYPES = ("audio/l16", "audio/pcm", "audio/x-raw", "audio/raw")
DEFAULT_PCM_RATE = 16000


def read_wav(data: bytes | bytearray | memoryview) -> tuple[torch.Tensor, int] | None:
    """The samples ``[channels, T]`` (float32 in [-1, 1]) and rate of WAV bytes; None when the
    bytes are no WAV or one ``wave`` cannot read (compressed, cut short)."""
    head = bytes(data[:12])
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    try:
        with wave.open(io.BytesIO(bytes(data))) as wav:
            channels, width, rate = wav.getnchannels(), wav.getsampwidth(), wav.getframerate()
            frames = wav.readframes(wav.getnframes())
    except (wave.Error, EOFError):
        return None
    if len(frames) < width * channels:
        return torch.zeros(channels, 0), rate
    if width == 1:  # 8-bit WAV is unsigned
        samples = (torch.frombuffer(bytearray(frames), dtype=torch.uint8).float() - 128.0) / 128.0
    elif width in (2, 4):
        dtype, scale = (torch.int16, 32768.0) if width == 2 else (torch.int32, 2147483648.0)
        usable = len(frames) - len(frames) % width
        samples = torch.frombuffer(bytearray(frames[:usable]), dtype=dtype).float() / scale
    else:
        return None
    usable = samples.numel() - samples.numel() % channels
    return samples[:usable].reshape(-1, channels).T, rate


def pcm_samples(data: bytes | bytearray | memoryview) -> torch.Tensor:
    """Raw little-endian int16 PCM bytes as float32 samples in [-1, 1] (an odd last byte dropped)."""
    usable = len(data) - len(data) % 2
    if not usable:
        return torch.zeros(0)
    return torch.frombuffer(bytearray(bytes(data[:usable])), dtype=torch.int16).float() / 32768.0


def waveform_panel(clips: list[tuple[str, torch.Tensor, int]], title: str, notes: list[str] | None = None) -> Panel:
    """Mono clips ``(label, samples [T], rate)`` as a waveform each, over time in seconds, with
    the samples kept for players (``data["audio"]``)."""
    length = max(c[1].numel() for c in clips)
    if length == 0:
        return card(title, [*(notes or []), "No picture: the audio holds no samples."])
    rows = torch.zeros(len(clips), length)
    for i, (_, samples, _) in enumerate(clips):
        rows[i, : samples.numel()] = samples
        rows[i, samples.numel() :] = torch.nan  # a shorter clip ends where it ends
    panel = lines_panel(rows, title, [label for label, _, _ in clips])
    if any(c[1].numel() < length for c in clips):  # the padding is no gap in the data
        panel.notes = [n for n in panel.notes if not n.endswith("left as gaps")]
    panel.kind = "waveform"
    panel.size = (3.9, 1.0 + 1.0 * len(clips))  # three fit JupyterLab's output width side by side
    rates = {rate for _, _, rate in clips}
    panel.data["rates"] = [rate for _, _, rate in clips]
    panel.data["lengths"] = [samples.numel() for _, samples, _ in clips]
    panel.data["xlabel"] = "time (s)"
    audio = []
    for label, samples, rate in clips:
        kept = samples[: int(MAX_PLAYER_SECONDS * rate)]
        audio.append((label, kept.clamp(-1.0, 1.0).numpy().astype("float32"), rate))
    panel.data["audio"] = audio
    seconds = ", ".join(f"{s.numel() / r:.3g} s" for _, s, r in clips)
    panel.notes[:0] = [f"{'/'.join(f'{r} Hz' for r in sorted(rates))}; {seconds}", *(notes or [])]
    if any(s.numel() > MAX_PLAYER_SECONDS * r for _, s, r in clips):
        panel.notes.append(f"the player holds the first {MAX_PLAYER_SECONDS:g} s")
    return panel


def _clip(data: Any, content_type: str | None = None) -> tuple[torch.Tensor, int, str] | None:
    """(mono samples, rate, what it was) of WAV bytes, or of raw PCM bytes when the content
    type says so; None for other values."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return None
    wav = read_wav(data)
    if wav is not None:
        samples, rate = wav
        channels = samples.shape[0]
        return samples[0], rate, f"WAV, {channels} channels (the first drawn)" if channels > 1 else "WAV"
    kind, _, params = (content_type or "").lower().partition(";")
    if kind.strip() not in PCM_TYPES:
        return None
    rate = DEFAULT_PCM_RATE
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip() == "rate" and value.strip().isdigit():
            rate = int(value.strip())
    said = "" if "rate=" in params else f", rate not given: {DEFAULT_PCM_RATE} Hz assumed"
    return pcm_samples(data), rate, f"raw 16-bit PCM{said}"


def audio_panels(value: Any, ctx: Context, label: str) -> list[Panel] | None:
    """WAV bytes, or a list of them, as one waveform panel (a line per clip); None (decline) for
    anything else. Raw PCM needs its content type, so only :func:`batch_panels` draws it."""
    items = value if isinstance(value, (list, tuple)) else [value]
    if not items:
        return None
    clips = [_clip(item) for item in items]
    if any(c is None for c in clips):
        return None
    named = [(f"[{i}]" if len(items) > 1 else "", c[0], c[1]) for i, c in enumerate(clips) if c is not None]
    kinds = sorted({c[2] for c in clips if c is not None})
    if len(named) > MAX_LINES:
        kinds.insert(0, f"first {MAX_LINES} of {len(named)} clips")
    title = f"{label}: audio" if label else "audio"
    return [waveform_panel(named[:MAX_LINES], title, kinds)]


def batch_panels(
    value: Any, ctx: Context, label: str, draw: Callable[[Any, Context, str], list[Panel]] | None = None
) -> list[Panel] | None:
    """A request :class:`~handlerkit.worker.batches.Batch`: one panel per request (the first
    ``MAX_REQUESTS``), its input drawn: audio as a waveform with its player, anything else by
    `draw` (the function that draws a stage value, ``hk.show``'s; image bytes as the image, JSON
    as a table, text as text) or, without one, as its summary. None for anything but a Batch."""
    from handlerkit.worker.batches import Batch, payload

    if not isinstance(value, Batch):
        return None
    panels = []
    for index, request in enumerate(value.requests[:MAX_REQUESTS]):
        name = f"request {index}"
        parameters = request.parameters if not (request.item or request.delivered is not None) else ()
        body = payload(request.data(decode=True))
        content_type = next((p.content_type for p in parameters if p.name in ("data", "body")), None)
        header = next((v for k, v in request.headers.items() if k.lower() == "content-type"), "")
        if content_type and header.lower().startswith(content_type.lower()):
            content_type = header  # the parameter's type lacks the header's "; rate=..."
        clip = _clip(body, content_type)
        if clip is not None:
            panels.append(waveform_panel([("", clip[0], clip[1])], f"{name}: audio", [clip[2]]))
            continue
        drawn = draw(body, ctx, name) if draw is not None else []
        panels.append(drawn[0] if drawn else summary_card(name, body, "its input holds nothing drawn"))
    if len(value) > MAX_REQUESTS:
        panels[-1].notes.append(f"the first {MAX_REQUESTS} of {len(value)} requests drawn")
    return panels


def players(panels: list[Panel]) -> list[tuple[str, Any]]:
    """``(label, IPython.display.Audio)`` for every clip the waveform panels carry, in order
    (the label is the clip's, else its panel's title: ``request 0: audio``)."""
    from IPython.display import Audio

    out = []
    for panel in panels:
        for label, samples, rate in panel.data.get("audio", []) if panel.kind == "waveform" else []:
            out.append((label or panel.title, Audio(data=samples, rate=rate, normalize=False)))
    return out


def players_html(panels: list[Panel]) -> str:
    """The players of :func:`players` as one HTML fragment (each labelled), to show under the
    figure in a notebook; "" when no panel carries audio."""
    import html

    parts = [
        f"<div><span style='font-size: 0.85em'>{html.escape(label)}</span> {player._repr_html_()}</div>"
        for label, player in players(panels)
    ]
    return f"<div class='handlerkit-players'>{''.join(parts)}</div>" if parts else ""
