"""{{name}}: a tabular classifier. A request is a JSON body {"features": [4 numbers]} (or the
bare list); its answer is {"label": ..., "probability": ...}, the likeliest of the classes
index_to_name.json names.

TorchServe loads this file as it is, with handlerkit installed on the server (list it in a
requirements.txt); without handlerkit, import BaseHandler from ts.torch_handler.base_handler
instead (the stages and the attributes self.model, self.mapping, self.device are the same) and
raise ValueError where this raises RequestError. A RequestError names the request at fault and
what to send; TorchServe answers the client 400 with its message instead of 503.
BaseHandler.initialize loads model.py's class with model.pt and index_to_name.json; its
inference runs the model on self.device.
"""

import json

import torch

from handlerkit.errors import RequestError
from handlerkit.handlers import BaseHandler


class IrisClassifier(BaseHandler):
    """preprocess: each request's features to one row of a float tensor; postprocess: each
    request's top class."""

    num_features = 4

    @property
    def what_to_send(self):
        return f'send a JSON body {{"features": [{self.num_features} numbers]}} (application/json)'

    def preprocess(self, data):
        rows = []
        for index, row in enumerate(data):
            body = row.get("data") or row.get("body")  # a form field "data", or the raw POST body
            try:
                if isinstance(body, (bytes, bytearray, str)):  # JSON sent without its content type
                    body = json.loads(body)
            except ValueError as exc:  # not JSON, or not UTF-8
                raise RequestError(
                    f"request {index}: expected a JSON body, got bytes that are not JSON ({exc})",
                    index,
                    fix=self.what_to_send,
                ) from exc
            features = body.get("features") if isinstance(body, dict) else body
            if not (
                isinstance(features, list)
                and len(features) == self.num_features
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in features)
            ):
                raise RequestError(
                    f'request {index}: expected {{"features": [{self.num_features} numbers]}}, got {json.dumps(body)[:80]}',
                    index,
                    fix=self.what_to_send,
                )
            rows.append(features)
        return torch.tensor(rows, dtype=torch.float32, device=self.device)

    def postprocess(self, data):
        probabilities = torch.softmax(data, dim=1)
        best, classes = probabilities.max(dim=1)
        return [
            {"label": self.mapping[str(c)], "probability": round(p, 4)}
            for c, p in zip(classes.tolist(), best.tolist())
        ]
