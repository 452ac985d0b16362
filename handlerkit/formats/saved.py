"""The format a model dir serves: a format's file saved into the dir, the manifest and config pointed at it.

:func:`save_format` writes what ``h.compare_formats(batch, save=...)`` and ``handlerkit formats
--save`` chose: the artifact (copied in under a name of its own, so the user's weights are
never overwritten), ``MAR-INF/MANIFEST.json``'s ``serializedFile`` (and ``modelFile`` removed,
since TorchServe reads any file as eager weights when a ``modelFile`` is named), and the
``pt2`` section of ``model-config.yaml`` (``compile.enable`` on for ``compile``, off for the
exported formats, which the lab measured uncompiled).

============  ===============================  ================================================
format        written                          loaded by
============  ===============================  ================================================
eager         the original manifest entries    hk.BaseHandler and TorchServe 0.12
compile       ... and pt2.compile.enable       hk.BaseHandler and TorchServe 0.12
torchscript   ``model.torchscript.pt``         hk.BaseHandler and TorchServe 0.12
onnx          ``model.onnx``                   hk.BaseHandler; TorchServe 0.12 opens the session
                                               but its default inference cannot call it
export        ``model.export.pt2``             hk.BaseHandler only
aoti          ``model.aoti.pt2`` (a package)   hk.BaseHandler only (TorchServe: legacy ``.so``)
============  ===============================  ================================================

:func:`save_format` writes what it is given. The format lab (``save=``) first makes the same
save in a copy of the dir and serves requests from the copy through the handler, and saves
only when they are answered (:mod:`handlerkit.diagnostics.format_lab.saving`); a file it saved
that meets an input size it was not exported for says so at run time
(:class:`handlerkit.formats.ArtifactShapeError`).

The dir remembers what was saved in :data:`RECORD` (the manifest's entries before the first
save, and each file written), so ``eager`` and ``compile`` go back to the original weights and
``replace=True`` deletes only files handlerkit wrote, never the original ones.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from handlerkit.errors import HandlerkitError, HandlerkitWarning

__all__ = ["ARTIFACT_NAMES", "NOT_TORCHSERVE_FIX", "RECORD", "SAVABLE", "SavedFormat", "plan_save", "save_format"]

SAVABLE = ("eager", "torchscript", "onnx", "export", "aoti", "compile")
#: The file each exported format is saved as in the model dir.
ARTIFACT_NAMES = {
    "torchscript": "model.torchscript.pt",
    "onnx": "model.onnx",
    "export": "model.export.pt2",
    "aoti": "model.aoti.pt2",
}
#: What handlerkit saved into a model dir, and the manifest's model entries before it did.
RECORD = "handlerkit_formats.json"
_MANIFEST = "MAR-INF/MANIFEST.json"
_CONFIG = "model-config.yaml"
_ENTRIES = ("serializedFile", "modelFile")
_TORCHSERVE = {
    "eager": "TorchServe 0.12's BaseHandler loads it (modelFile + state_dict)",
    "compile": "TorchServe 0.12's BaseHandler loads it and compiles it from pt2.compile",
    "torchscript": "TorchServe 0.12's BaseHandler loads it (a .pt without modelFile is TorchScript) and runs it",
    "onnx": "TorchServe 0.12's BaseHandler opens it with onnxruntime, but its default inference calls the "
    "session like a module and fails: there, only a handler that overrides inference (session.run) serves it",
    "export": "TorchServe 0.12 does not load a .pt2 ('No model weights could be loaded'): handlerkit only",
    "aoti": "TorchServe 0.12 loads only the legacy AOTInductor .so (with pt2.export.aot_compile), not a .pt2 "
    "package: handlerkit only",
}
#: The formats TorchServe 0.12's own BaseHandler does not serve, and the fix :func:`save_format` warns with.
NOT_TORCHSERVE_FIX = {
    "onnx": "serve the dir with a handler that subclasses hk.BaseHandler (handlerkit in the worker), or override "
    "inference to call self.model.run; for TorchServe's own BaseHandler save torchscript or eager",
    "export": "serve the dir with a handler that subclasses hk.BaseHandler (handlerkit in the worker); for "
    "TorchServe's own BaseHandler save torchscript or eager",
    "aoti": "serve the dir with a handler that subclasses hk.BaseHandler (handlerkit in the worker); for "
    "TorchServe's own BaseHandler save torchscript or eager",
}


@dataclass
class SavedFormat:
    """A format saved into a model dir (or planned: :func:`plan_save`).

    Attributes:
        format: one of :data:`SAVABLE`.
        model_dir: the dir, absolute.
        artifact: the file written into the dir (None for ``eager`` and ``compile``).
        model: the manifest's ``model`` entries written.
        pt2: the config's ``pt2`` section written, when it changed (else None).
        removed: files of earlier saves deleted (``replace=True``).
        torchserve: whether TorchServe 0.12's own BaseHandler loads it.
        notes: facts worth reading (a config rewritten without its comments, ...).
    """

    format: str
    model_dir: str
    artifact: str | None = None
    model: dict[str, Any] = field(default_factory=dict)
    pt2: dict[str, Any] | None = None
    removed: list[str] = field(default_factory=list)
    torchserve: str = ""
    notes: list[str] = field(default_factory=list)
    _config_path: str | None = field(default=None, repr=False)
    _config: dict[str, Any] | None = field(default=None, repr=False)
    _record: dict[str, Any] = field(default_factory=dict, repr=False)
    _manifest: dict[str, Any] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}

    @property
    def torchserve_serves(self) -> bool:
        """TorchServe 0.12's own BaseHandler loads the format and runs it with its default inference."""
        return self.format not in NOT_TORCHSERVE_FIX

    def warn_if_not_torchserve(self) -> None:
        """A :class:`~handlerkit.errors.HandlerkitWarning` with the fix when TorchServe 0.12's own
        BaseHandler would not serve the format (``onnx``, ``export``, ``aoti``)."""
        if self.torchserve_serves:
            return
        from handlerkit._stack import user_stacklevel

        warnings.warn(
            f"handlerkit: saved {self.format} into {os.path.basename(self.model_dir)}/, which TorchServe 0.12's own "
            f"BaseHandler does not serve: {self.torchserve}\n  fix: {NOT_TORCHSERVE_FIX[self.format]}",
            HandlerkitWarning,
            stacklevel=user_stacklevel(),
        )

    def __str__(self) -> str:
        what = f"{self.artifact}, " if self.artifact else ""
        entries = ", ".join(f"{k}={v}" for k, v in self.model.items() if k in _ENTRIES) or "no model file"
        text = f"saved {self.format} into {self.model_dir}: {what}manifest {entries}"
        if self.pt2 is not None:
            text += f", pt2: {json.dumps(self.pt2)}"
        if self.removed:
            text += f"; removed {', '.join(self.removed)}"
        return f"{text}. {self.torchserve}." + "".join(f" {note}." for note in self.notes)


