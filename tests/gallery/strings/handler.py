"""Strings out: a sentence in (text/plain), the sentence with each word's part of speech out,
as a plain string (``"the/DET cat/NOUN"``, which TorchServe sends as it is), on TorchServe's
BaseHandler. The model scores every tag for every word."""

import os

import torch
from ts.torch_handler.base_handler import BaseHandler


class TaggerHandler(BaseHandler):
    def initialize(self, context):
        super().initialize(context)
        with open(os.path.join(context.system_properties["model_dir"], "vocab.txt"), encoding="utf-8") as f:
            self.vocab = [line.rstrip("\n") for line in f]
        self.ids = {word: i for i, word in enumerate(self.vocab)}

    def preprocess(self, data):
        self.words = [(row.get("data") or row.get("body")).split() for row in data]
        length = max(len(words) for words in self.words)
        ids = [[self.ids.get(w.lower(), 1) for w in words] + [0] * (length - len(words)) for words in self.words]
        return torch.tensor(ids)

    def postprocess(self, data):
        tags = data.argmax(dim=-1).tolist()  # [N, words]: the best tag of each word
        return [
            " ".join(f"{word}/{self.mapping[str(tag)]}" for word, tag in zip(words, row))
            for words, row in zip(self.words, tags)
        ]
