"""What goes into a model archive, and its manifest, as ``torch-model-archiver`` 0.12 decides.

The layout and the manifest are the archiver's (``model_archiver/model_packaging_utils.py``):

- every file lands in the archive's root under its base name; an extra *folder* contributes its
  contents (sub-folders kept), skipping ``__pycache__``, ``__MACOSX`` and dot-folders;
- a handler given as a path (``dir/h.py``, ``dir/h:fn``, ``h``) is archived as ``h.py`` and
  named in the manifest by its base name (``h.py``, ``h:fn``, ``h``); a built-in name
  (``image_classifier``…) is archived as no file;
- ``MAR-INF/MANIFEST.json`` holds ``createdOn`` (``%d/%m/%Y %H:%M:%S``, local time),
  ``runtime``, ``model`` (``modelName``, ``serializedFile``, ``handler``, ``modelFile``,
  ``modelVersion``, ``extensions``, ``requirementsFile``, ``configFile``, each only when set)
  and ``archiverVersion``.

:func:`plan` resolves the inputs into a :class:`Plan` and reads no file's content;
:mod:`handlerkit.archive.write` writes it.
"""

from __future__ import annotations

import datetime
import glob
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from handlerkit.archive.rules import MANIFEST, ArchiveError, manifest_problems
from handlerkit.archive.write import FORMATS
from handlerkit.errors import ModelLoadError
from handlerkit.modeldir import infer_manifest, read_manifest, resolve_path

__all__ = ["ARCHIVER_BUILTINS", "ARCHIVER_VERSION", "Plan", "plan"]

ARCHIVER_VERSION = "0.12.0"
#: Handler names torch-model-archiver 0.12 archives as no file (``model_handlers``).
ARCHIVER_BUILTINS = frozenset({"base_handler", "text_classifier", "image_classifier", "object_detector", "image_segmenter",
                               "dali_image_classifier", "vllm_handler", "trt_llm_handler"})  # fmt: skip
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-.]*$")
_SKIPPED_DIRS = {"__pycache__", "__MACOSX"}


@dataclass
class Plan:
    """What a build writes: the manifest and, per archive path, the file it comes from."""

    model_name: str
    manifest: dict[str, Any]
    files: dict[str, Path] = field(default_factory=dict)

    @property
    def total_size(self) -> int:
        return sum(p.stat().st_size for p in self.files.values())


def _walk(folder: Path, skip: Iterable[Path] = ()) -> Iterable[tuple[str, Path]]:
    """(relative posix path, file) under ``folder``, as the archiver's archive_dir filters them."""
    skipped = {os.path.realpath(p) for p in skip}
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(
            d for d in dirs
            if d not in _SKIPPED_DIRS and not d.startswith(".") and os.path.realpath(Path(root, d)) not in skipped
        )
        for name in sorted(files):
            path = Path(root, name)
            if name.endswith((".pyc", ".DS_Store", ".mar")) or os.path.realpath(path) in skipped:
                continue
            yield path.relative_to(folder).as_posix(), path


def _find(given: str | os.PathLike[str], source: Path | None, what: str) -> Path:
    """A file named by an argument: absolute, else in ``source`` then the working dir."""
    try:
        if source is not None:
            return resolve_path(source, given, what)
        path = Path(given).expanduser()
        if path.is_file():
            return path
    except ModelLoadError as exc:
        raise ArchiveError(exc.message, given, rule="missing-file", fix=exc.fix) from exc
    raise ArchiveError(f"{what} {os.fspath(given)!r} does not exist", given, rule="missing-file",
                       fix="check the path (relative paths are from the working directory)")  # fmt: skip


def _expand_extra(extra_files: str | Sequence[str], source: Path | None) -> list[tuple[str, Path]]:
    """The archiver's --extra-files: files flattened to the root, folders' contents, globs."""
    items = extra_files.split(",") if isinstance(extra_files, str) else list(extra_files)
    out: list[tuple[str, Path]] = []
    for item in (os.fspath(i).strip() for i in items):
        if not item:
            continue
        bases = [source, Path.cwd()] if source is not None and not os.path.isabs(item) else [None]
        matches: list[str] = []
        for base in bases:
            pattern = os.path.join(base, item) if base is not None else item
            if any(c in item for c in "*?[]"):
                matches = sorted(glob.glob(os.path.expanduser(pattern)))
            elif os.path.exists(os.path.expanduser(pattern)):
                matches = [os.path.expanduser(pattern)]
            if matches:
                break
        if not matches:
            where = f" (looked in {source} and the working directory)" if source is not None else ""
            raise ArchiveError(f"extra file {item!r} does not exist{where}", item, rule="missing-file",
                               fix="check the path; folders contribute their contents, globs their matches")  # fmt: skip
        for match in matches:
            path = Path(match)
            if path.is_dir():
                out.extend(_walk(path))
            else:
                out.append((path.name, path))
    return out


def _handler_source(handler: str) -> str | None:
    """The file the archiver copies for a handler spec, or None for a built-in name."""
    if handler in ARCHIVER_BUILTINS:
        return None
    module = handler.split(":", 1)[0]
    return module if module.endswith(".py") else module + ".py"


