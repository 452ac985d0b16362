"""The model class. TorchServe builds it with no arguments, then loads model.pt into it; a
modelFile must define exactly one class."""

from torch import nn


class IrisNet(nn.Module):
    """A small MLP: 4 features in, one score per class out. Replace it with your own."""

    def __init__(self, num_features=4, hidden=16, num_classes=3):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(num_features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, features):
        return self.layers(features)