def plan_save(
    model_dir: str | os.PathLike[str], fmt: str, *, compile_options: dict[str, Any] | None = None, replace: bool = False
) -> SavedFormat:
    """What :func:`save_format` would write, checked, with nothing written.

    Raises:
        ValueError: an unknown format.
        HandlerkitError: no model dir, or a file of that name already in it that handlerkit did
            not write (it is never overwritten).
        ModelLoadError: an unreadable manifest or config.
    """
    from handlerkit._text import suggestion
    from handlerkit.worker.modeldir import read_model_dir

    if fmt not in SAVABLE:
        raise ValueError(f"cannot save format {fmt!r}{suggestion(fmt, SAVABLE)}; expected one of {SAVABLE}")
    if not os.path.isdir(model_dir):
        raise HandlerkitError(
            f"the format is saved into a model dir, and {os.fspath(model_dir)!r} is none",
            fix="open the model dir itself (extract a .mar first: handlerkit.archive.extract)",
        )
    with warnings.catch_warnings():  # "inferred the manifest": saving writes it
        warnings.simplefilter("ignore", HandlerkitWarning)
        found = read_model_dir(model_dir)
    root = found.path
    record = _read_record(root, found.manifest["model"])
    plan = SavedFormat(fmt, str(root), _record=record, _manifest=found.manifest, torchserve=_TORCHSERVE[fmt])
    model = {k: v for k, v in found.manifest["model"].items() if k not in _ENTRIES}
    original = record["original"]
    ours = set(record["saved"].values())
    if fmt in ARTIFACT_NAMES:
        plan.artifact = ARTIFACT_NAMES[fmt]
        if (root / plan.artifact).exists() and plan.artifact not in ours:
            raise HandlerkitError(
                f"{root / plan.artifact} is already there and handlerkit did not write it: saving {fmt} "
                "would overwrite it",
                fix=f"move or rename {plan.artifact}, then save again",
            )
        model["serializedFile"] = plan.artifact  # no modelFile: TorchServe reads the file by its name
    else:
        model.update({k: v for k, v in original.items() if v})
    if replace:
        plan.removed = sorted(name for name in ours if name != plan.artifact and name not in original.values())
    plan.model = model
    if found.inferred:
        plan.notes.append(f"{_MANIFEST} was inferred from the files; it is written now")
    _plan_config(plan, found, fmt, compile_options)
    return plan


