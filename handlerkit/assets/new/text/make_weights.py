"""Writes model/model.pt, the weights the handler serves: built from code, seeded, nothing
downloaded. `handlerkit new` ran it; run it again with `python make_weights.py`.

The model is made to read sentiment without training: the first dimension of a positive
word's embedding is 1, the second dimension of a negative word's is 1, and the classifier
compares the two; every other word (and every other dimension, seeded random) adds nothing
to the scores.

Replace this with your training: save a state_dict of model.py's class as model/model.pt,
with one embedding row per line of model/vocab.txt (and the classes of index_to_name.json).
"""

import importlib.util
import pathlib

import torch

MODEL_DIR = pathlib.Path(__file__).resolve().parent / "model"
POSITIVE = {"good", "great", "love", "loved", "excellent", "wonderful", "best", "enjoyed", "happy", "fun"}
NEGATIVE = {"bad", "awful", "hate", "hated", "terrible", "worst", "boring", "poor", "sad", "dull"}


def model_class(model_dir):
    """model.py's class, loaded from its file (nothing added to sys.path or sys.modules)."""
    spec = importlib.util.spec_from_file_location("model", pathlib.Path(model_dir) / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SentimentNet


def main(model_dir=MODEL_DIR):
    model_dir = pathlib.Path(model_dir)
    vocab = (model_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    with torch.random.fork_rng(devices=[]):  # seeded here, the caller's random state untouched
        torch.manual_seed(0)
        model = model_class(model_dir)()
    embedding, classifier = model.embedding.weight, model.classifier
    if len(vocab) > embedding.shape[0]:
        raise SystemExit(f"vocab.txt has {len(vocab)} tokens but the model embeds {embedding.shape[0]}: raise VOCAB_SIZE")
    with torch.no_grad():
        embedding[:, :2] = 0.0
        for i, token in enumerate(vocab):
            if token in POSITIVE:
                embedding[i, 0] = 1.0
            elif token in NEGATIVE:
                embedding[i, 1] = 1.0
        embedding[0] = 0.0  # <pad>
        classifier.weight.zero_()
        classifier.bias.zero_()
        classifier.weight[:, :2] = 8.0 * torch.tensor([[1.0, -1.0], [-1.0, 1.0]])
    path = model_dir / "model.pt"
    torch.save(model.state_dict(), path)
    return path


if __name__ == "__main__":
    print("wrote", main())
