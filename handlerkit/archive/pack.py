"""What goes into a model archive, and why: a :class:`Plan` of the files packed and those left out.

Files named one by one (``source=None``) are packed as ``torch-model-archiver`` 0.12 packs
them: the handler file, ``model_file``, ``serialized_file``, ``requirements_file``,
``config_file`` and ``extra_files`` (files to the archive's root under their base names,
folders' contents with their sub-folders, globs' matches), nothing else; a packed ``.py``
file that imports modules beside it which are not packed gets a note (:attr:`Plan.notes`).

From a model dir, what is packed depends on what the dir is:

- **A model dir** (no ``MAR-INF/MANIFEST.json``; the manifest is inferred from its files, the
  arguments override it): the archiver's rule — the files the manifest references, plus the
  extra files named — and what the packed code evidently needs from the dir: the modules and
  packages of the dir that the packed ``.py`` files import, transitively
  (:mod:`~handlerkit.archive.imports`), and ``index_to_name.json`` when present (TorchServe's
  ``BaseHandler`` reads it from the model dir). Everything else is left out and named
  (:attr:`Plan.left_out`): a training script, notes, data, a ``.env``.
- **An unpacked ``.mar``** (the dir has ``MAR-INF/MANIFEST.json``): every file in it is packed
  (sub-folders kept). The archiver flattened the original extra files into the dir without
  naming them anywhere, and a handler may open any of them at run time by a relative path
  (the worker runs in the model dir), so the only rule that cannot lose one is to keep them
  all; re-archiving gives back the archive it came from. A dir kept in this form by hand
  (with a written manifest) is treated the same; every packed file is listed with its reason.
  A file of the dir named in ``extra_files`` keeps its place in it (it is not flattened).

Never swept in (:data:`~handlerkit.archive.rules.NEVER_SWEPT`): hidden files and names that
look like secrets (``.env``, ``*.pem``, ``id_rsa``, ``credentials.json``…). An extra-files
folder or glob, or an unpacked ``.mar``, that holds one is refused (:class:`ArchiveError`,
rule ``secret-file``, naming each file); a model dir leaves them out and names them. A file
named explicitly (an extra file, or a file the manifest names) is packed, and the listing
says so. ``.git`` is never packed; dot-folders, ``__pycache__``, ``*.pyc`` and ``.DS_Store``
are skipped everywhere, as the archiver skips them.

:func:`plan` reads no file's content but the ``.py`` files it scans;
:meth:`Plan.write` writes the archive (:mod:`~handlerkit.archive.write`).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from handlerkit._render import Rendered, Table
from handlerkit._text import format_bytes
from handlerkit.archive.imports import local_imports
from handlerkit.archive.manifest import FILE_KEYS, check_model_name, complete, handler_source, start_from
from handlerkit.archive.rules import MANIFEST, ArchiveError, manifest_problems, secret_looking
from handlerkit.archive.write import FORMATS, check_options, write
from handlerkit.errors import ModelLoadError
from handlerkit.worker.modeldir import resolve_path

__all__ = ["LeftOut", "PackedFile", "Plan", "plan"]

_JUNK_DIRS = {"__pycache__", "__MACOSX"}
_JUNK_FILES = (".pyc", ".DS_Store")
INDEX_TO_NAME = "index_to_name.json"
NOT_REFERENCED = "not referenced"


@dataclass(frozen=True)
class PackedFile:
    """One file of the archive: its path there, its size, where it comes from and why it is in."""

    name: str
    size: int
    source: Path
    reason: str


@dataclass(frozen=True)
class LeftOut:
    """A file (or a folder, ending in ``/``) of the model dir that is not packed, and why.

    ``hidden``: left out for being hidden or secret-looking (:data:`~handlerkit.archive.rules.NEVER_SWEPT`); naming the
    file packs it all the same. Else it is not referenced, or an earlier archive.
    """

    name: str
    reason: str
    hidden: bool = False


@dataclass(repr=False)
class Plan(Rendered):
    """What a build writes: the manifest, the files packed and the model dir's files left out.

    Attributes:
        model_name: the archive's and the model's name.
        manifest: the manifest written (``createdOn`` is the planning time).
        files: each file packed, in the order written, with its reason.
        left_out: the model dir's files and folders not packed, with their reason.
        output_dir: where :meth:`write` writes.
        source: the model dir (None: files named one by one).
        layout: ``"files"``, ``"model dir"`` or ``"unpacked .mar"`` (see the module docstring).
        notes: what a person should know (a ``.py`` file that could not be scanned).
    """

    model_name: str
    manifest: dict[str, Any]
    files: list[PackedFile]
    left_out: list[LeftOut] = field(default_factory=list)
    output_dir: Path = Path(".")
    source: Path | None = None
    layout: str = "files"
    notes: list[str] = field(default_factory=list)

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def output(self, archive_format: str = "default") -> Path:
        """The path :meth:`write` writes for ``archive_format``."""
        check_options(archive_format, "auto")
        return self.output_dir / f"{self.model_name}{FORMATS[archive_format]}"

    def write(
        self, archive_format: str = "default", *, force: bool = False, compression: str = "auto",
        progress: bool | None = None,
    ) -> Path:  # fmt: skip
        """Write the archive (see :func:`handlerkit.archive.build` for the arguments); returns its path.

        Raises:
            ArchiveError: (``exists``) the output exists and ``force`` is False, or the
                output dir is a file.
        """
        check_options(archive_format, compression)
        if self.output_dir.exists() and not self.output_dir.is_dir():
            raise ArchiveError(f"output dir {self.output_dir} is a file", self.output_dir, rule="exists",
                               fix="pass a folder")  # fmt: skip
        output = self.output(archive_format)
        if output.exists() and not force:
            raise ArchiveError(f"{output} already exists", output, rule="exists",
                               fix="pass force=True (--force) to replace it, or choose another output dir")  # fmt: skip
        self.output_dir.mkdir(parents=True, exist_ok=True)
        files = {f.name: f.source for f in self.files}
        return write(files, self.manifest, output, archive_format=archive_format, compression=compression,
                     progress=progress)  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        return {
            "model_name": self.model_name,
            "source": str(self.source) if self.source is not None else None,
            "layout": self.layout,
            "manifest": self.manifest,
            "total_bytes": self.total_size,
            "files": [{"name": f.name, "bytes": f.size, "why": f.reason, "from": str(f.source)} for f in self.files],
            "left_out": [{"name": f.name, "why": f.reason} for f in self.left_out],
            "notes": self._notes(),
        }

    def _summary(self) -> str:
        text = f"{self.model_name}: {len(self.files)} files, {format_bytes(self.total_size)}"
        if self.source is not None:
            text += f", from the {self.layout} {self.source.name}/"
        return text + (f" ({len(self.left_out)} left out)" if self.left_out else "")

    def _tables(self) -> list[Table]:
        return [Table(("packed", "size", "why"), [(f.name, format_bytes(f.size), f.reason) for f in self.files])]

    def _notes(self) -> list[str]:
        notes = []
        plain = [f.name for f in self.left_out if not f.hidden]
        if plain:
            notes.append(f"not packed: {', '.join(plain)} — name them with --extra-files (extra_files=) to pack them")
        hidden = [f.name for f in self.left_out if f.hidden]
        if hidden:
            notes.append(f"not packed, hidden or secret-looking: {', '.join(hidden)} — a file named with "
                         "--extra-files is packed all the same (.git never is)")  # fmt: skip
        return notes + self.notes


class _Chosen:
    """The files chosen so far, by archive path; a file named explicitly wins over the dir's."""

    def __init__(self) -> None:
        self.files: dict[str, PackedFile] = {}
        self.explicit: set[str] = set()

    def add(self, name: str, path: Path, reason: str, *, explicit: bool) -> None:
        old = self.files.get(name)
        if old is not None:
            if name in self.explicit:
                if explicit and os.path.realpath(old.source) != os.path.realpath(path):
                    raise ArchiveError(f"two files would be archived as {name!r}: {old.source} and {path}", path,
                                       rule="name-collision", fix="rename one: every file lands in the archive's root")  # fmt: skip
                return  # a file named explicitly stays
            if not explicit:
                return  # the first reason stays
        self.files[name] = PackedFile(name, path.stat().st_size, path, reason)
        if explicit:
            self.explicit.add(name)

    def sources(self) -> set[str]:
        """The real paths of the files chosen."""
        return {os.path.realpath(f.source) for f in self.files.values()}


