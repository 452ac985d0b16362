"""Writes model/model.pt, the weights the handler serves: built from code, seeded, nothing
downloaded. `handlerkit new` ran it; run it again with `python make_weights.py`.

The model is made to see colour without training: the first layer copies each colour channel
(the centre tap of its 3x3 kernel), ReLU keeps what is brighter than mid-grey (the handler
normalises pixels to [-1, 1]), the pooling averages it over the image, and the classifier
scores red, green and blue by how much of each the image holds. The other five channels of
the first layer keep their seeded random weights, which the classifier ignores.

Replace this with your training: save a state_dict of model.py's class as model/model.pt.
"""

import importlib.util
import pathlib

import torch

MODEL_DIR = pathlib.Path(__file__).resolve().parent / "model"


def model_class(model_dir):
    """model.py's class, loaded from its file (nothing added to sys.path or sys.modules)."""
    spec = importlib.util.spec_from_file_location("model", pathlib.Path(model_dir) / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ColorNet


def main(model_dir=MODEL_DIR):
    with torch.random.fork_rng(devices=[]):  # seeded here, the caller's random state untouched
        torch.manual_seed(0)
        model = model_class(model_dir)()
    with torch.no_grad():
        conv, classifier = model.features[0], model.classifier
        conv.weight[:3].zero_()
        conv.bias.zero_()
        for channel in range(3):
            conv.weight[channel, channel, 1, 1] = 1.0
        classifier.weight.zero_()
        classifier.bias.zero_()
        classifier.weight[:, :3] = 10.0 * torch.eye(3)
    path = pathlib.Path(model_dir) / "model.pt"
    torch.save(model.state_dict(), path)
    return path


if __name__ == "__main__":
    print("wrote", main())
