"""Micro-batching, shaped like pytorch/serve examples/micro_batching/micro_batching_handler.py.

TorchServe's worker (ts/model_loader.py, ``_get_class_entry_point``) takes ``handler.handle``
right after constructing the handler and *before* ``initialize`` runs, so the example builds
its ``MicroBatching`` in ``__init__``; ``initialize`` only sets the micro-batch size from the
model config (``micro_batching: {micro_batch_size: N}``).
"""

import torch
from ts.handler_utils.micro_batching import MicroBatching

from handlerkit.handlers.base import BaseHandler as Base


class MicroBatched(Base):
    """JSON lists of 4 numbers in, the model's scores out, ``micro_batch_size`` requests at a time."""

    def __init__(self):
        super().__init__()
        self.seen_batches = []  # the batch size of every inference call, in call order
        self.handle = MicroBatching(self)

    def initialize(self, context):
        super().initialize(context)
        settings = (context.model_yaml_config or {}).get("micro_batching", {})
        self.handle.micro_batch_size = settings.get("micro_batch_size", 1)

    def preprocess(self, data):
        rows = [row.get("data") or row.get("body") for row in data]
        return torch.tensor(rows, dtype=torch.float32)

    def inference(self, data, *args, **kwargs):
        self.seen_batches.append(int(data.shape[0]))
        return super().inference(data, *args, **kwargs)
