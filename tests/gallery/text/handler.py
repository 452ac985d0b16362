"""Text: a sentence in (text/plain, or UTF-8 bytes), ``{label: probability}`` out, on
handlerkit's BaseHandler. Words are looked up in vocab.txt and padded with id 0, which the
model leaves out of its mean."""

import os

import torch

from handlerkit import BaseHandler


class SentimentHandler(BaseHandler):
    def initialize(self, context):
        super().initialize(context)
        with open(os.path.join(context.system_properties["model_dir"], "vocab.txt"), encoding="utf-8") as f:
            self.vocab = [line.rstrip("\n") for line in f]
        self.ids = {word: i for i, word in enumerate(self.vocab)}

    def preprocess(self, data):
        sentences = []
        for row in data:
            text = row.get("data") or row.get("body")
            if isinstance(text, (bytes, bytearray)):
                text = text.decode("utf-8")
            sentences.append([self.ids.get(word, 1) for word in text.lower().split()])
        length = max(len(ids) for ids in sentences)
        return torch.tensor([ids + [0] * (length - len(ids)) for ids in sentences])

    def postprocess(self, data):
        probabilities = torch.softmax(data, dim=1).tolist()
        return [{self.mapping[str(i)]: round(p, 4) for i, p in enumerate(row)} for row in probabilities]
