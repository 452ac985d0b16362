"""{{name}}: a tabular classifier. A request is a JSON body {"features": [4 numbers]} (or the
bare list); its answer is {"label": ..., "probability": ...}, the likeliest of the classes
index_to_name.json names.

A request of another shape is refused alone: self.refuse(index, message, fix=...) gives that
client 400 and {"code": 400, "error": message, "fix": fix}, and the other requests of the
batch are answered as usual. (Raising handlerkit's RequestError instead would fail every
request of the server's batch with that 400, as any exception does in TorchServe.)

TorchServe loads this file as it is, with handlerkit installed on the server (list it in a
requirements.txt). On TorchServe's own BaseHandler (ts.torch_handler.base_handler) the stages
and self.model, self.mapping, self.device are the same; keep refuse there by mixing it in
first: class IrisClassifier(PerRequestErrors, BaseHandler), with PerRequestErrors from
handlerkit.handlers. BaseHandler.initialize loads model.py's class with model.pt and
index_to_name.json; its inference runs the model on self.device.
"""

import json

import torch

from handlerkit.handlers import BaseHandler


class IrisClassifier(BaseHandler):
    """preprocess: each request's features to one row of a float tensor (a request without them
    refused); postprocess: the top class of each request that reached the model."""

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
                self.refuse(index, f"expected a JSON body, got bytes that are not JSON ({exc})", fix=self.what_to_send)
                continue  # left out of the batch: its answer is the error item
            features = body.get("features") if isinstance(body, dict) else body
            if not (
                isinstance(features, list)
                and len(features) == self.num_features
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in features)
            ):
                self.refuse(
                    index,
                    f'expected {{"features": [{self.num_features} numbers]}}, got {json.dumps(body)[:80]}',
                    fix=self.what_to_send,
                )
                continue
            rows.append(features)
        if not rows:  # every request was refused: inference and postprocess do not run
            return None
        return torch.tensor(rows, dtype=torch.float32, device=self.device)

    def postprocess(self, data):
        probabilities = torch.softmax(data, dim=1)
        best, classes = probabilities.max(dim=1)
        return [
            {"label": self.mapping[str(c)], "probability": round(p, 4)}
            for c, p in zip(classes.tolist(), best.tolist())
        ]
