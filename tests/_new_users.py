"""Four model dirs as new users write them, unlike the image and text fixtures: each handler is
naive on purpose (it trusts its input, as a first draft does), so what handlerkit says about its
failures is tested on code nobody wrote for handlerkit.

- :func:`audio_dir`: WAV bytes → ``log1p|STFT|`` spectrogram ``[n, 1, 129, 63]`` → a small CNN →
  ``{label: probability}``. A truncated WAV fails in ``wave.open`` (EOFError); one of another
  length fails ``torch.stack``. ``validating=True`` writes the handler its author writes next,
  which answers such a WAV alone with a 400 (or, ``bad_wav="raise"``, fails the batch).
- :func:`ranker_dir`: a multi-input recommender. A request is ``{"user_id": int, "item_ids":
  [int, ...]}`` (any length); preprocess pads the batch to ``(user_ids [n], item_ids [n, L], mask
  [n, L])``, the handler's own ``inference`` calls ``self.model(*inputs)``, and the answer is a
  ranked list ``[{"item_id", "score"}, ...]`` as long as the request's list. An item id of 40 or
  more fails at ``model.py``'s embedding line (:data:`RANKER_EMBEDDING_LINE`).
- :func:`image_filter_dir`: PNG in, PNG bytes out (``image/png``): a fixed 3x3 blur, any size.
- :func:`char_stream_dir`: a character GRU that streams one character per chunk
  (``send_intermediate_predict_response``) and answers the whole text at the end.

Weights come from fixed seeds (or are set by hand): nothing is downloaded.
"""

from __future__ import annotations

import io
import json
import math
import struct
import wave
from pathlib import Path

import torch

BASES = {"torchserve": "ts.torch_handler.base_handler", "handlerkit": "handlerkit.handlers"}


def _write(
    path: Path, files: dict[str, str], manifest: dict[str, str], weights: dict[str, torch.Tensor] | None
) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (path / name).write_text(text)
    if weights is not None:
        torch.save(weights, path / "model.pt")
    (path / "MAR-INF").mkdir(exist_ok=True)
    (path / "MAR-INF" / "MANIFEST.json").write_text(json.dumps({"runtime": "python", "model": manifest}))
    return path


