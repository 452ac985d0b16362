"""What an archive or a model dir holds, read without extracting: files, sizes, manifest, problems.

:func:`inspect_archive` collects the problems :func:`~handlerkit.archive.open_mar` would
refuse on instead of raising them; :class:`ArchiveInfo` renders itself as tables (``print``,
Jupyter) and as plain data (``to_dict``, for ``handlerkit inspect --json``).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from handlerkit._render import Rendered, Table
from handlerkit._text import format_bytes
from handlerkit.archive.read import list_archive
from handlerkit.archive.rules import MANIFEST, ArchiveError, Limits, Listing

__all__ = ["ArchiveInfo", "FileInfo", "inspect_archive"]


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
            "problems": [
                {"rule": p.rule, "member": p.member, "message": p.message, "fix": p.fix} for p in self.problems
            ],
        }

    def _summary(self) -> str:
        model = (self.manifest or {}).get("model", {})
        what = {"zip": ".mar (zip)", "tgz": "tar.gz", "dir": "model dir"}[self.format]
        text = f"{self.path.name}: {what}, {len(self.files)} files, {format_bytes(self.total_size)}" + (
            f" ({format_bytes(self.archive_size)} archived)" if self.format != "dir" else ""
        )
        if model:
            text += f", model {model.get('modelName')!r} handler {model.get('handler')!r}"
        if self.problems:
            text += f", {len(self.problems)} problem{'s' * (len(self.problems) > 1)}"
        return text

    def _tables(self) -> list[Table]:
        tables = []
        rows: list[tuple[Any, ...]]
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
    from handlerkit.worker.modeldir import infer_manifest
    from handlerkit.worker.modeldir import read_manifest as read_json

    files = []
    for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            full = Path(root, name)
            files.append(FileInfo(full.relative_to(path).as_posix(), full.stat().st_size))
    manifest_path = path / MANIFEST
    inferred: dict[str, str]
    if manifest_path.is_file():
        manifest, inferred = read_json(manifest_path), {}
    else:
        manifest, inferred = infer_manifest(path)
    return ArchiveInfo(path, "dir", files, manifest, [], inferred, sum(f.size for f in files))
