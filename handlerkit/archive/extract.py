"""Opening an archive: checked first, then extracted all at once or not at all.

:func:`open_mar` lists the archive (:func:`handlerkit.archive.read.list_archive`) and refuses
it, before writing a byte, when it breaks a rule. Everything is then written into a hidden sibling of the target (``.<target>.partial-…``), renamed
onto the target at the end and removed on any failure, so a corrupt entry found halfway (a bad
CRC, data longer than declared) leaves nothing behind. Files are created with ``open(..., "xb")``
(never through an existing file or link), under paths checked again against the root.

:func:`open_temporary` (and ``MockContext.from_mar``, through :func:`context_from_mar`)
extracts into a private temp dir that lives as long as the returned object.
"""

from __future__ import annotations

import functools
import os
import shutil
import tarfile
import tempfile
import uuid
import weakref
import zipfile
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from handlerkit._text import format_bytes
from handlerkit.archive.read import is_archive, list_archive, stem
from handlerkit.archive.rules import REBUILD, ArchiveError, Entry, Limits, Listing

__all__ = ["ExtractedArchive", "context_from_mar", "extract", "name_archive_files", "open_mar", "open_temporary"]

_CHUNK = 1 << 20


def extract(listing: Listing, target: Path) -> Path:
    """Extract a listed archive into ``target`` (absent or an empty dir); all or nothing.

    Raises:
        ArchiveError: the listing's problems (before anything is written), too little disk
            space, a target that is not empty, or data that disagrees with the directory (the
            partial extraction is removed).
    """
    listing.raise_problems()
    target = Path(target)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ArchiveError(f"{target} exists and is not an empty folder", target, rule="exists",
                           fix="extract into a new or empty folder")  # fmt: skip
    parent = target.parent
    existing = next(p for p in (parent, *parent.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if listing.total_size > free:
        raise ArchiveError(f"{listing.path.name} declares {format_bytes(listing.total_size)} but {existing} has "
                           f"{format_bytes(free)} free", listing.path, rule="disk-space",
                           fix="free space or pick another target")  # fmt: skip
    parent.mkdir(parents=True, exist_ok=True)
    staging = parent / f".{target.name}.partial-{uuid.uuid4().hex[:8]}"
    os.mkdir(staging)
    try:
        (_extract_zip if listing.format == "zip" else _extract_tgz)(listing, staging)
        if target.exists():
            target.rmdir()
        os.rename(staging, target)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error)):
            raise ArchiveError(f"{listing.path.name} is damaged: {exc}; nothing was extracted", listing.path,
                               rule="corrupt", fix=f"download or copy it again, or {REBUILD}") from exc  # fmt: skip
        raise
    return target


def _destination(root: Path, rel: str) -> Path:
    dest = root.joinpath(*rel.split("/"))
    # Belt and braces: the names were checked, and no link was ever created under root.
    if os.path.commonpath([root, dest]) != str(root):
        raise ArchiveError(f"{rel!r} escapes the target", root, rule="zip-slip", member=rel)
    return dest


def _write(source: Any, dest: Path, entry: Entry, listing: Listing) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with open(dest, "xb") as out:  # "x": never through an existing file or link
        while chunk := source.read(_CHUNK):
            written += len(chunk)
            if written > entry.size:
                raise ArchiveError(f"{entry.name!r} yields more than the {format_bytes(entry.size)} it declares",
                                   listing.path, rule="zip-bomb", member=entry.name, fix=REBUILD)  # fmt: skip
            out.write(chunk)
    if written != entry.size:
        raise ArchiveError(f"{entry.name!r} yields {written} bytes, not the {entry.size} it declares", listing.path,
                           rule="corrupt", member=entry.name, fix=REBUILD)  # fmt: skip


def _extract_zip(listing: Listing, root: Path) -> None:
    with zipfile.ZipFile(listing.path) as zf:
        _extract_members(listing, root, ((i.orig_filename, functools.partial(zf.open, i)) for i in zf.infolist()))


def _extract_tgz(listing: Listing, root: Path) -> None:
    with tarfile.open(listing.path, "r:gz") as tf:
        _extract_members(listing, root, ((m.name, functools.partial(tf.extractfile, m)) for m in iter(tf.next, None)))


def _extract_members(listing: Listing, root: Path, members: Iterable[tuple[str, Callable[[], Any]]]) -> None:
    """Write each checked entry of ``listing`` from the archive's members (name, opener of its
    data), in the archive's order; members the listing does not hold are skipped."""
    wanted = {e.name: e for e in listing.entries if e.path}
    for name, open_data in members:
        entry = wanted.get(name)
        if entry is None:
            continue
        dest = _destination(root, entry.path)
        if entry.kind == "dir":
            dest.mkdir(parents=True, exist_ok=True)
            continue
        source = open_data()
        if source is not None:
            with source:
                _write(source, dest, entry, listing)


def open_mar(
    path: str | os.PathLike[str], target: str | os.PathLike[str] | None = None, *, limits: Limits | None = None
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
    tmp = Path(tempfile.mkdtemp(prefix=f"handlerkit-{stem(Path(path))}-"))
    try:
        return extract(listing, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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
        pid = entry.name.lstrip(".")[len(_OWNED) :].split("-", 1)[0]
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


def context_from_mar(cls: Any, path: str | os.PathLike[str], *, limits: Limits | None = None, **kwargs: Any) -> Any:
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


def name_archive_files(error: BaseException, unpacked: str, archive: str) -> None:
    """Name the files of ``unpacked`` (where ``archive`` was unpacked) as ``archive/member`` in
    ``error``'s message, fix, location and problems, as Python names a zip's modules."""
    dirs = sorted({unpacked.rstrip(os.sep), os.path.realpath(unpacked)}, key=len, reverse=True)

    def renamed(text: str) -> str:
        for folder in dirs:
            text = text.replace(folder + os.sep, archive.rstrip("/") + "/").replace(folder, archive)
        return text

    for name in ("message", "fix"):
        value = getattr(error, name, None)
        if isinstance(value, str):
            setattr(error, name, renamed(value))
    location = getattr(error, "location", None)
    if location is not None:
        error.location = (renamed(location[0]), *location[1:])  # type: ignore[attr-defined]
    locations = getattr(error, "locations", None)
    if isinstance(locations, list):
        error.locations = [(renamed(at[0]), *at[1:]) for at in locations]  # type: ignore[attr-defined]
    problems = getattr(error, "problems", None)
    if isinstance(problems, list):
        error.problems = [renamed(p) if isinstance(p, str) else p for p in problems]  # type: ignore[attr-defined]
