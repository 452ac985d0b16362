"""A gallery of handler kinds, one model dir each, as users write them: the handler's source,
its model.py, manifest and label map (and vocabulary) are kept here; the weights are not.
:func:`model_dir` copies a kind's dir and writes its ``model.pt``: the state_dict of its
model.py's module, built from that code with a fixed seed (nothing is downloaded).

============== ===================================================== ======================
kind           request → answer                                      base handler
============== ===================================================== ======================
tabular        JSON ``{"features": [4 floats]}`` → ``{"label",       TorchServe's
               "probability"}``
text           a sentence (text/plain or bytes) → ``{label: p}``     handlerkit's
signal         int16 PCM bytes (8 kHz mono) → ``{"event",            TorchServe's
               "confidence"}``: a 1-D conv model
image_to_image a PNG or JPEG → a PNG (``image/png``)                 handlerkit's
multi_input    ``age``, ``income``, ``city``, as JSON or form fields handlerkit's
               → ``{"decision", "score"}``: the model takes a dict
strings        a sentence → ``"the/DET cat/NOUN …"``, a plain string TorchServe's
============== ===================================================== ======================
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
KINDS = ("tabular", "text", "signal", "image_to_image", "multi_input", "strings")


def model_dir(kind: str, path: Path, *, seed: int = 0, state_dict: dict[str, Any] | None = None) -> Path:
    """``kind``'s model dir copied to ``path``, with ``model.pt``: ``state_dict`` when given,
    else that of its model.py's module built with ``torch.manual_seed(seed)``."""
    import torch

    from conftest import load_model_class

    shutil.copytree(HERE / kind, path)
    if state_dict is None:
        torch.manual_seed(seed)
        state_dict = load_model_class(path / "model.py")().state_dict()
    torch.save(state_dict, path / "model.pt")
    return path
