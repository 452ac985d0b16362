"""Tabular: a JSON body ``{"features": [4 floats]}`` in, ``{"label", "probability"}`` out,
written on TorchServe's own BaseHandler (its initialize loads model.py, model.pt and
index_to_name.json; its inference runs the model)."""

import torch
from ts.torch_handler.base_handler import BaseHandler


class TabularHandler(BaseHandler):
    def preprocess(self, data):
        bodies = [row.get("data") or row.get("body") for row in data]
        return torch.tensor([body["features"] for body in bodies], dtype=torch.float32)

    def postprocess(self, data):
        top, index = torch.softmax(data, dim=1).max(dim=1)
        return [
            {"label": self.mapping[str(i)], "probability": round(p, 4)} for i, p in zip(index.tolist(), top.tolist())
        ]
