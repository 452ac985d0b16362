"""The ``MAR-INF/MANIFEST.json`` torch-model-archiver 0.12 writes, key for key.

``json.dumps(indent=2)`` of ``createdOn`` (``%d/%m/%Y %H:%M:%S``, local time), ``runtime``,
``model`` (``modelName``, ``serializedFile``, ``handler``, ``modelFile``, ``modelVersion``,
``extensions``, ``requirementsFile``, ``configFile``, each only when set, in that order) and
``archiverVersion`` (``model_archiver/manifest_components``). A model dir's own manifest, or
the one handlerkit infers from its files (:func:`handlerkit.worker.modeldir.infer_manifest`), gives
the defaults; a handler given as a path is named by its base name (``h.py``, ``h:fn``, ``h``).
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import Any

from handlerkit.archive.rules import MANIFEST, ArchiveError
from handlerkit.errors import ModelLoadError
from handlerkit.worker.modeldir import infer_manifest, read_manifest

__all__ = ["ARCHIVER_BUILTINS", "ARCHIVER_VERSION", "FILE_KEYS", "check_model_name", "complete", "handler_source",
           "start_from"]  # fmt: skip

ARCHIVER_VERSION = "0.12.0"
#: Handler names torch-model-archiver 0.12 archives as no file (``model_handlers``).
ARCHIVER_BUILTINS = frozenset({"base_handler", "text_classifier", "image_classifier", "object_detector", "image_segmenter",
                               "dali_image_classifier", "vllm_handler", "trt_llm_handler"})  # fmt: skip
#: The manifest keys that name a file (the handler aside), as the archiver's options set them.
FILE_KEYS = ("modelFile", "serializedFile", "requirementsFile", "configFile")
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-.]*$")
_ORDER = ("modelName", "serializedFile", "handler", "modelFile", "modelVersion", "extensions", "requirementsFile",
          "configFile")  # fmt: skip


def start_from(src: Path | None, model_name: str | None, serialized_file: str | None) -> dict[str, Any]:
    """The manifest a build starts from: the model dir's, else the one inferred from its files
    (several weights files are fine when ``serialized_file`` names the one); ``{}`` without a dir."""
    if src is None:
        return {}
    if (src / MANIFEST).is_file():
        return read_manifest(src / MANIFEST)
    try:
        return infer_manifest(src, model_name)[0]
    except ModelLoadError:
        if not serialized_file:
            raise
    roles = (("modelFile", "model.py"), ("handler", "handler.py"), ("configFile", "model-config.yaml"))
    return {"runtime": "python", "model": {key: name for key, name in roles if (src / name).is_file()}}


def check_model_name(name: str | None) -> str:
    """``name`` when TorchServe accepts it as a model name.

    Raises:
        ArchiveError: (``model-name``) anything else.
    """
    if not name or not _MODEL_NAME.match(name):
        raise ArchiveError(f"model name {name!r} is not allowed: TorchServe wants ^[A-Za-z0-9][A-Za-z0-9_\\-.]*$",
                           name, rule="model-name",
                           fix="pass model_name= with letters, digits, '_', '-' and '.'")  # fmt: skip
    return name


def handler_source(handler: str) -> str | None:
    """The file a handler spec names (``h.py`` for ``h``, ``h:fn``, ``h.py:fn``), or None for a
    built-in name, which the archiver archives as no file."""
    if handler in ARCHIVER_BUILTINS:
        return None
    module = handler.split(":", 1)[0]
    return module if module.endswith(".py") else module + ".py"


def complete(base: dict[str, Any], model: dict[str, Any], name: str, version: str | None) -> dict[str, Any]:
    """The manifest to write: ``model`` (the keys resolved so far) named, versioned and ordered."""
    model = {**model, "modelName": name, "modelVersion": version or model.get("modelVersion") or "1.0"}
    ordered = {k: model[k] for k in _ORDER if model.get(k)}
    ordered.update((k, v) for k, v in model.items() if k not in ordered and v is not None and k not in _ORDER)
    return {
        "createdOn": datetime.datetime.now().strftime("%d/%m/%Y %H:%M:%S"),
        "runtime": base.get("runtime", "python"),
        "model": ordered,
        "archiverVersion": ARCHIVER_VERSION,
    }
