"""A small tabular model dir, as a new user writes one: a JSON body ``{"features": [4 floats]}``
in, ``{"label", "probability"}`` out, from a subclass of TorchServe's ``BaseHandler`` (or of
handlerkit's). Shared by the tests of failures that must fit any handler, not only images.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

MODEL_PY = '''\
import torch


class TabNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x)
'''

HANDLER_PY = '''\
import torch
from {module} import BaseHandler


class TabularHandler(BaseHandler):
    def preprocess(self, data):
        rows = [row.get("data") or row.get("body") for row in data]
        return torch.tensor([r["features"] for r in rows], dtype=torch.float32)

    def postprocess(self, scores):
        best, labels = torch.softmax(scores, dim=1).max(dim=1)
        return [{{"label": int(i), "probability": float(p)}} for i, p in zip(labels, best)]
'''

BASES = {"torchserve": "ts.torch_handler.base_handler", "handlerkit": "handlerkit"}
FEATURES = [0.5, -1.0, 2.0, 0.25]


def tabular_dir(path: Path, *, base: str = "torchserve", outputs: int = 3) -> Path:
    """model.py (``TabNet``: Linear(4, 3)), handler.py, MAR-INF/MANIFEST.json and model.pt: the
    weights of a Linear(4, ``outputs``), which fit model.py only for 3 outputs."""
    path.mkdir(parents=True)
    (path / "model.py").write_text(MODEL_PY)
    (path / "handler.py").write_text(HANDLER_PY.format(module=BASES[base]))
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, outputs)
    torch.save({f"fc.{name}": value for name, value in layer.state_dict().items()}, path / "model.pt")
    manifest = {
        "model": {"modelName": "tabular", "handler": "handler.py", "modelFile": "model.py", "serializedFile": "model.pt"}
    }
    (path / "MAR-INF").mkdir()
    (path / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest))
    return path


def rows(*features: list[float]) -> list[dict]:
    """JSON bodies ``{"features": [...]}``, one per request."""
    return [{"features": f} for f in features]
