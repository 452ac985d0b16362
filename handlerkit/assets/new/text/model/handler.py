"""{{name}}: a text classifier. A request is text (text/plain, a JSON string, or raw UTF-8
bytes); its answer is {"label": ..., "probability": ...}, the likeliest of the classes
index_to_name.json names.

TorchServe loads this file as it is, with handlerkit installed on the server (list it in a
requirements.txt); without handlerkit, import BaseHandler from ts.torch_handler.base_handler
instead (the stages and the attributes self.model, self.mapping, self.device are the same) and
raise ValueError where this raises RequestError. A RequestError names the request at fault and
what to send; TorchServe answers the client 400 with its message instead of 503.
BaseHandler.initialize loads model.py's class with model.pt and index_to_name.json; its
inference runs the model on self.device.
"""

import os
import re

import torch

from handlerkit.errors import RequestError
from handlerkit.handlers import BaseHandler

PAD, UNKNOWN = 0, 1  # the ids of vocab.txt's first two lines, <pad> and <unk>
WORD = re.compile(r"[a-z']+")
SEND = "send UTF-8 text as the body (text/plain), or a JSON string"


class SentimentClassifier(BaseHandler):
    """initialize: also reads vocab.txt; preprocess: texts to padded token ids; postprocess:
    each request's top class."""

    max_tokens = 256  # longer texts are cut

    def initialize(self, context):
        super().initialize(context)
        # The worker runs in the model dir; the context names it all the same.
        path = os.path.join(context.system_properties.get("model_dir") or ".", "vocab.txt")
        with open(path, encoding="utf-8") as f:
            self.vocab = [line.rstrip("\n") for line in f]  # line i is token id i
        self.ids = {token: i for i, token in enumerate(self.vocab)}

    def preprocess(self, data):
        rows = []
        for index, row in enumerate(data):
            text = row.get("data") or row.get("body")  # a form field "data", or the raw POST body
            if isinstance(text, (bytes, bytearray)):
                try:
                    text = text.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise RequestError(
                        f"request {index}: expected UTF-8 text, got bytes that are not ({exc})", index, fix=SEND
                    ) from exc
            if not isinstance(text, str):
                raise RequestError(f"request {index}: expected text, got {type(text).__name__}", index, fix=SEND)
            words = WORD.findall(text.lower())[: self.max_tokens]
            rows.append([self.ids.get(word, UNKNOWN) for word in words])
        # Padded to the longest text; the model's mean leaves padding out, so each request
        # gets the same answer alone as in any batch.
        ids = torch.full((len(rows), max(1, *map(len, rows))), PAD, dtype=torch.long)
        for i, row_ids in enumerate(rows):
            ids[i, : len(row_ids)] = torch.tensor(row_ids, dtype=torch.long)
        return ids.to(self.device)

    def postprocess(self, data):
        probabilities = torch.softmax(data, dim=1)
        best, classes = probabilities.max(dim=1)
        return [
            {"label": self.mapping[str(c)], "probability": round(p, 4)}
            for c, p in zip(classes.tolist(), best.tolist())
        ]