def plan(
    source: str | os.PathLike[str] | None,
    *,
    model_name: str | None,
    handler: str | None,
    model_file: str | None,
    serialized_file: str | None,
    extra_files: str | Sequence[str],
    requirements_file: str | None,
    config_file: str | None,
    version: str | None,
    output_dir: Path | None = None,
) -> Plan:
    """Resolve the inputs into the files to archive and the manifest; reads no file's content.

    A model dir ``source`` gives the defaults: its manifest (``MAR-INF/MANIFEST.json``, else
    inferred from the files) and every file in it. Arguments override; a file given as an
    argument replaces the model dir's file of the same name.
    """
    base: dict[str, Any] = {}
    files: dict[str, Path] = {}
    src: Path | None = None
    if source is not None:
        src = Path(source).expanduser()
        if not src.is_dir():
            raise ArchiveError(f"model dir {os.fspath(source)!r} is not a directory", source, rule="missing-file",
                               fix="pass the folder holding the model files, or source=None and the files "
                               "one by one")  # fmt: skip
        src = src.resolve()
        manifest_path = src / MANIFEST
        base = read_manifest(manifest_path) if manifest_path.is_file() else _inferred(src, model_name, serialized_file)
    model = dict(base.get("model", {}))
    name = model_name or model.get("modelName") or (src.name if src is not None else None)
    if not name or not _MODEL_NAME.match(name):
        raise ArchiveError(f"model name {name!r} is not allowed: TorchServe wants ^[A-Za-z0-9][A-Za-z0-9_\\-.]*$",
                           name, rule="model-name",
                           fix="pass model_name= with letters, digits, '_', '-' and '.'")  # fmt: skip
    if src is not None:
        # Never archive this build's own output (an output dir inside the model dir).
        outputs = [output_dir / f"{name}{ext}" for ext in set(FORMATS.values())] if output_dir is not None else []
        if any(os.path.realpath(o) == str(src) for o in outputs):
            raise ArchiveError(f"the output {output_dir / name} would replace the model dir it is built from", src,
                               rule="exists", fix="choose another output dir")  # fmt: skip
        files.update((rel, path) for rel, path in _walk(src, outputs) if not rel.startswith("MAR-INF/"))
    explicit: dict[str, Path] = {}

    def add(rel: str, path: Path) -> None:
        if rel in explicit and os.path.realpath(explicit[rel]) != os.path.realpath(path):
            raise ArchiveError(f"two files would be archived as {rel!r}: {explicit[rel]} and {path}", path,
                               rule="name-collision", fix="rename one: every file lands in the archive's root")  # fmt: skip
        explicit[rel] = path

    for key, given in (("modelFile", model_file), ("serializedFile", serialized_file),
                       ("requirementsFile", requirements_file), ("configFile", config_file)):  # fmt: skip
        if given:
            path = _find(given, src, key)
            add(path.name, path)
            model[key] = path.name
    spec = handler or model.get("handler")
    if not spec:
        raise ArchiveError("no handler: pass handler= (a built-in name such as 'image_classifier', or a .py file)",
                           source, rule="no-handler", fix="pass handler='handler.py' (or handler.py:function)")  # fmt: skip
    if handler:  # a model dir's own handler file (if any) is among its files already
        wanted = _handler_source(handler)
        if wanted is not None:
            path = _find(wanted, src, "handler")
            add(path.name, path)
    model["handler"] = os.path.basename(spec)
    for rel, path in _expand_extra(extra_files, src):
        add(rel, path)
    files.update(explicit)
    model["modelName"] = name
    model["modelVersion"] = version or model.get("modelVersion") or "1.0"
    manifest = {
        "createdOn": datetime.datetime.now().strftime("%d/%m/%Y %H:%M:%S"),
        "runtime": base.get("runtime", "python"),
        "model": _ordered(model),
        "archiverVersion": ARCHIVER_VERSION,
    }
    problems = [(r, m) for r, m, _ in manifest_problems(manifest, {rel.casefold() for rel in files})]
    if problems:
        rule, message = problems[0]
        raise ArchiveError(message, source, rule=rule, fix="add the file (or pass it as an argument), or drop the key")
    return Plan(name, manifest, files)


def _inferred(src: Path, model_name: str | None, serialized_file: str | None) -> dict[str, Any]:
    """The manifest handlerkit infers for a dir without one; several weights files are fine
    when ``serialized_file`` names the one."""
    try:
        return infer_manifest(src, model_name)[0]
    except ModelLoadError:
        if not serialized_file:
            raise
    roles = (("modelFile", "model.py"), ("handler", "handler.py"), ("configFile", "model-config.yaml"))
    return {"runtime": "python", "model": {key: name for key, name in roles if (src / name).is_file()}}


def _ordered(model: dict[str, Any]) -> dict[str, Any]:
    """The archiver's key order (model_archiver/manifest_components/model.py), others after."""
    order = ("modelName", "serializedFile", "handler", "modelFile", "modelVersion", "extensions",
             "requirementsFile", "configFile")  # fmt: skip
    out = {k: model[k] for k in order if model.get(k)}
    out.update((k, v) for k, v in model.items() if k not in out and v is not None and k not in order)
    return out
