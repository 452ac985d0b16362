"""Model archives (``.mar``): build them as ``torch-model-archiver`` 0.12 does, open them safely.

Build from a model dir (its manifest, or the one handlerkit infers, gives the defaults) or
from files one by one, in the archiver's three forms::

    from handlerkit import archive
    mar = archive.build("fixtures/models/image_classifier", "model_store")   # model_store/image_classifier.mar
    archive.build(None, "store", model_name="shapes", handler="handler.py", serialized_file="model.pt",
                  model_file="model.py", extra_files=["index_to_name.json"], archive_format="tgz")

The manifest is the archiver's, key for key (:mod:`handlerkit._archive_write`); weights are
stored rather than deflated, which makes building a 500 MB archive several times faster
(``benchmarks/archive_vs_model_archiver.py``).

Open any archive, whoever built it::

    model_dir = archive.open_mar("shapes.mar", "unpacked/shapes")   # or a temp dir
    archive.read_manifest("shapes.mar")                             # without extracting
    archive.inspect_archive("shapes.mar")                           # files, sizes, manifest

Before writing a byte, opening refuses archives that break a rule
(:data:`~handlerkit._archive_rules.RULES`): paths escaping the target (``..``, absolute),
links, devices, duplicate names, declared sizes over the zip-bomb :class:`Limits`, entries
sharing data, a missing or malformed ``MAR-INF/MANIFEST.json``, a manifest naming a missing
file, a truncated file. Each refusal is an :class:`ArchiveError` naming the archive, the entry,
the rule and the fix; extraction is all or nothing (:mod:`handlerkit._archive_extract`).

``MockContext.from_mar(path)`` (and ``from_model_dir`` given a ``.mar``) extracts into a
private temp dir that lives as long as the context (:func:`open_temporary`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from handlerkit._archive_extract import extract
from handlerkit._archive_read import list_archive, read_manifest_entry, sniff
from handlerkit._archive_rules import MANIFEST, RULES, ArchiveError, Limits, Listing
from handlerkit._archive_write import FORMATS, plan, write
from handlerkit._render import Rendered, Table
from handlerkit._text import format_bytes

__all__ = [
    "ArchiveError",
    "ArchiveInfo",
    "ExtractedArchive",
    "FileInfo",
    "Limits",
    "RULES",
    "build",
    "context_from_mar",
    "inspect_archive",
    "is_archive",
    "open_mar",
    "open_temporary",
    "read_manifest",
]

_SUFFIXES = (".mar", ".tar.gz", ".tgz", ".zip")


def build(
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
    archive_format: str = "default",
    force: bool = False,
    progress: bool | None = None,
    compression: str = "auto",
) -> Path:
    """Build a model archive with the manifest ``torch-model-archiver`` 0.12 would write.

    Args:
        source: a model dir, whose files are all archived (less ``MAR-INF/``,
            ``__pycache__``, dot-folders, ``*.pyc``, ``*.mar``) and whose manifest (or the one
            inferred from its files) gives every default; or None, to give the files one by one.
        output_dir: where the archive goes (created if missing).
        model_name: the archive's and the model's name (default: the manifest's, else the
            dir's); ``^[A-Za-z0-9][A-Za-z0-9_\\-.]*$``.
        handler: a built-in name (``image_classifier``), a file (``dir/handler.py``,
            ``dir/handler.py:fn``, ``dir/handler:fn``) archived as its base name.
        model_file, serialized_file, requirements_file, config_file: files archived under their
            base names and named in the manifest. Relative paths are looked up in ``source``
            first, then in the working directory.
        extra_files: files (to the root), folders (their contents, sub-folders kept) and globs;
            a string is split on commas, as ``--extra-files``.
        version: ``modelVersion`` (default: the manifest's, else ``"1.0"``).
        archive_format: ``"default"`` (``<name>.mar``, a zip), ``"tgz"`` (``<name>.tar.gz``),
            ``"no-archive"`` (the folder ``<name>/``) or ``"zip-store"`` (a zip, nothing deflated).
        force: replace an existing output (else :class:`ArchiveError`, rule ``exists``).
        progress: a progress bar in MiB (None: where a person watches, see ``_progress``).
        compression: ``"auto"`` (weights and incompressible files stored, the rest deflated),
            ``"deflate"`` (everything, as the archiver) or ``"store"``.

    Returns:
        The ``.mar``, ``.tar.gz`` or folder written.

    Raises:
        ArchiveError: a missing input file (``missing-file``), no handler (``no-handler``), a
            bad model name, two files with one archive name (``name-collision``), a manifest
            naming a file that is not archived, or an existing output without ``force``.
    """
    if archive_format not in FORMATS:
        raise ValueError(f"archive_format must be one of {sorted(FORMATS)}: got {archive_format!r}")
    if compression not in ("auto", "deflate", "store"):
        raise ValueError(f"compression must be 'auto', 'deflate' or 'store': got {compression!r}")
    out_dir = Path(output_dir).expanduser()
    if out_dir.exists() and not out_dir.is_dir():
        raise ArchiveError(f"output dir {out_dir} is a file", out_dir, rule="exists", fix="pass a folder")
    planned = plan(
        source,
        model_name=model_name,
        handler=handler,
        model_file=model_file,
        serialized_file=serialized_file,
        extra_files=extra_files,
        requirements_file=requirements_file,
        config_file=config_file,
        version=version,
        output_dir=out_dir,
    )
    output = out_dir / f"{planned.model_name}{FORMATS[archive_format]}"
    if output.exists() and not force:
        raise ArchiveError(f"{output} already exists", output, rule="exists",
                           fix="pass force=True (--force) to replace it, or choose another output dir")  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    return write(planned, output, archive_format, compression, progress)


def is_archive(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a file to open as an archive: by its name or its first bytes."""
    p = Path(path)
    return p.is_file() and (p.name.lower().endswith(_SUFFIXES) or sniff(p) is not None)


def open_mar(
    path: str | os.PathLike[str],
    target: str | os.PathLike[str] | None = None,
    *,
    limits: Limits | None = None,
) -> Path:
    """Extract a ``.mar`` (or ``.tar.gz``) safely and return the model dir.

    Every entry and the manifest are checked before anything is written; extraction goes into
    a hidden sibling of ``target`` renamed into place at the end, so a refused or damaged
    archive leaves nothing behind. A tar.gz's top folder (``<name>/``) is stripped.

    Args:
        path: the archive.
        target: a folder that does not exist yet (or is empty); None makes a fresh temp dir,
            which the caller removes (:func:`open_temporary` removes it for you).
        limits: zip-bomb limits (default :class:`Limits`).

    Raises:
        ArchiveError: the archive breaks a rule (``.rule``; ``.problems`` lists all of them).
    """
    listing = list_archive(path, limits)
    listing.raise_problems()
    if target is not None:
        return extract(listing, Path(target).expanduser().absolute())
    stem = _stem(Path(path))
    tmp = Path(tempfile.mkdtemp(prefix=f"handlerkit-{stem}-"))
    try:
        return extract(listing, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _stem(path: Path) -> str:
    name = path.name
    for suffix in _SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


class ExtractedArchive:
    """A model dir extracted into a temp dir, removed when this object goes (or at exit).

    ``MockContext.from_mar`` keeps one on the context (``ctx.archive``), so the files live
    exactly as long as the context; :meth:`cleanup` (or ``with``) removes them earlier. Copies
    share the same directory; a pickled copy (a child process) never removes it.

    Attributes:
        path: the model dir.
        source: the archive it came from.
    """

    def __init__(self, path: Path, source: Path, *, owner: bool = True) -> None:
        self.path = path
        self.source = source
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(path), True) if owner else None

    def cleanup(self) -> None:
        """Remove the extracted files now."""
        if self._finalizer is not None:
            self._finalizer()

    @property
    def alive(self) -> bool:
        """Whether the files are still there."""
        return self.path.is_dir()

    def __enter__(self) -> ExtractedArchive:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cleanup()

    def __copy__(self) -> ExtractedArchive:
        return self

    def __deepcopy__(self, memo: dict) -> ExtractedArchive:
        return self

    def __reduce__(self) -> Any:
        return (_borrowed, (str(self.path), str(self.source)))

    def __repr__(self) -> str:
        return f"ExtractedArchive({self.source.name} -> {self.path}{'' if self.alive else ', removed'})"


def _borrowed(path: str, source: str) -> ExtractedArchive:
    return ExtractedArchive(Path(path), Path(source), owner=False)


_OWNED = "handlerkit-mar-"  # + "<pid>-<random>": open_temporary's dirs, swept once their process is gone


def open_temporary(path: str | os.PathLike[str], *, limits: Limits | None = None) -> ExtractedArchive:
    """:func:`open_mar` into a temp dir removed when the returned object is collected.

    A process killed before its exit hooks run (a notebook kernel stopped with SIGKILL) cannot
    remove its dirs; each call first removes those of processes that are gone (their names
    carry the pid: ``handlerkit-mar-<pid>-…``).
    """
    _sweep_orphans()
    tmp = Path(tempfile.mkdtemp(prefix=f"{_OWNED}{os.getpid()}-"))
    try:
        return ExtractedArchive(open_mar(path, tmp, limits=limits), Path(path).absolute())
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _sweep_orphans() -> None:
    if os.name != "posix":  # os.kill(pid, 0) probes a process only on POSIX
        return
    root = Path(tempfile.gettempdir())
    for entry in [*root.glob(f"{_OWNED}*-*"), *root.glob(f".{_OWNED}*-*.partial-*")]:
        pid = entry.name.lstrip(".")[len(_OWNED):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: someone else's process
        return True
    return True


def context_from_mar(cls: type, path: str | os.PathLike[str], *, limits: Limits | None = None, **kwargs: Any) -> Any:
    """``MockContext.from_mar``: the archive opened into a temp dir that lives as long as the context.

    The :class:`ExtractedArchive` is kept as ``ctx.archive``: its dir is removed when the
    context (and every copy of it) is collected, or at interpreter exit, or by
    ``ctx.archive.cleanup()``; the dirs of a process killed before its exit (a notebook kernel
    stopped with SIGKILL) are removed by the next call, in any process (:func:`open_temporary`).
    A temp dir rather than a cache keyed by the archive's hash: a
    cache would have to hash every byte of a large archive on each call and would outlive the
    session; extraction is as fast as copying the bytes.

    Args:
        cls: the context class (``MockContext``).
        path: the archive.
        limits: zip-bomb limits for :func:`open_mar`.
        **kwargs: passed to ``cls.from_model_dir`` (``gpu_id``, ``batch_size``, ``config``...).
    """
    if Path(path).is_file() and not is_archive(path):
        raise ArchiveError(
            f"model dir {os.fspath(path)!r} is not a directory, nor a model archive (.mar, .tar.gz)",
            path,
            rule="not-an-archive",
            fix="pass the folder holding the model files (an unpacked .mar)",
        )
    extracted = open_temporary(path, limits=limits)
    try:
        ctx = cls.from_model_dir(extracted.path, **kwargs)
    except BaseException:
        extracted.cleanup()
        raise
    ctx.archive = extracted
    return ctx


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a ``.mar``, a ``.tar.gz`` (without extracting) or a model dir.

    For a model dir without ``MAR-INF/MANIFEST.json``, the manifest handlerkit infers from its
    files (:func:`handlerkit.modeldir.infer_manifest`).

    Raises:
        ArchiveError: not an archive, unreadable, or no (valid) manifest.
    """
    p = Path(path).expanduser()
    if p.is_dir():
        from handlerkit.modeldir import infer_manifest, read_manifest as read_json

        return read_json(p / MANIFEST) if (p / MANIFEST).is_file() else infer_manifest(p)[0]
    return read_manifest_entry(list_archive(p))


# ------------------------------------------------------------------------------------ inspect
@dataclass(frozen=True)
class FileInfo:
    """One file of an archive or model dir (sizes in bytes; ``compressed_size`` None in a tar.gz or dir)."""

    name: str
    size: int
    compressed_size: int | None = None
    compression: str = ""


@dataclass(repr=False)
class ArchiveInfo(Rendered):
    """What an archive (or model dir) holds: its files, its manifest, and any problem.

    Attributes:
        path: the archive or dir.
        format: ``"zip"`` (a ``.mar``), ``"tgz"`` or ``"dir"``.
        files: each file, with its size and (zip) compressed size and method.
        manifest: the manifest (None when missing or unreadable).
        problems: every rule the archive breaks (:class:`ArchiveError`); opening it would
            raise the first.
        inferred: for a model dir without a manifest, each key and why it was inferred.
        archive_size: the archive file's size (a dir: the files' total).
    """

    path: Path
    format: str
    files: list[FileInfo]
    manifest: dict[str, Any] | None
    problems: list[ArchiveError] = field(default_factory=list)
    inferred: dict[str, str] = field(default_factory=dict)
    archive_size: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        return {
            "path": str(self.path),
            "format": self.format,
            "archive_size": self.archive_size,
            "total_size": self.total_size,
            "manifest": self.manifest,
            "inferred": dict(self.inferred),
            "files": [asdict(f) for f in self.files],
            "problems": [{"rule": p.rule, "member": p.member, "message": p.message, "fix": p.fix} for p in self.problems],
        }

    def _summary(self) -> str:
        model = (self.manifest or {}).get("model", {})
        what = {"zip": ".mar (zip)", "tgz": "tar.gz", "dir": "model dir"}[self.format]
        text = (
            f"{self.path.name}: {what}, {len(self.files)} files, {format_bytes(self.total_size)}"
            + (f" ({format_bytes(self.archive_size)} archived)" if self.format != "dir" else "")
        )
        if model:
            text += f", model {model.get('modelName')!r} handler {model.get('handler')!r}"
        if self.problems:
            text += f", {len(self.problems)} problem{'s' * (len(self.problems) > 1)}"
        return text

    def _tables(self) -> list[Table]:
        tables = []
        if self.manifest is not None:
            rows = [(k, v) for k, v in self.manifest.items() if k != "model"]
            rows += [(f"model.{k}", v) for k, v in self.manifest.get("model", {}).items()]
            tables.append(Table(("", ""), rows, title="manifest" + (" (inferred)" if self.inferred else "")))
        rows = [
            (f.name, format_bytes(f.size), format_bytes(f.compressed_size) if f.compressed_size is not None else "",
             f.compression)
            for f in self.files
        ]  # fmt: skip
        tables.append(Table(("file", "size", "compressed", "method"), rows, title="files"))
        if self.problems:
            rows = [(p.rule, p.member or "", p.message, p.fix or "") for p in self.problems]
            tables.append(Table(("rule", "entry", "problem", "fix"), rows, title="problems"))
        return tables

    def _notes(self) -> list[str]:
        notes = []
        if self.inferred:
            notes.append(f"no {MANIFEST}: the manifest is inferred from the files (see .inferred)")
        if self.problems:
            notes.append("opening this archive is refused: " + "; ".join(sorted({p.rule for p in self.problems})))
        return notes


def inspect_archive(path: str | os.PathLike[str], *, limits: Limits | None = None) -> ArchiveInfo:
    """What a ``.mar``, ``.tar.gz`` or model dir holds, read without extracting anything.

    Problems (the rules :func:`open_mar` would refuse on) are collected, not raised.

    Raises:
        ArchiveError: the path is missing, not an archive, or unreadable (truncated).
    """
    p = Path(path).expanduser()
    if p.is_dir():
        return _inspect_dir(p)
    listing: Listing = list_archive(p, limits)
    files = [
        FileInfo(e.path, e.size, e.compressed_size, e.compression)
        for e in listing.entries
        if e.path and e.kind == "file"
    ]
    return ArchiveInfo(p, listing.format, files, listing.manifest, list(listing.problems), {}, listing.archive_size)


def _inspect_dir(path: Path) -> ArchiveInfo:
    from handlerkit.modeldir import infer_manifest, read_manifest as read_json

    files = []
    for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            full = Path(root, name)
            files.append(FileInfo(full.relative_to(path).as_posix(), full.stat().st_size))
    manifest_path = path / MANIFEST
    if manifest_path.is_file():
        manifest, inferred = read_json(manifest_path), {}
    else:
        manifest, inferred = infer_manifest(path)
    return ArchiveInfo(path, "dir", files, manifest, [], inferred, sum(f.size for f in files))
