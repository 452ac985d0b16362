"""A handler whose answer for one request depends on the others: it scales the whole batch by
its largest value. Not a TorchServe example; the counter-example the batch-parity check exists
for.
"""

import json

import torch

from handlerkit.handlers.base import BaseHandler as Base


class BatchMaxScaled(Base):
    """The model on the requests' numbers divided by the largest absolute value in the batch."""

    def preprocess(self, data):
        rows = []
        for row in data:
            value = row.get("data") or row.get("body")
            if isinstance(value, (bytes, bytearray)):
                value = json.loads(value)
            rows.append(value)
        x = torch.tensor(rows, dtype=torch.float32)
        return x / x.abs().max()
