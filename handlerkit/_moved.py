"""Import paths that moved in 0.2, kept working for one release with a ``DeprecationWarning``.

The TorchServe model moved into :mod:`handlerkit.worker`, the compile caches and the saved
formats into :mod:`handlerkit.formats`, and the run records into :mod:`handlerkit.recording`.
A user who typed ``from handlerkit.context import MockContext`` gets the module at its new
place and a warning naming it. This is the package's one import-time action beyond the
logger's ``NullHandler``: a finder that answers only for the names below, so it changes
nothing for any other import. Remove it, and this module, in 0.3.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

MOVED: dict[str, str] = {
    "handlerkit._wire": "handlerkit.worker._wire",
    "handlerkit.async_worker": "handlerkit.worker.async_worker",
    "handlerkit.batches": "handlerkit.worker.batches",
    "handlerkit.compile_cache": "handlerkit.formats.compile_cache",
    "handlerkit.compile_kernels": "handlerkit.formats.compile_kernels",
    "handlerkit.config": "handlerkit.worker.config",
    "handlerkit.context": "handlerkit.worker.context",
    "handlerkit.contract": "handlerkit.worker.contract",
    "handlerkit.devices": "handlerkit.worker.devices",
    "handlerkit.envelopes": "handlerkit.worker.envelopes",
    "handlerkit.freshness": "handlerkit.worker.freshness",
    "handlerkit.isolation": "handlerkit.worker.isolation",
    "handlerkit.loading": "handlerkit.worker.loading",
    "handlerkit.memory": "handlerkit.worker.memory",
    "handlerkit.metrics": "handlerkit.worker.metrics",
    "handlerkit.metrics_config": "handlerkit.worker.metrics_config",
    "handlerkit.modeldir": "handlerkit.worker.modeldir",
    "handlerkit.pt2": "handlerkit.worker.pt2",
    "handlerkit.request_processor": "handlerkit.worker.request_processor",
    "handlerkit.requests": "handlerkit.worker.requests",
    "handlerkit.results": "handlerkit.recording.results",
    "handlerkit.sequence_batches": "handlerkit.worker.sequence_batches",
    "handlerkit.served_format": "handlerkit.formats.saved",
    "handlerkit.streaming": "handlerkit.worker.streaming",
    "handlerkit.timer": "handlerkit.worker.timer",
    "handlerkit.workdir": "handlerkit.worker.workdir",
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old name in :data:`MOVED` and loads the module at its new place under it."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # a throwaway module: exec_module puts the real one in its place

    def exec_module(self, module: ModuleType) -> None:
        new = MOVED[module.__name__]
        warnings.warn(
            f"handlerkit: {module.__name__} moved to {new}; import it from there (the old path goes in handlerkit 0.3)",
            DeprecationWarning,
            stacklevel=2,  # the importing line: warnings skips the import machinery's frames itself
        )
        # The import system returns what sys.modules holds after exec: the real module, once.
        sys.modules[module.__name__] = importlib.import_module(new)


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (``import handlerkit`` calls this)."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(MovedModules())
