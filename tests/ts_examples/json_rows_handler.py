"""The smallest useful custom handler: JSON lists of 4 numbers in, the model's scores out.

TorchServe's BaseHandler.preprocess is ``torch.as_tensor(data)``, which cannot take request
dicts, so every example that serves JSON overrides it like this.
"""

import torch

from handlerkit.handlers.base import BaseHandler as Base


class JsonRows(Base):
    """The model on each request's ``body`` (or ``data``) list."""

    def preprocess(self, data):
        rows = [row.get("data") or row.get("body") for row in data]
        return torch.tensor(rows, dtype=torch.float32)
