"""What the hk.show tests share: the real shapes classifier run on four fixture images, and
ways to read what a panel or a figure holds (the test modules mirror ``handlerkit/viz/``)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import matplotlib
import matplotlib.text
import numpy as np
import pytest
import torch

import handlerkit as hk
from handlerkit.viz.dispatch import panels_for
from handlerkit.viz.handler_view import view_for

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parent.parent
CLASSIFIER = ROOT / "fixtures" / "models" / "image_classifier"
IMAGES = ROOT / "fixtures" / "images"
NAMES = ("circle.png", "star.jpg", "square.png", "triangle.png")


@pytest.fixture(scope="module")
def classifier() -> SimpleNamespace:
    """The shapes classifier run on four fixture images: harness, run, and what it computed."""
    h = hk.Harness("image_classifier", hk.MockContext.from_model_dir(str(CLASSIFIER)))
    run = h.run(hk.batch(*(hk.Request.from_file(str(IMAGES / name)) for name in NAMES)))
    pixels = run.stages["preprocess"].output
    probs = torch.softmax(run.stages["inference"].output, dim=1)
    return SimpleNamespace(h=h, run=run, pixels=pixels, probs=probs, handler=h.handler)


def shape_masks(pixels: torch.Tensor, handler) -> torch.Tensor:
    """[N, H, W] bool: the pixels far from the image border's colour (each image's shape)."""
    view = view_for(None, handler)
    mean = torch.tensor(view.mean).view(1, 3, 1, 1)
    std = torch.tensor(view.std).view(1, 3, 1, 1)
    rgb = pixels * std + mean
    border = torch.cat([rgb[:, :, 0], rgb[:, :, -1], rgb[:, :, :, 0], rgb[:, :, :, -1]], dim=2).mean(2)
    return (rgb - border[:, :, None, None]).abs().sum(1) > 0.3


def panels(obj, *, handler=None, image=None, top_k: int = 5, max_images: int = 16) -> list:
    """The panels ``show`` would draw for `obj` (as it calls the dispatch)."""
    return panels_for(obj, view_for(obj, handler), image=image, top_k=top_k, max_images=max_images)


def kinds(obj, **kwargs) -> list[str]:
    return [p.kind for p in panels(obj, **kwargs)]


def drawn_images(fig) -> list[np.ndarray]:
    return [np.asarray(im.get_array()) for ax in fig.get_axes() for im in ax.get_images()]


def texts(fig) -> str:
    found = [t.get_text() for t in fig.findobj(matplotlib.text.Text)]
    found += [cell.get_text().get_text() for ax in fig.get_axes() for table in ax.tables
              for cell in table.get_celld().values()]
    return "\n".join(found)
