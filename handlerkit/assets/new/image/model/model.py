"""The model class. TorchServe builds it with no arguments, then loads model.pt into it; a
modelFile must define exactly one class."""

import torch
from torch import nn


class ColorNet(nn.Module):
    """A small CNN: a 3x64x64 image in, one score per class out. Replace it with your own."""

    def __init__(self, num_classes=3):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, kernel_size=3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.classifier = nn.Linear(8, num_classes)

    def forward(self, images):
        return self.classifier(torch.flatten(self.features(images), 1))
