"""A tiny CNN that classifies the synthetic "shapes" images.

Classes, in output order: circle, square, triangle, star, cross (see index_to_name.json).
Input: float [N, 3, 224, 224], pre-processed as TorchServe's ImageClassifier does:
Resize(256) -> CenterCrop(224) -> ToTensor() -> Normalize(ImageNet mean, std).
Output: logits [N, 5].

Written by `python -m fixtures.builder`: edit MODEL_SOURCE in fixtures/builder/spec.py and
rebuild rather than editing this file. TorchServe instantiates the one class defined here
with no arguments and loads model.pt into it.
"""

import torch
import torch.nn.functional as F
from torch import nn


def _conv_block(in_channels, out_channels, stride):
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


def _distance_from_border_colour(x):
    # Shape and background colours are random, so the net looks at how far each pixel is
    # from the mean colour of the image border (mostly background): [N, 3, H, W] -> [N, 1, H, W].
    border = torch.cat([x[:, :, 0], x[:, :, -1], x[:, :, :, 0], x[:, :, :, -1]], dim=2)
    background = border.mean(dim=2)[:, :, None, None]
    return (x - background).abs().sum(dim=1, keepdim=True)


class ShapesClassifier(nn.Module):
    num_classes = 5

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            _conv_block(1, 16, 1),  # 56 x 56
            _conv_block(16, 32, 2),  # 28 x 28
            _conv_block(32, 64, 2),  # 14 x 14
            _conv_block(64, 64, 2),  # 7 x 7
        )
        # The last registered module: handlers read its out_features as the label count.
        self.fc = nn.Linear(64, self.num_classes)

    def forward(self, x):
        # The shapes are large and flat, so a quarter of the resolution is plenty (224 -> 56).
        x = F.avg_pool2d(x, 4)
        x = _distance_from_border_colour(x)
        x = self.features(x)
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)