def plan(
    source: str | os.PathLike[str] | None,
    output_dir: str | os.PathLike[str],
    *,
    model_name: str | None = None,
    handler: str | None = None,
    model_file: str | None = None,
    serialized_file: str | None = None,
    extra_files: str | Sequence[str] = (),
    requirements_file: str | None = None,
    config_file: str | None = None,
    version: str | None = None,
) -> Plan:
    """Decide what an archive holds, and why, without writing anything.

    The arguments are :func:`handlerkit.archive.build`'s; the module docstring says which files
    a model dir contributes. ``plan(...).write(archive_format)`` is ``build``.

    Raises:
        ArchiveError: a missing input file (``missing-file``), no handler (``no-handler``), a
            bad model name, two files with one archive name (``name-collision``), a folder,
            glob or unpacked ``.mar`` holding a hidden or secret-looking file
            (``secret-file``), a manifest naming a file that is not packed.
    """
    out_dir = Path(output_dir).expanduser()
    src = _model_dir(source)
    unpacked = src is not None and (src / MANIFEST).is_file()
    base = start_from(src, model_name, serialized_file)
    model = dict(base.get("model", {}))
    name = check_model_name(model_name or model.get("modelName") or (src.name if src is not None else None))
    outputs = {os.path.realpath(out_dir / f"{name}{ext}") for ext in set(FORMATS.values())}
    if src is not None and str(src) in outputs:
        raise ArchiveError(f"the output {out_dir / name} would replace the model dir it is built from", src,
                           rule="exists", fix="choose another output dir")  # fmt: skip
    chosen = _Chosen()
    given = {"modelFile": model_file, "serializedFile": serialized_file, "requirementsFile": requirements_file,
             "configFile": config_file}  # fmt: skip
    for key in FILE_KEYS:
        named = given[key]
        if named:
            path = _find(named, src, key)
            chosen.add(path.name, path, f"the manifest's {key}", explicit=True)
            model[key] = path.name
    spec = handler or model.get("handler")
    if not spec:
        raise ArchiveError("no handler: pass handler= (a built-in name such as 'image_classifier', or a .py file)",
                           source, rule="no-handler", fix="pass handler='handler.py' (or handler.py:function)")  # fmt: skip
    wanted = handler_source(handler) if handler else None
    if wanted is not None:
        path = _find(wanted, src, "handler")
        chosen.add(path.name, path, "the manifest's handler", explicit=True)
    model["handler"] = os.path.basename(spec)
    _add_extras(chosen, extra_files, src, keep_places=unpacked)
    left_out: list[LeftOut] = []
    notes: list[str] = [] if src is not None else _imports_left_behind(chosen)
    if src is not None:
        _add_referenced(chosen, src, model)
        if unpacked:
            left_out = _add_unpacked(chosen, src, outputs)
        else:
            notes = _add_needed(chosen, src)
            left_out = _left_out(src, chosen, outputs)
    manifest = complete(base, model, name, version)
    problems = manifest_problems(manifest, {rel.casefold() for rel in chosen.files})
    if problems:
        rule, message, _ = problems[0]
        raise ArchiveError(message, source, rule=rule, fix="add the file (or pass it as an argument), or drop the key")
    layout = "files" if src is None else "unpacked .mar" if unpacked else "model dir"
    return Plan(name, manifest, list(chosen.files.values()), left_out, out_dir, src, layout, notes)


