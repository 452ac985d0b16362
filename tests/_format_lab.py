"""The format lab's shared cases (tests/diagnostics/format_lab/): a model dir's Harness, a small
batch, a model that does not export, the fixture classifier, and ragged ranker requests
(tests/_new_users.py: item lists of different lengths, padded per batch to the longest)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _new_users import ranker_dir, ranker_request

import handlerkit as hk
from conftest import eager_manifest
from handlerkit.handlers.base import BaseHandler

ROOT = Path(__file__).resolve().parent.parent
CLASSIFIER = ROOT / "fixtures" / "models" / "image_classifier"
IMAGES = [ROOT / "fixtures" / "images" / f"{name}.png" for name in ("circle", "cross", "square")]

#: A data-dependent branch on line 11: torch.export and the ONNX exporter refuse it.
BRANCH_MODEL_PY = '''\
import torch


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        y = self.fc(x)
        if y.sum() > 0:
            y = y * 2
        return y
'''
BATCH = [[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 2.0, 0.0]]


def harness(model_dir: Path, **config: Any) -> hk.Harness:
    ctx = hk.MockContext(model_dir=model_dir, gpu_id=None, manifest=eager_manifest(), model_yaml_config=config)
    return hk.Harness(BaseHandler, ctx)


SHORT, LONG = ranker_request(1, [3, 5]), ranker_request(2, [1, 2, 3, 4, 5, 6, 7])


def ragged_batch() -> hk.Batch:
    return hk.batch(hk.Request.json(SHORT), hk.Request.json(LONG))


def ranker_answers(tmp_path: Path, *requests: dict) -> list:
    """What the eager ranker answers, each request alone (from a dir of its own, never saved into)."""
    h = hk.Harness.open(ranker_dir(tmp_path / "eager-ranker", base="handlerkit"))
    return [h.run(hk.batch(hk.Request.json(r))).output[0] for r in requests]