def _seeded_state(module: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    for parameter in module.parameters():
        torch.nn.init.normal_(parameter, std=0.3)
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


# ------------------------------------------------------------------ audio: WAV -> spectrogram -> CNN

AUDIO_RATE = 8000  # samples per second
AUDIO_SECONDS = 1.0  # 8000 samples: 63 STFT frames of 129 bins

AUDIO_MODEL_PY = """\
import torch
from torch import nn


class SpectrogramNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d((4, 4))
        self.fc = nn.Linear(64, 3)

    def forward(self, x):
        x = torch.relu(self.conv(x))
        return self.fc(self.pool(x).flatten(1))
"""

AUDIO_HANDLER_PY = """\
import io
import wave

import numpy as np
import torch
from {base} import BaseHandler


class SpectrogramHandler(BaseHandler):
    def preprocess(self, data):
        spectrograms = []
        for row in data:
            body = row.get("data") or row.get("body")
            with wave.open(io.BytesIO(body)) as wav:
                samples = np.frombuffer(wav.readframes(wav.getnframes()), dtype=np.int16)
            signal = torch.from_numpy(samples.astype(np.float32) / 32768.0)
            stft = torch.stft(signal, n_fft=256, hop_length=128, window=torch.hann_window(256), return_complex=True)
            spectrograms.append(torch.log1p(stft.abs()).unsqueeze(0))
        return torch.stack(spectrograms)

    def postprocess(self, scores):
        probabilities = torch.softmax(scores, dim=1)
        return [{{self.mapping[str(i)]: round(float(p), 4) for i, p in enumerate(row)}} for row in probabilities]
"""

#: The audio handler once its author has met a bad WAV: each one is read apart, and one that
#: cannot be is refused alone (``{on_bad_wav}``: ``self.refuse``) or fails the batch (``raise``).
AUDIO_VALIDATING_HANDLER_PY = """\
import base64
import io
import wave

import numpy as np
import torch
import handlerkit as hk
from {base} import BaseHandler

SEND = "send a 1-second mono 16-bit WAV at 8000 Hz as the body (audio/wav)"


class SpectrogramHandler({bases}):
    def read_samples(self, body):
        \"\"\"The WAV's samples as floats in [-1, 1), or ValueError saying what is wrong with it.\"\"\"
        if isinstance(body, str):  # a JSON client (KServe v1) sends the file base64-encoded
            body = base64.b64decode(body)
        try:
            with wave.open(io.BytesIO(body)) as wav:
                rate, frames = wav.getframerate(), wav.readframes(wav.getnframes())
        except EOFError:
            raise ValueError("the WAV file is cut short: it ends inside its header") from None
        except wave.Error as exc:
            raise ValueError(f"the body is not a WAV file ({{exc}})") from None
        samples = np.frombuffer(frames, dtype=np.int16)
        if rate != 8000 or len(samples) != 8000:
            raise ValueError(f"the WAV has {{len(samples)}} samples at {{rate}} Hz; the model takes 8000 at 8000 Hz")
        return torch.from_numpy(samples.astype(np.float32) / 32768.0)

    def preprocess(self, data):
        spectrograms = []
        for index, row in enumerate(data):
            self.context.set_response_header(index, "X-Batch-Size", str(len(data)))  # the batch it was in
            try:
                signal = self.read_samples(row.get("data") or row.get("body"))
            except ValueError as exc:
{on_bad_wav}
            stft = torch.stft(signal, n_fft=256, hop_length=128, window=torch.hann_window(256), return_complex=True)
            spectrograms.append(torch.log1p(stft.abs()).unsqueeze(0))
        return torch.stack(spectrograms) if spectrograms else None  # None: every request was refused

    def postprocess(self, scores):
        probabilities = torch.softmax(scores, dim=1)
        return [{{self.mapping[str(i)]: round(float(p), 4) for i, p in enumerate(row)}} for row in probabilities]
"""

#: What the validating handler does with a WAV it cannot read (:func:`audio_dir`'s ``bad_wav``).
ON_BAD_WAV = {
    "refuse": "                self.refuse(index, str(exc), fix=SEND)  # this request alone gets 400\n                continue",
    "raise": "                raise hk.RequestError(f\"request {index}: {exc}\", index, fix=SEND) from exc  # the batch fails",
}

#: The message a truncated WAV (:func:`truncated_wav`) gets from the validating handler.
TRUNCATED_WAV_ERROR = "the WAV file is cut short: it ends inside its header"
#: What the validating handler tells the client to send instead.
AUDIO_SEND = "send a 1-second mono 16-bit WAV at 8000 Hz as the body (audio/wav)"

AUDIO_LABELS = {"0": "low tone", "1": "high tone", "2": "noise"}


def wav_bytes(frequency: float | None = 440.0, *, seconds: float = AUDIO_SECONDS, rate: int = AUDIO_RATE) -> bytes:
    """A mono 16-bit WAV: a sine at ``frequency`` Hz, or noise (a fixed seed) for None."""
    count = int(seconds * rate)
    if frequency is None:
        generator = torch.Generator().manual_seed(0)
        samples = (torch.rand(count, generator=generator) * 2 - 1).tolist()
    else:
        samples = [math.sin(2 * math.pi * frequency * i / rate) for i in range(count)]
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(struct.pack(f"<{count}h", *(int(s * 0.8 * 32767) for s in samples)))
    return out.getvalue()


def truncated_wav() -> bytes:
    """A WAV cut inside its header: ``wave.open`` raises EOFError."""
    return wav_bytes()[:30]


def audio_dir(path: Path, *, base: str = "torchserve", validating: bool = False, bad_wav: str = "refuse") -> Path:
    """model.py (``SpectrogramNet``), handler.py (``SpectrogramHandler``), index_to_name.json,
    model.pt; 1-second 8 kHz WAVs (:func:`wav_bytes`) give ``[1, 129, 63]`` each.

    The handler is naive (it trusts every WAV) unless ``validating``: then it reads each WAV
    apart, says what is wrong with one it cannot take (:data:`TRUNCATED_WAV_ERROR`, its fix
    :data:`AUDIO_SEND`) and, as ``bad_wav`` says, refuses that request alone (``"refuse"``:
    ``self.refuse``, mixed into TorchServe's BaseHandler as ``hk.PerRequestErrors``) or raises
    ``hk.RequestError`` (``"raise"``: the whole batch fails). Each request's response header
    ``X-Batch-Size`` says how many requests its batch had."""
    from types import ModuleType

    namespace = ModuleType("audio_model")
    exec(AUDIO_MODEL_PY, namespace.__dict__)
    weights = _seeded_state(namespace.SpectrogramNet(), seed=1)
    if validating:
        bases = "hk.PerRequestErrors, BaseHandler" if base == "torchserve" else "BaseHandler"
        handler = AUDIO_VALIDATING_HANDLER_PY.format(base=BASES[base], bases=bases, on_bad_wav=ON_BAD_WAV[bad_wav])
    else:
        handler = AUDIO_HANDLER_PY.format(base=BASES[base])
    files = {"model.py": AUDIO_MODEL_PY, "handler.py": handler, "index_to_name.json": json.dumps(AUDIO_LABELS)}
    manifest = {"modelName": "sounds", "handler": "handler.py", "modelFile": "model.py", "serializedFile": "model.pt"}
    return _write(path, files, manifest, weights)


# ------------------------------------------------------------------ ranker: several inputs, ragged lists

RANKER_USERS = 10
RANKER_ITEMS = 40

RANKER_MODEL_PY = """\
import torch
from torch import nn


class Ranker(nn.Module):
    def __init__(self):
        super().__init__()
        self.users = nn.Embedding(10, 8)
        self.items = nn.Embedding(40, 8)

    def forward(self, user_ids, item_ids, mask):
        user = self.users(user_ids)
        items = self.items(item_ids)
        scores = (items * user.unsqueeze(1)).sum(-1)
        return scores.masked_fill(~mask, float("-inf"))
"""

#: The line of ``model.py`` that indexes the item embedding (an item id >= 40 fails there).
RANKER_EMBEDDING_LINE = 13

RANKER_HANDLER_PY = """\
import torch
from {base} import BaseHandler


class RecsHandler(BaseHandler):
    def preprocess(self, data):
        requests = [row.get("data") or row.get("body") for row in data]
        longest = max(len(r["item_ids"]) for r in requests)
        user_ids = torch.tensor([r["user_id"] for r in requests])
        item_ids = torch.zeros(len(requests), longest, dtype=torch.long)
        mask = torch.zeros(len(requests), longest, dtype=torch.bool)
        for i, r in enumerate(requests):
            item_ids[i, : len(r["item_ids"])] = torch.tensor(r["item_ids"])
            mask[i, : len(r["item_ids"])] = True
        return user_ids, item_ids, mask

    def inference(self, inputs):
        with torch.inference_mode():
            return self.model(*inputs), inputs[1], inputs[2]

    def postprocess(self, outputs):
        scores, item_ids, mask = outputs
        answers = []
        for row_scores, row_items, row_mask in zip(scores, item_ids, mask):
            ranked = sorted(zip(row_items[row_mask].tolist(), row_scores[row_mask].tolist()), key=lambda p: -p[1])
            answers.append([{{"item_id": item, "score": round(score, 4)}} for item, score in ranked])
        return answers
"""

#: The line of handler.py whose ``self.model(*inputs)`` call reaches the embedding.
RANKER_INFERENCE_LINE = 19


def ranker_request(user_id: int, item_ids: list[int]) -> dict[str, object]:
    """A ranker request's JSON body."""
    return {"user_id": user_id, "item_ids": list(item_ids)}


def ranker_dir(path: Path, *, base: str = "torchserve") -> Path:
    """model.py (``Ranker``: user and item embeddings), handler.py (``RecsHandler``), model.pt."""
    from types import ModuleType

    namespace = ModuleType("ranker_model")
    exec(RANKER_MODEL_PY, namespace.__dict__)
    weights = _seeded_state(namespace.Ranker(), seed=2)
    files = {"model.py": RANKER_MODEL_PY, "handler.py": RANKER_HANDLER_PY.format(base=BASES[base])}
    manifest = {"modelName": "recs", "handler": "handler.py", "modelFile": "model.py", "serializedFile": "model.pt"}
    return _write(path, files, manifest, weights)


# ------------------------------------------------------------------ image filter: PNG bytes out

FILTER_MODEL_PY = """\
import torch
from torch import nn


class Blur(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1, groups=3, bias=False)

    def forward(self, x):
        return self.conv(x).clamp(0, 1)
"""

FILTER_HANDLER_PY = """\
import io

import numpy as np
import torch
from PIL import Image
from {base} import BaseHandler


class BlurHandler(BaseHandler):
    def preprocess(self, data):
        images = []
        for row in data:
            image = Image.open(io.BytesIO(row.get("data") or row.get("body"))).convert("RGB")
            pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0)
            images.append(pixels.permute(2, 0, 1).unsqueeze(0))
        return images

    def inference(self, images):
        with torch.inference_mode():
            return [self.model(image) for image in images]

    def postprocess(self, outputs):
        answers = []
        for index, out in enumerate(outputs):
            pixels = (out[0].permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
            buffer = io.BytesIO()
            Image.fromarray(pixels).save(buffer, format="PNG")
            self.context.set_response_content_type(index, "image/png")
            answers.append(buffer.getvalue())
        return answers
"""


def png_bytes(width: int = 24, height: int = 16, *, seed: int = 0) -> bytes:
    """A small RGB PNG of random pixels (a fixed seed)."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def image_filter_dir(path: Path, *, base: str = "torchserve") -> Path:
    """model.py (``Blur``: a fixed 3x3 box blur per channel), handler.py (``BlurHandler``), model.pt."""
    weights = {"conv.weight": torch.full((3, 1, 3, 3), 1.0 / 9.0)}
    files = {"model.py": FILTER_MODEL_PY, "handler.py": FILTER_HANDLER_PY.format(base=BASES[base])}
    manifest = {"modelName": "blur", "handler": "handler.py", "modelFile": "model.py", "serializedFile": "model.pt"}
    return _write(path, files, manifest, weights)


# ------------------------------------------------------------------ streaming: a character GRU

CHARS = "abcdefghijklmnopqrstuvwxyz "

STREAM_MODEL_PY = """\
from torch import nn


class CharGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(27, 16)
        self.gru = nn.GRU(16, 32, batch_first=True)
        self.out = nn.Linear(32, 27)

    def forward(self, chars, state=None):
        hidden, state = self.gru(self.embed(chars), state)
        return self.out(hidden[:, -1]), state
"""

STREAM_HANDLER_PY = """\
import torch
from {send_from} import send_intermediate_predict_response
from {base} import BaseHandler

CHARS = "abcdefghijklmnopqrstuvwxyz "


class CharStreamHandler(BaseHandler):
    length = 8

    def preprocess(self, data):
        prompts = []
        for row in data:
            text = row.get("data") or row.get("body")
            if isinstance(text, (bytes, bytearray)):
                text = text.decode("utf-8")
            prompts.append(torch.tensor([[CHARS.index(c) for c in text.lower()]]))
        return prompts

    def inference(self, prompts):
        texts = []
        with torch.inference_mode():
            for prompt in prompts:
                logits, state = self.model(prompt)
                texts.append("")
                for _ in range(self.length):
                    char = int(logits.argmax(-1))
                    texts[-1] += CHARS[char]
                    logits, state = self.model(torch.tensor([[char]]), state)
        for step in range(self.length):
            chunk = {{i: text[step] for i, text in enumerate(texts)}}
            ids = {{i: self.context.request_ids[i] for i in chunk}}
            send_intermediate_predict_response(chunk, ids, "Intermediate Prediction success", 200, self.context)
        return texts

    def postprocess(self, texts):
        return texts
"""


def char_stream_dir(path: Path, *, base: str = "torchserve", send_from: str = "ts.handler_utils.utils") -> Path:
    """model.py (``CharGRU``), handler.py (``CharStreamHandler``: 8 characters per prompt, one
    chunk per character, the text as the final answer), model.pt. ``send_from`` is the module
    ``send_intermediate_predict_response`` is imported from."""
    from types import ModuleType

    namespace = ModuleType("stream_model")
    exec(STREAM_MODEL_PY, namespace.__dict__)
    weights = _seeded_state(namespace.CharGRU(), seed=3)
    files = {"model.py": STREAM_MODEL_PY, "handler.py": STREAM_HANDLER_PY.format(base=BASES[base], send_from=send_from)}
    manifest = {"modelName": "chars", "handler": "handler.py", "modelFile": "model.py", "serializedFile": "model.pt"}
    return _write(path, files, manifest, weights)
