"""Shared by test_loading.py and test_isolation.py (and conftest.py's ``two_model_dirs``): model
dirs of plain modules, a ``model.py`` whose class says which dir it came from and a
``handler.py`` importing it."""

from __future__ import annotations

import textwrap

CLASS_HANDLER = """
    import model

    class Handler:
        def __init__(self):
            self.context = None

        def initialize(self, context):
            self.context = context

        def handle(self, data, context):
            import model as lazily_imported  # resolved at call time, as in TorchServe
            return [model.Model.VALUE, lazily_imported.Model.VALUE]
"""


def write(directory, name: str, text: str):
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def make_model_dir(root, label: str):
    """A model dir with model.py (one class whose VALUE is `label`) and handler.py."""
    directory = root / f"dir_{label}"
    directory.mkdir()
    write(directory, "model.py", f"class Model:\n    VALUE = {label!r}\n")
    write(directory, "handler.py", CLASS_HANDLER)
    return directory
