"""A model dir (an unpacked ``.mar``): its manifest, and which model config TorchServe loads.

``torch-model-archiver`` flattens every file into the archive's root and writes
``MAR-INF/MANIFEST.json``: ``{"runtime": "python", "model": {"modelName", "serializedFile",
"handler", "modelFile", "modelVersion", "configFile", ...}}``. TorchServe loads the model config
named by ``configFile`` and nothing else.

A dir laid out by hand often has no manifest: :func:`infer_manifest` builds one from the files
(the single weights file, ``model.py``, ``handler.py``, ``model-config.yaml``) and says why each
key was chosen; :func:`read_model_dir` warns that it did so, with the command that writes it
(``handlerkit manifest DIR``: :func:`manifest_command`). Nothing here imports ``ts``.

Example::

    found = read_model_dir("fixtures/models/image_classifier")
    found.manifest["model"]["handler"], found.config_path, found.batch_size   # ..., 4
"""

from __future__ import annotations

import json
import os
import shlex
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from handlerkit._stack import user_stacklevel
from handlerkit.errors import ConfigError, HandlerkitWarning, ModelLoadError

__all__ = [
    "WEIGHTS_SUFFIXES",
    "ModelDir",
    "infer_manifest",
    "manifest_command",
    "read_config",
    "read_manifest",
    "read_model_dir",
    "resolve_path",
]

#: File endings taken for the weights (``serializedFile``) when a manifest is inferred.
WEIGHTS_SUFFIXES: tuple[str, ...] = (".pt", ".pth", ".bin", ".onnx", ".pt2", ".so", ".safetensors")

#: Weights TorchServe's BaseHandler (and handlerkit's) loads without a ``modelFile``; the
#: others (a ``.pth`` state_dict, ``.bin``, ``.safetensors``) need one or a custom ``initialize``.
_LOADABLE_ALONE: tuple[str, ...] = (".pt", ".onnx", ".pt2", ".so")

_MANIFEST = "MAR-INF/MANIFEST.json"


@dataclass(frozen=True)
class ModelDir:
    """What a model dir holds, as TorchServe would load it.

    Attributes:
        path: the dir, absolute.
        manifest: ``MAR-INF/MANIFEST.json``, or the inferred manifest.
        inferred: for an inferred manifest, each key and why it was chosen; empty otherwise.
        config_path: the model config loaded, or None.
        config: that config as a plain dict ({} when none).
    """

    path: Path
    manifest: dict[str, Any]
    inferred: dict[str, str] = field(default_factory=dict)
    config_path: Path | None = None
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        """The config's ``batchSize`` raised to at least 1 (as TorchServe's frontend does), else 1.

        Raises:
            ConfigError: a ``batchSize`` that is not an integer.
        """
        return _config_batch_size(self.config, self.config_path)


