"""A 1-D signal: int16 PCM samples (a raw ``application/octet-stream`` body, 8 kHz mono) in,
``{"event", "confidence"}`` out, on TorchServe's BaseHandler. Each clip is cut or
zero-padded to 1024 samples and scaled to [-1, 1]."""

import torch
from ts.torch_handler.base_handler import BaseHandler

SAMPLES = 1024


class SoundEventHandler(BaseHandler):
    def preprocess(self, data):
        clips = []
        for row in data:
            pcm = row.get("data") or row.get("body")
            wave = torch.frombuffer(bytearray(pcm), dtype=torch.int16).float() / 32768
            clips.append(torch.nn.functional.pad(wave[:SAMPLES], (0, max(0, SAMPLES - len(wave)))))
        return torch.stack(clips).unsqueeze(1)  # [N, 1, SAMPLES]: one channel

    def postprocess(self, data):
        top, index = torch.softmax(data, dim=1).max(dim=1)
        return [
            {"event": self.mapping[str(i)], "confidence": round(p, 4)} for i, p in zip(index.tolist(), top.tolist())
        ]
