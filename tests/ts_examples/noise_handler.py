"""Noise sampled per request, shaped like pytorch/serve
examples/dcgan_fashiongen/dcgan_fashiongen_handler.py (which builds a noise tensor for each
request in preprocess and runs the generator on them).
"""

import json

import torch

from handlerkit.handlers.base import BaseHandler as Base


class Noisy(Base):
    """The model on each request's 4 numbers plus ``torch.randn`` noise drawn for that request."""

    def preprocess(self, data):
        rows = []
        for row in data:
            value = row.get("data") or row.get("body")
            if isinstance(value, (bytes, bytearray)):
                value = json.loads(value)
            rows.append(torch.tensor(value, dtype=torch.float32) + 0.5 * torch.randn(4))
        return torch.stack(rows)
