"""What the hk.show tests share: the real shapes classifier run on four fixture images, the
issue's tabular handler (a TorchServe ``BaseHandler``: JSON features in, label and probability
out) run on three requests, and ways to read what a panel or a figure holds (the test modules
mirror ``handlerkit/viz/``)."""

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

TABULAR_MODEL_PY = """
import torch


class TabularModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.linear(x)
"""

TABULAR_HANDLER_PY = """
import torch
from ts.torch_handler.base_handler import BaseHandler


class TabularHandler(BaseHandler):
    def preprocess(self, data):
        bodies = [row.get("data") or row.get("body") for row in data]
        return torch.tensor([body["features"] for body in bodies], dtype=torch.float32)

    def postprocess(self, data):
        top, index = torch.softmax(data, dim=1).max(dim=1)
        return [{"label": self.mapping[str(i)], "probability": round(p, 4)}
                for i, p in zip(index.tolist(), top.tolist())]
"""
SPECIES = ("setosa", "versicolor", "virginica")
FEATURES = ([5.1, 3.5, 1.4, 0.2], [6.2, 2.9, 4.3, 1.3], [7.7, 3.0, 6.1, 2.3])


@pytest.fixture(scope="module")
def classifier() -> SimpleNamespace:
    """The shapes classifier run on four fixture images: harness, run, and what it computed."""
    h = hk.Harness("image_classifier", hk.MockContext.from_model_dir(str(CLASSIFIER)))
    run = h.run(hk.batch(*(hk.Request.from_file(str(IMAGES / name)) for name in NAMES)))
    pixels = run.stages["preprocess"].output
    probs = torch.softmax(run.stages["inference"].output, dim=1)
    return SimpleNamespace(h=h, run=run, pixels=pixels, probs=probs, handler=h.handler)


@pytest.fixture(scope="module")
def tabular(tmp_path_factory) -> SimpleNamespace:
    """The issue's tabular handler, a ``ts.torch_handler.base_handler.BaseHandler`` subclass
    (needs torchserve: mark the test ``torchserve``), run on the three rows of ``FEATURES``."""
    from conftest import eager_manifest, write_model_dir

    model_dir = write_model_dir(tmp_path_factory.mktemp("tabular"), TABULAR_MODEL_PY, labels=list(SPECIES),
                                manifest=eager_manifest(modelName="tabular", handler="handler.py"))
    (model_dir / "handler.py").write_text(TABULAR_HANDLER_PY)
    h = hk.Harness("handler.py", hk.MockContext.from_model_dir(str(model_dir)))
    run = h.run(hk.batch(*(hk.Request.json({"features": row}) for row in FEATURES)))
    return SimpleNamespace(h=h, run=run)


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


def rendered(fig) -> np.ndarray:
    """The figure's pixels, RGB in [0, 1], row 0 at the top (as a PNG holds them)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3] / 255.0


def pixel(fig, picture: np.ndarray, ax, fx: float, fy: float) -> np.ndarray:
    """The drawn pixel at the fraction (fx, fy) of `ax` (fy 0: its bottom edge)."""
    box = ax.get_window_extent()
    x = int(box.x0 + fx * box.width)
    y = int(box.y0 + fy * box.height)
    return picture[picture.shape[0] - 1 - y, x]
