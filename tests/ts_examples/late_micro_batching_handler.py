"""Micro-batching set up in ``initialize`` instead of ``__init__`` (a common variation of
pytorch/serve examples/micro_batching).

Under TorchServe's worker this ``MicroBatching`` is never called: ts/model_loader.py took
``handler.handle`` (BaseHandler.handle) before ``initialize`` replaced the attribute.
"""

import torch
from ts.handler_utils.micro_batching import MicroBatching

from handlerkit.handlers.base import BaseHandler as Base


class LateMicroBatched(Base):
    """Like MicroBatched, but ``self.handle`` is assigned in ``initialize``."""

    def __init__(self):
        super().__init__()
        self.seen_batches = []

    def initialize(self, context):
        super().initialize(context)
        self.handle = MicroBatching(self, micro_batch_size=4)

    def preprocess(self, data):
        rows = [row.get("data") or row.get("body") for row in data]
        return torch.tensor(rows, dtype=torch.float32)

    def inference(self, data, *args, **kwargs):
        self.seen_batches.append(int(data.shape[0]))
        return super().inference(data, *args, **kwargs)
