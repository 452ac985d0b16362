"""Extracting a checked archive: all of it into a new folder, or nothing.

Everything is written into a hidden sibling of the target (``.<target>.partial-…``), renamed
onto the target at the end and removed on any failure, so a corrupt entry found halfway (a bad
CRC, data longer than declared) leaves nothing behind. Files are created with ``open(..., "xb")``
(never through an existing file or link), under paths checked again against the root.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import uuid
import zipfile
import zlib
from pathlib import Path
from typing import Any

from handlerkit._archive_rules import REBUILD, ArchiveError, Entry, Listing
from handlerkit._text import format_bytes

__all__ = ["extract"]

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
    wanted = {e.name: e for e in listing.entries if e.path}
    with zipfile.ZipFile(listing.path) as zf:
        for info in zf.infolist():
            entry = wanted.get(info.orig_filename)
            if entry is None:
                continue
            dest = _destination(root, entry.path)
            if entry.kind == "dir":
                dest.mkdir(parents=True, exist_ok=True)
                continue
            with zf.open(info) as source:
                _write(source, dest, entry, listing)


def _extract_tgz(listing: Listing, root: Path) -> None:
    wanted = {e.name: e for e in listing.entries if e.path}
    with tarfile.open(listing.path, "r:gz") as tf:
        while (member := tf.next()) is not None:
            entry = wanted.get(member.name)
            if entry is None:
                continue
            dest = _destination(root, entry.path)
            if entry.kind == "dir":
                dest.mkdir(parents=True, exist_ok=True)
                continue
            source = tf.extractfile(member)
            if source is not None:
                _write(source, dest, entry, listing)