def read_model_dir(
    path: str | os.PathLike[str], *, model_name: str | None = None, config: str | os.PathLike[str] | None = None
) -> ModelDir:
    """Read a model dir's manifest (or infer one, with a warning) and its model config.

    Args:
        path: the model dir.
        model_name: the ``modelName`` of an inferred manifest (default: the dir's name).
        config: a model config to load instead of the manifest's ``configFile``; a relative
            path is looked up in the model dir, then in the working directory.

    Raises:
        ModelLoadError: a missing dir, a malformed MANIFEST.json, several candidate weights
            files, or a config file that does not exist.
        ConfigError: a config file that does not validate (:func:`handlerkit.worker.config.load_config`).
    """
    model_dir = Path(path).expanduser()
    if not model_dir.is_dir():
        what = "is not a directory" if model_dir.exists() else "does not exist"
        raise ModelLoadError(
            f"model dir {os.fspath(path)!r} {what}",
            path=os.fspath(path),
            fix="pass the folder holding the model files (an unpacked .mar)",
        )
    model_dir = model_dir.resolve()
    manifest_path = model_dir / _MANIFEST
    inferred: dict[str, str]
    if manifest_path.is_file():
        manifest, inferred = read_manifest(manifest_path), {}
    else:
        manifest, inferred = infer_manifest(model_dir, model_name)
        _warn_inferred(model_dir, manifest)
    config_path = _config_path(model_dir, config, manifest["model"], manifest_from_file=not inferred)
    yaml_config = read_config(config_path) if config_path is not None else {}
    return ModelDir(path=model_dir, manifest=manifest, inferred=inferred, config_path=config_path, config=yaml_config)


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read ``MAR-INF/MANIFEST.json``; it must be an object with a ``"model"`` object.

    Raises:
        ModelLoadError: the file cannot be read, is not JSON, or has no ``"model"`` object.
    """
    path = Path(path)
    fix = f"correct the file, or delete {_MANIFEST} to let handlerkit infer the manifest from the files"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path} is not valid JSON ({exc})", path=str(path), fix=fix) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}", path=str(path), fix=fix) from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("model"), dict):
        raise ModelLoadError(
            f'{path} must be a JSON object with a "model" object, as torch-model-archiver '
            f'writes: {{"runtime": "python", "model": {{"modelName": ..., "handler": ...}}}}',
            path=str(path),
            fix=fix,
        )
    return manifest


def infer_manifest(
    model_dir: str | os.PathLike[str], model_name: str | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """A manifest built from the files of a dir that has none, and why each key was chosen.

    ``serializedFile`` is the single weights file (:data:`WEIGHTS_SUFFIXES`), ``modelFile`` is
    ``model.py``, ``handler`` is ``handler.py``, ``configFile`` is ``model-config.yaml`` (each
    only when present), ``modelName`` is ``model_name`` or the dir's name. A weights file that
    only loads with a ``modelFile`` (``.pth``, ``.bin``, ``.safetensors``) in a dir without
    ``model.py`` is still taken, and its ``inferred`` entry says what it lacks.

    Raises:
        ModelLoadError: several weights files (handlerkit cannot tell which is the model).
    """
    model_dir = Path(model_dir)
    files = sorted(p.name for p in model_dir.iterdir() if p.is_file())
    weights = [name for name in files if name.endswith(WEIGHTS_SUFFIXES)]
    if len(weights) > 1:
        raise ModelLoadError(
            f"model dir {str(model_dir)!r} has several weights files: {', '.join(weights)}; "
            "handlerkit cannot tell which is the model",
            path=str(model_dir),
            fix=f"name the model's weights in {_MANIFEST}: "
            f"{manifest_command(model_dir, '--serialized-file', weights[0])} (or {', '.join(weights[1:])}), as "
            "torch-model-archiver --serialized-file does; or keep only one",
        )
    model: dict[str, Any] = {}
    inferred: dict[str, str] = {}
    if model_name:
        model["modelName"], inferred["modelName"] = model_name, "the model_name argument"
    else:
        model["modelName"], inferred["modelName"] = model_dir.name, "the model dir's name"
    optional = (("modelFile", "model.py"), ("handler", "handler.py"), ("configFile", "model-config.yaml"))
    if weights:
        model["serializedFile"] = weights[0]
        inferred["serializedFile"] = "the only weights file in the dir"
        if "model.py" not in files and not weights[0].endswith(_LOADABLE_ALONE):
            inferred["serializedFile"] += (
                "; without a modelFile TorchServe's BaseHandler cannot load it (it reads a lone file "
                "as TorchScript only when its name ends in .pt, else 'No model weights could be "
                "loaded'): add model.py defining the model class, or load it in your own initialize"
            )
    for key, filename in optional:
        if filename in files:
            model[key], inferred[key] = filename, f"{filename} is in the dir"
    model["modelVersion"], inferred["modelVersion"] = "1.0", "default"
    inferred["runtime"] = "default"
    return {"runtime": "python", "model": model}, inferred


def resolve_path(model_dir: Path, given: str | os.PathLike[str], what: str) -> Path:
    """A file named by an argument: absolute as is, else in the model dir, then the working dir.

    Raises:
        ModelLoadError: an absolute path that is no file, or a relative path found in neither place.
    """
    path = Path(given).expanduser()
    if path.is_absolute():
        if path.is_file():
            return path
        raise ModelLoadError(f"{what} {os.fspath(given)!r} does not exist", path=os.fspath(given), fix="check the path")
    for candidate in (model_dir / path, Path.cwd() / path):
        if candidate.is_file():
            return candidate
    raise ModelLoadError(
        f"{what} {os.fspath(given)!r} not found in the model dir ({model_dir}) nor in the "
        f"working directory ({Path.cwd()})",
        path=os.fspath(given),
        fix="check the name, or pass an absolute path",
    )


def read_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a model config (:func:`handlerkit.worker.config.load_config`) as a plain dict.

    Raises:
        ModelLoadError: the file does not exist.
        ConfigError: it does not validate.
    """
    from handlerkit.worker.config import load_config

    if not os.path.exists(path):
        raise ModelLoadError(
            f"model config {os.fspath(path)!r} does not exist",
            path=os.fspath(path),
            fix="check the name (it is relative to the model dir)",
        )
    return load_config(path).to_dict()