def _model_dir(source: str | os.PathLike[str] | None) -> Path | None:
    if source is None:
        return None
    src = Path(source).expanduser()
    if not src.is_dir():
        raise ArchiveError(f"model dir {os.fspath(source)!r} is not a directory", source, rule="missing-file",
                           fix="pass the folder holding the model files, or source=None and the files "
                           "one by one")  # fmt: skip
    return src.resolve()


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


# ------------------------------------------------------------------------------------ sweeping
def _sweep(folder: Path, skip: Iterable[str] = ()) -> tuple[list[tuple[str, Path]], list[str]]:
    """(relative posix path, file) of every file under ``folder`` as the archiver sweeps a
    folder (no ``__pycache__``, ``__MACOSX`` or dot-folders, no ``*.pyc``, ``.DS_Store``), and
    the dot-folders skipped. ``skip``: real paths left out silently (this build's outputs)."""
    skipped = set(skip)
    files: list[tuple[str, Path]] = []
    hidden: list[str] = []
    for root, dirs, names in os.walk(folder):
        rel_root = Path(root).relative_to(folder).as_posix()
        prefix = "" if rel_root == "." else f"{rel_root}/"
        keep = []
        for d in sorted(dirs):
            if d in _JUNK_DIRS or os.path.realpath(Path(root, d)) in skipped:
                continue
            if d.startswith("."):
                hidden.append(f"{prefix}{d}/")
                continue
            keep.append(d)
        dirs[:] = keep
        for name in sorted(names):
            path = Path(root, name)
            if not name.endswith(_JUNK_FILES) and os.path.realpath(path) not in skipped:
                files.append((f"{prefix}{name}", path))
    return files, hidden


