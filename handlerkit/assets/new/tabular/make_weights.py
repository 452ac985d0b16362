"""Writes model/model.pt, the weights the handler serves: built from code, seeded, nothing
downloaded. `handlerkit new` ran it; run it again with `python make_weights.py`.

The model classifies iris flowers (sepal length, sepal width, petal length, petal width, in
cm) by the nearest species mean of Fisher's iris data, without training: the first layer
passes the four features through (they are positive, so ReLU keeps them), and the second
scores each species k as 4 (mean_k . x - |mean_k|^2 / 2), which is largest for the nearest
mean. The other hidden units keep their seeded random weights, which the second layer ignores.

Replace this with your training: save a state_dict of model.py's class as model/model.pt.
"""

import importlib.util
import pathlib

import torch

MODEL_DIR = pathlib.Path(__file__).resolve().parent / "model"
# The species means of Fisher's iris data (50 flowers each), in index_to_name.json's order.
MEANS = [[5.006, 3.428, 1.462, 0.246], [5.936, 2.770, 4.260, 1.326], [6.588, 2.974, 5.552, 2.026]]
SHARPNESS = 4.0


def model_class(model_dir):
    """model.py's class, loaded from its file (nothing added to sys.path or sys.modules)."""
    spec = importlib.util.spec_from_file_location("model", pathlib.Path(model_dir) / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.IrisNet


def main(model_dir=MODEL_DIR):
    with torch.random.fork_rng(devices=[]):  # seeded here, the caller's random state untouched
        torch.manual_seed(0)
        model = model_class(model_dir)()
    first, _, second = model.layers
    means = torch.tensor(MEANS)
    with torch.no_grad():
        first.weight[:4] = torch.eye(4)
        first.bias[:4] = 0.0
        second.weight.zero_()
        second.weight[:, :4] = SHARPNESS * means
        second.bias.copy_(-SHARPNESS * (means**2).sum(dim=1) / 2)
    path = pathlib.Path(model_dir) / "model.pt"
    torch.save(model.state_dict(), path)
    return path


if __name__ == "__main__":
    print("wrote", main())
