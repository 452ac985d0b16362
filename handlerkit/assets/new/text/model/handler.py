"""{{name}}: a text classifier. A request is text (text/plain, a JSON string, or raw UTF-8
bytes); its answer is {"label": ..., "probability": ...}, the likeliest of the classes
index_to_name.json names.

A request that is not text is refused alone: self.refuse(index, message, fix=...) gives that
client 400 and {"code": 400, "error": message, "fix": fix}, and the other requests of the
batch are answered as usual. (Raising handlerkit's RequestError instead would fail every
request of the server's batch with that 400, as any exception does in TorchServe.)

TorchServe loads this file as it is, with handlerkit installed on the server (list it in a
requirements.txt). On TorchServe's own BaseHandler (ts.torch_handler.base_handler) the stages
and self.model, self.mapping, self.device are the same; keep refuse there by mixing it in
first: class SentimentClassifier(PerRequestErrors, BaseHandler), with PerRequestErrors from
handlerkit.handlers. BaseHandler.initialize loads model.py's class with model.pt and
index_to_name.json; its inference runs the model on self.device.
"""

import os
import re

import torch

from handlerkit.handlers import BaseHandler

PAD, UNKNOWN = 0, 1  # the ids of vocab.txt's first two lines, <pad> and <unk>
WORD = re.compile(r"[a-z']+")
SEND = "send UTF-8 text as the body (text/plain), or a JSON string"


class SentimentClassifier(BaseHandler):
    """initialize: also reads vocab.txt; preprocess: texts to padded token ids (a request that
    is not text refused); postprocess: the top class of each request that reached the model."""

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
                    self.refuse(index, f"expected UTF-8 text, got bytes that are not ({exc})", fix=SEND)
                    continue  # left out of the batch: its answer is the error item
            if not isinstance(text, str):
                self.refuse(index, f"expected text, got {type(text).__name__}", fix=SEND)
                continue
            words = WORD.findall(text.lower())[: self.max_tokens]
            rows.append([self.ids.get(word, UNKNOWN) for word in words])
        if not rows:  # every request was refused: inference and postprocess do not run
            return None
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