def _refuse(found: list[tuple[str, str, Path]], where: str, base: Path | None, leave_out: str, path: Path) -> NoReturn:
    """Refuse the hidden or secret-looking files a sweep would pack (``found``: shown name, why, file)."""

    def named(file: Path) -> str:
        shown = os.path.relpath(file, base) if base is not None and file.is_relative_to(base) else str(file)
        return f"--extra-files {shown} or extra_files=[{shown!r}]"

    problems = [ArchiveError(f"{where} would sweep in {shown}, which {why}", file, rule="secret-file", member=shown,
                             fix=f"to pack it, name it: {named(file)}; else {leave_out}") for shown, why, file in found]  # fmt: skip
    listed = "; ".join(f"{shown}, which {why}" for shown, why, _ in found)
    raise ArchiveError(f"{where} would sweep in {listed}", path, rule="secret-file", member=found[0][0],
                       fix=f"to pack a file, name it ({named(found[0][2])}); to leave it out, {leave_out}",
                       problems=problems)  # fmt: skip


def _add_extras(chosen: _Chosen, extra_files: str | Sequence[str], source: Path | None, keep_places: bool) -> None:
    """The archiver's --extra-files: files flattened to the root, folders' contents, globs; a
    hidden or secret-looking file is packed only when named itself. ``keep_places``: files of
    ``source`` (an unpacked ``.mar``) keep their paths in it instead of being flattened."""

    def place(path: Path, flat: str) -> str:
        real = path.resolve()
        return real.relative_to(source).as_posix() if keep_places and source and real.is_relative_to(source) else flat

    items = extra_files.split(",") if isinstance(extra_files, str) else list(extra_files)
    for item in (os.fspath(i).strip() for i in items):
        if not item:
            continue
        is_glob = any(c in item for c in "*?[]")
        matches = _matches(item, is_glob, source)
        refused: list[tuple[str, str, Path]] = []
        for match in matches:
            path = Path(match)
            if ".git" in path.parts:
                raise ArchiveError(f"extra file {item!r} is in .git, which is never packed", path, rule="secret-file",
                                   member=item, fix="leave it out: the repository's history is no model file")  # fmt: skip
            if path.is_dir():
                files, _ = _sweep(path)
                for rel, file in files:
                    why = secret_looking(file.name)
                    if why:
                        refused.append((f"{path.name}/{rel}", why, file))
                    else:
                        chosen.add(place(file, rel), file, f"in extra folder {path.name}/", explicit=True)
                continue
            why = secret_looking(path.name)
            if why and is_glob:
                refused.append((path.name, why, path))
            elif why:
                chosen.add(place(path, path.name), path, f"named explicitly, though it {why}", explicit=True)
            else:
                reason = f"matches extra files {item!r}" if is_glob else "extra file"
                chosen.add(place(path, path.name), path, reason, explicit=True)
        if refused:
            where = f"extra files {item!r}" if is_glob else f"extra folder {item!r}"
            base = source if source is not None and refused[0][2].is_relative_to(source) else Path.cwd()
            _refuse(refused, where, base, "name the files you want instead of the folder or glob", Path(matches[0]))


def _matches(item: str, is_glob: bool, source: Path | None) -> list[str]:
    bases = [source, Path.cwd()] if source is not None and not os.path.isabs(item) else [None]
    for base in bases:
        pattern = os.path.expanduser(os.path.join(base, item) if base is not None else item)
        if is_glob and (found := sorted(glob.glob(pattern))):
            return found
        if not is_glob and os.path.exists(pattern):
            return [pattern]
    where = f" (looked in {source} and the working directory)" if source is not None else ""
    raise ArchiveError(f"extra file {item!r} does not exist{where}", item, rule="missing-file",
                       fix="check the path; folders contribute their contents, globs their matches")  # fmt: skip


# ------------------------------------------------------------------------------------ model dirs
def _add_referenced(chosen: _Chosen, src: Path, model: dict[str, Any]) -> None:
    """The files of the model dir that the manifest names (the handler's module among them)."""
    named = [("handler", handler_source(model["handler"]))] + [(key, model.get(key)) for key in FILE_KEYS]
    for key, value in named:
        if isinstance(value, str) and value and (src / value).is_file():
            chosen.add(Path(value).as_posix(), src / value, f"the manifest's {key}", explicit=False)