def save_format(
    model_dir: str | os.PathLike[str],
    fmt: str,
    *,
    artifact: str | os.PathLike[str] | None = None,
    compile_options: dict[str, Any] | None = None,
    replace: bool = False,
    warn: bool = True,
) -> SavedFormat:
    """Make ``model_dir`` serve ``fmt``: copy ``artifact`` in, point the manifest and config at it.

    ``hk.BaseHandler`` loads every format saved. TorchServe 0.12's own BaseHandler (and the
    built-in handlers on it) serves ``eager``, ``compile`` and ``torchscript``; it opens an
    ``onnx`` file with onnxruntime but its default inference cannot run the session, and it
    does not load a ``.pt2`` (``export``, ``aoti``). Saving one of those three warns, with the fix.

    Args:
        fmt: one of :data:`SAVABLE`.
        artifact: the exported file (:func:`handlerkit.formats.export_model` writes one) for
            torchscript, onnx, export and aoti; none for eager and compile.
        compile_options: ``torch.compile``'s keyword arguments for ``compile`` (default: none).
        replace: delete the files of earlier saves (never the original weights).
        warn: warn when TorchServe's own BaseHandler would not serve ``fmt``
            (:meth:`SavedFormat.warn_if_not_torchserve`; the format lab warns once it is done).

    Warns:
        HandlerkitWarning: ``fmt`` is ``onnx``, ``export`` or ``aoti``: TorchServe 0.12's own
            BaseHandler does not serve it.

    Raises:
        ValueError: an unknown format, or an artifact missing or given where none is taken.
        HandlerkitError: as :func:`plan_save`.
    """
    if (artifact is None) == (fmt in ARTIFACT_NAMES):
        wanted = "the exported file" if fmt in ARTIFACT_NAMES else "no artifact (it needs only the manifest)"
        raise ValueError(f"saving {fmt!r} takes {wanted}: got artifact={artifact!r}")
    if artifact is not None and not os.path.isfile(artifact):
        raise ValueError(f"saving {fmt!r} needs the exported file: {os.fspath(artifact)!r} is no file")
    plan = plan_save(model_dir, fmt, compile_options=compile_options, replace=replace)
    _write(plan, artifact)
    if warn:
        plan.warn_if_not_torchserve()
    return plan


def _write(plan: SavedFormat, artifact: str | os.PathLike[str] | None) -> None:
    import yaml

    root = Path(plan.model_dir)
    record = plan._record
    if plan.artifact is not None and artifact is not None:
        shutil.copyfile(artifact, root / plan.artifact)
        record["saved"][plan.format] = plan.artifact
    for name in plan.removed:
        (root / name).unlink(missing_ok=True)
    record["saved"] = {k: v for k, v in record["saved"].items() if v not in plan.removed}
    record["serving"] = plan.format
    if plan._config is not None and plan._config_path is not None:
        Path(plan._config_path).write_text(yaml.safe_dump(plan._config, sort_keys=False), encoding="utf-8")
    manifest = {**plan._manifest, "model": plan.model}
    manifest.setdefault("runtime", "python")
    (root / "MAR-INF").mkdir(exist_ok=True)
    (root / _MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    (root / RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def _read_record(root: Path, model: dict[str, Any]) -> dict[str, Any]:
    """The dir's record, or a new one holding the manifest's entries as the original."""
    path = root / RECORD
    if path.is_file():
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise HandlerkitError(
                f"{path} is not the JSON handlerkit writes ({exc})",
                fix=f"delete {RECORD} only if the manifest names the original weights again",
            ) from exc
        if isinstance(record, dict) and isinstance(record.get("original"), dict):
            record.setdefault("saved", {})
            return record
    return {"original": {k: model.get(k) for k in _ENTRIES}, "saved": {}}


def _plan_config(plan: SavedFormat, found: Any, fmt: str, compile_options: dict[str, Any] | None) -> None:
    """The ``pt2`` section for ``fmt``: compile on (with its options) for compile, else off."""
    import yaml

    path = found.config_path
    raw: dict[str, Any] = {}
    text = ""
    if path is not None:
        text = Path(path).read_text(encoding="utf-8")
        raw = yaml.safe_load(text) or {}
    pt2: Any = raw.get("pt2")
    if fmt == "compile":
        wanted: Any = {"compile": {"enable": True, **(compile_options or {})}}
    elif not _compiles(pt2):
        return
    elif isinstance(pt2, str):  # legacy pt2: inductor
        wanted = {"compile": {"enable": False, "backend": pt2}}
    elif "compile" in pt2:
        wanted = {**pt2, "compile": {**pt2["compile"], "enable": False}}
    else:  # legacy pt2: {backend: ..., mode: ...}
        wanted = {"compile": {"enable": False, **pt2}}
    if wanted == pt2:
        return
    plan.pt2 = wanted
    plan._config = {**raw, "pt2": wanted}
    if path is None:
        path = Path(plan.model_dir) / _CONFIG
        if path.exists():
            raise HandlerkitError(
                f"{path} is there but the manifest names no configFile, and saving {fmt} must set pt2 in one",
                fix=f"name it in the manifest (configFile: {_CONFIG}) or move it, then save again",
            )
        plan.model["configFile"] = _CONFIG
    elif "#" in text:
        plan.notes.append(f"{os.path.basename(path)} was rewritten with pt2 changed; its comments are gone")
    plan._config_path = str(path)


def _compiles(pt2: Any) -> bool:
    """A ``pt2`` section that asks for torch.compile (current or legacy schema)."""
    if isinstance(pt2, str):
        return True
    if not isinstance(pt2, dict) or ("export" in pt2 and "compile" not in pt2):
        return False
    if "compile" in pt2:
        return isinstance(pt2["compile"], dict) and pt2["compile"].get("enable") is True
    return True