def _warn_inferred(model_dir: Path, manifest: dict[str, Any]) -> None:
    """What was inferred, in brief, and the command that writes it (details: ``inferred``)."""
    model = manifest["model"]
    files = [model[k] for k in ("serializedFile", "modelFile", "handler", "configFile") if k in model]
    brief = f"from {', '.join(files)}" if files else "with no files"
    if "serializedFile" not in model:
        brief += "; no weights file found"
    warnings.warn(
        f"handlerkit: inferred the manifest of {model_dir.name}/ {brief}\n"
        f"  there is no {_MANIFEST}: write one to make it explicit (details: .inferred)\n"
        f"  fix: {manifest_command(model_dir)}",
        HandlerkitWarning,
        stacklevel=user_stacklevel(),
    )


def manifest_command(model_dir: str | os.PathLike[str], *options: str) -> str:
    """The ``handlerkit manifest`` command line that writes ``model_dir``'s manifest (the dir
    relative to the working directory when it is below it)."""
    relative = os.path.relpath(model_dir)
    shown = os.fspath(model_dir) if relative == ".." or relative.startswith(f"..{os.sep}") else relative
    return shlex.join(["handlerkit", "manifest", shown, *options])


def _config_path(
    model_dir: Path, config: str | os.PathLike[str] | None, model: Mapping[str, Any], *, manifest_from_file: bool
) -> Path | None:
    """The model config TorchServe would load: ``config`` if given, else the manifest's ``configFile``."""
    if config is not None:
        return resolve_path(model_dir, config, "config")
    name = model.get("configFile")
    if name:
        path = model_dir / name
        if not path.is_file():
            raise ModelLoadError(
                f"the manifest names configFile {name!r} but {path} does not exist",
                path=str(path),
                fix=f"add the file, or remove configFile from {_MANIFEST}",
            )
        return path
    if manifest_from_file and (model_dir / "model-config.yaml").is_file():
        warnings.warn(
            f"handlerkit: {model_dir / 'model-config.yaml'} is not loaded: {_MANIFEST} names no "
            "configFile, so TorchServe would not load it either (archive with "
            "--config-file model-config.yaml, or pass config=)",
            HandlerkitWarning,
            stacklevel=user_stacklevel(),
        )
    return None


def _config_batch_size(config: Mapping[str, Any], path: Path | None) -> int:
    value = config.get("batchSize", 1)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"batchSize in {path} must be an integer: got {value!r}", fix="write batchSize: 1 or more")
    # TorchServe's ModelConfig.setBatchSize: Math.max(1, batchSize) (load_config has warned).
    return max(1, value)