def _add_unpacked(chosen: _Chosen, src: Path, outputs: set[str]) -> list[LeftOut]:
    """Every file of an unpacked ``.mar``; a hidden or secret-looking one the manifest or an
    argument does not name is refused. Returns what is left out (dot-folders, archives)."""
    files, hidden = _sweep(src, outputs)
    left_out = [LeftOut(d, secret_looking(d.rstrip("/").rsplit("/", 1)[-1]) or "", True) for d in hidden]
    refused: list[tuple[str, str, Path]] = []
    for rel, path in files:
        if rel.startswith("MAR-INF/") or rel in chosen.files:
            continue  # the manifest is written anew; a file named explicitly is in already
        why = secret_looking(path.name)
        if why:
            refused.append((rel, why, path))
        elif rel.endswith(".mar"):
            left_out.append(LeftOut(rel, "an archive (an earlier build?)"))
        else:
            chosen.add(rel, path, "in the unpacked .mar", explicit=False)
    if refused:
        where = f"the unpacked .mar {src.name}/ (it has {MANIFEST}: all its files are packed)"
        _refuse(refused, where, src, "move it out of the model dir", src)
    return left_out


def _add_needed(chosen: _Chosen, src: Path) -> list[str]:
    """What the packed code evidently needs from a model dir: ``index_to_name.json`` and the
    modules and packages the packed ``.py`` files import (less their hidden or secret-looking
    files). Returns the scan's notes."""
    if (src / INDEX_TO_NAME).is_file():
        chosen.add(INDEX_TO_NAME, src / INDEX_TO_NAME, "labels: TorchServe's BaseHandler reads it", explicit=False)
    starts = [(f.name, f.source) for f in chosen.files.values() if f.name.endswith(".py")]
    found, notes = local_imports(src, starts)
    for target, importer in found.items():
        reason = f"imported by {importer}"
        if not target.is_dir():
            chosen.add(target.name, target, reason, explicit=False)
            continue
        for rel, path in _sweep(target)[0]:
            if not secret_looking(path.name):
                chosen.add(f"{target.name}/{rel}", path, reason, explicit=False)
    return notes


def _imports_left_behind(chosen: _Chosen) -> list[str]:
    """For files named one by one: the modules beside the packed ``.py`` files that they import
    and that are not packed (the archiver packs only what is named; the worker will not find them)."""
    notes = []
    packed = chosen.sources()
    folders: dict[Path, list[tuple[str, Path]]] = {}
    for f in chosen.files.values():
        if f.name.endswith(".py"):
            folders.setdefault(f.source.parent, []).append((f.name, f.source))
    for folder, starts in folders.items():
        found, _ = local_imports(folder, starts)
        missing = {t: importer for t, importer in found.items() if os.path.realpath(t) not in packed
                   and not any(p.startswith(os.path.realpath(t) + os.sep) for p in packed)}  # fmt: skip
        if missing:
            names = ", ".join(t.name + ("/" if t.is_dir() else "") for t in missing)
            notes.append(f"{names} in {folder}: imported by {', '.join(sorted(set(missing.values())))} but not "
                         "packed; name them with --extra-files (extra_files=), or archive the model dir they "
                         "belong to")  # fmt: skip
    return notes


def _left_out(src: Path, chosen: _Chosen, outputs: set[str]) -> list[LeftOut]:
    """The model dir's files and folders not packed: a folder none of whose files is packed is
    named once (``data/``), without walking into it."""
    packed = chosen.sources()
    out: list[LeftOut] = []

    def visit(folder: Path, prefix: str) -> None:
        for entry in sorted(folder.iterdir()):
            real, rel = os.path.realpath(entry), f"{prefix}{entry.name}"
            if entry.name in _JUNK_DIRS or entry.name.endswith(_JUNK_FILES) or real in outputs or real in packed:
                continue
            why = secret_looking(entry.name)
            reason = why or NOT_REFERENCED
            if not entry.is_dir():
                out.append(LeftOut(rel, reason, bool(why)))
            elif any(p.startswith(real + os.sep) for p in packed):
                visit(entry, f"{rel}/")
            else:
                out.append(LeftOut(f"{rel}/", reason, bool(why)))

    visit(src, "")
    return out
