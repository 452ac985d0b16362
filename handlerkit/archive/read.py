"""Reading a model archive without writing anything: sniffing, listing, checking, the manifest.

A ``.mar`` is a zip (``torch-model-archiver --archive-format default``); ``--archive-format
tgz`` writes a gzipped tar whose files sit under one ``<model name>/`` folder. Whoever built
the archive, :func:`list_archive` reads only its directory (the zip's central directory and
each entry's local header; the tar's headers) and the manifest, and collects every broken rule
(:data:`~handlerkit.archive.rules.RULES`), so that :func:`handlerkit.archive.extract.extract`
refuses before writing a byte. Zip-bomb limits (:class:`~handlerkit.archive.rules.Limits`)
are checked on the sizes the archive declares.
"""

from __future__ import annotations

import itertools
import os
import stat
import struct
import tarfile
import zipfile
import zlib
from pathlib import Path
from typing import Any

from handlerkit._text import format_bytes
from handlerkit.archive.rules import (
    MANIFEST,
    REBUILD,
    RULES,
    ArchiveError,
    Entry,
    Limits,
    Listing,
    manifest_problems,
    name_problem,
    normalise,
    parse_manifest,
)

__all__ = ["SUFFIXES", "is_archive", "list_archive", "read_manifest", "read_manifest_entry", "sniff", "stem"]

#: The names an archive file goes by.
SUFFIXES = (".mar", ".tar.gz", ".tgz", ".zip")


# ------------------------------------------------------------------------------------ sniffing
def sniff(path: str | os.PathLike[str]) -> str | None:
    """``"zip"``, ``"tgz"`` or None, from the file's first bytes."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return None
    if head[:2] == b"PK":
        return "zip"
    if head[:2] == b"\x1f\x8b":
        return "tgz"
    return None


def is_archive(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a file to open as an archive: by its name or its first bytes."""
    p = Path(path)
    return p.is_file() and (p.name.lower().endswith(SUFFIXES) or sniff(p) is not None)


def stem(path: Path) -> str:
    """The archive's name without its suffix: ``shapes.tar.gz`` -> ``shapes``."""
    name = path.name
    for suffix in SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def _problem(listing: Listing, rule: str, message: str, member: str | None = None, fix: str | None = None) -> None:
    listing.problems.append(ArchiveError(message, listing.path, rule=rule, member=member, fix=fix))


def list_archive(path: str | os.PathLike[str], limits: Limits | None = None) -> Listing:
    """Read an archive's directory and manifest and collect every broken rule; writes nothing.

    Raises:
        ArchiveError: the file is missing, not an archive, or unreadable (truncated); every
            other problem is collected in ``Listing.problems``.
    """
    limits = limits or Limits()
    path = Path(path)
    if not path.is_file():
        what = "is a directory, not an archive file" if path.is_dir() else "does not exist"
        raise ArchiveError(f"{os.fspath(path)!r} {what}", path, rule="not-an-archive",
                           fix="pass a .mar (or .tar.gz) file; a model dir is used as it is")  # fmt: skip
    kind = sniff(path)
    if kind is None:
        raise ArchiveError(
            f"{path.name} is not a model archive: {RULES['not-an-archive']}",
            path,
            rule="not-an-archive",
            fix="build one with handlerkit.archive.build or torch-model-archiver",
        )
    listing = _list_zip(path, limits) if kind == "zip" else _list_tgz(path, limits)
    _check_paths(listing)
    _check_sizes(listing, limits)
    _check_manifest(listing, limits)
    return listing


# ------------------------------------------------------------------------------------ zip
_COMPRESSION = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated", zipfile.ZIP_BZIP2: "bzip2",
                zipfile.ZIP_LZMA: "lzma"}  # fmt: skip


def _open_zip(path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        with open(path, "rb") as f:
            starts_like_zip = f.read(4) in (b"PK\x03\x04", b"PK\x05\x06")
        rule = "truncated" if starts_like_zip else "not-an-archive"
        why = RULES[rule]
        if starts_like_zip:
            why = "it starts like a zip but its directory is missing or damaged (truncated?)"
        raise ArchiveError(f"{path.name} cannot be read: {why} ({exc})", path, rule=rule,
                           fix=f"download or copy it again, or {REBUILD}") from exc  # fmt: skip


def _zip_kind(info: zipfile.ZipInfo) -> str:
    mode = info.external_attr >> 16
    if mode:  # unix permissions and type, whatever create_system says (unzip trusts them)
        if stat.S_ISLNK(mode):
            return "symlink"
        if stat.S_ISDIR(mode):
            return "dir"
        if not stat.S_ISREG(mode) and stat.S_IFMT(mode):
            return "special"
    return "dir" if info.filename.endswith("/") else "file"


def _list_zip(path: Path, limits: Limits) -> Listing:
    with _open_zip(path) as zf:
        infos = zf.infolist()
        listing = Listing(path, "zip", [], path.stat().st_size)
        for info in infos:
            listing.entries.append(Entry(info.orig_filename, "", _zip_kind(info), info.file_size, info.compress_size,
                                         _COMPRESSION.get(info.compress_type, f"method {info.compress_type}")))  # fmt: skip
            if info.flag_bits & 0x1:
                _problem(listing, "encrypted", f"{info.orig_filename!r} is encrypted", info.orig_filename,
                         fix=f"TorchServe cannot read encrypted entries: {REBUILD}")  # fmt: skip
            if info.compress_type == zipfile.ZIP_STORED and info.compress_size != info.file_size:
                _problem(listing, "corrupt", f"{info.orig_filename!r} is stored but declares {info.compress_size} bytes "
                         f"stored for {info.file_size}", info.orig_filename, fix=REBUILD)  # fmt: skip
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                _problem(listing, "compression", f"{info.orig_filename!r} uses {listing.entries[-1].compression}: "
                         f"{RULES['compression']}", info.orig_filename, fix=REBUILD)  # fmt: skip
        if len(infos) <= limits.max_entries:
            _check_local_headers(listing, zf, infos)
    return listing


_LOCAL = struct.Struct("<4s2B4HL2L2H")


def _check_local_headers(listing: Listing, zf: zipfile.ZipFile, infos: list[zipfile.ZipInfo]) -> None:
    """Each entry's local header exists, names the same entry, and its data ends before the
    next entry starts: streaming readers (TorchServe's ZipInputStream) read these headers, and
    entries sharing data are the 'better zip bomb'."""
    spans: list[tuple[int, int, str]] = []
    end_of_data = zf.start_dir
    fp = zf.fp
    if fp is None:  # a closed ZipFile: nothing to check against
        return
    for info in infos:
        name = info.orig_filename
        fp.seek(info.header_offset)
        head = fp.read(_LOCAL.size)
        if len(head) < _LOCAL.size or head[:4] != b"PK\x03\x04":
            _problem(listing, "truncated", f"{name!r} has no local header where the directory says "
                     f"(offset {info.header_offset})", name, fix=f"download or copy it again, or {REBUILD}")  # fmt: skip
            continue
        fields = _LOCAL.unpack(head)
        name_len, extra_len = fields[10], fields[11]
        raw = fp.read(name_len)
        local = raw.decode("utf-8" if fields[3] & 0x800 else "cp437", errors="replace")
        if local != name:
            _problem(listing, "corrupt", f"{name!r} is named {local!r} in its local header: tools reading the "
                     "two would write different files", name, fix=REBUILD)  # fmt: skip
        start = info.header_offset + _LOCAL.size + name_len + extra_len
        end = start + info.compress_size
        if end > end_of_data:
            _problem(listing, "truncated", f"{name!r} declares {format_bytes(info.compress_size)} of data past the "
                     "end of the archive's data", name, fix=f"download or copy it again, or {REBUILD}")  # fmt: skip
        spans.append((info.header_offset, end, name))
    spans.sort()
    for (_, end, name), (start, _, following) in itertools.pairwise(spans):
        if start < end:
            _problem(listing, "zip-bomb", f"{following!r} starts inside the data of {name!r}: entries sharing "
                     "their data make an archive expand far beyond its size", following, fix=REBUILD)  # fmt: skip


# ------------------------------------------------------------------------------------ tar.gz
def _tar_kind(member: tarfile.TarInfo) -> str:
    if member.isreg():
        return "file"
    if member.isdir():
        return "dir"
    if member.issym():
        return "symlink"
    if member.islnk():
        return "hardlink"
    return "special"


def _list_tgz(path: Path, limits: Limits) -> Listing:
    listing = Listing(path, "tgz", [], path.stat().st_size)
    total = 0
    try:
        with tarfile.open(path, "r:gz") as tf:
            while (member := tf.next()) is not None:
                listing.entries.append(Entry(member.name, "", _tar_kind(member), member.size, None, "gzip"))
                if (
                    member.isreg()
                    and normalise(member.name).endswith(MANIFEST)
                    and member.size <= limits.max_manifest_size
                ):
                    # Kept now: reading it later would decompress the whole archive again.
                    listing.small[member.name] = tf.extractfile(member).read()  # type: ignore[union-attr]
                total += member.size if member.isreg() else 0
                # Moving on to the next header decompresses this member's data: stop at the limits.
                if (
                    len(listing.entries) > limits.max_entries
                    or total > limits.max_total_size
                    or (total > limits.ratio_floor and total > limits.max_ratio * listing.archive_size)
                ):
                    break
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise ArchiveError(f"{path.name} cannot be read as a gzipped tar: it ends early or is damaged ({exc})",
                           path, rule="truncated", fix=f"download or copy it again, or {REBUILD}") from exc  # fmt: skip
    return listing


def _tgz_prefix(names: list[str]) -> str:
    """The one top folder every entry of a tar.gz sits under, when it holds the manifest."""
    tops = {n.split("/", 1)[0] for n in names}
    if len(tops) == 1:
        top = next(iter(tops))
        if f"{top}/{MANIFEST}" in names:
            return f"{top}/"
    return ""


# ------------------------------------------------------------------------------------ checks
def _check_paths(listing: Listing) -> None:
    normalised = [normalise(e.name) for e in listing.entries]
    if listing.format == "tgz":
        listing.prefix = _tgz_prefix(normalised)
    seen: dict[str, str] = {}
    files: set[str] = set()
    dirs: set[str] = set()
    for i, entry in enumerate(listing.entries):
        name = entry.name
        problem = name_problem(name)
        if problem is not None:
            rule, why = problem
            _problem(listing, rule, f"{name!r}: {why}", name, fix=f"refused; {REBUILD} from trusted files")
            continue
        if entry.kind in ("symlink", "hardlink", "special"):
            rule = "special-file" if entry.kind == "special" else "symlink"
            what = {"symlink": "a symbolic link", "hardlink": "a hard link", "special": "not a regular file"}[
                entry.kind
            ]
            _problem(listing, rule, f"{name!r} is {what}: it could point outside the target", name,
                     fix=f"archive the file itself, not a link to it: {REBUILD}")  # fmt: skip
            continue
        rel = normalised[i]
        if listing.prefix:
            rel = rel[len(listing.prefix) :] if rel.startswith(listing.prefix) else ""
            if not rel:
                continue  # the top folder itself
        key = rel.casefold()
        if key in seen:
            _problem(listing, "duplicate", f"{name!r} lands on the same path as {seen[key]!r}", name,
                     fix="keep one entry per path (case-insensitively: macOS and Windows merge them)")  # fmt: skip
            continue
        seen[key] = name
        listing.entries[i] = Entry(entry.name, rel, entry.kind, entry.size, entry.compressed_size, entry.compression)
        (dirs if entry.kind == "dir" else files).add(key)
    parts = [key.split("/") for key in files | dirs]
    folders = {"/".join(p[:k]) for p in parts for k in range(1, len(p))}
    for key in sorted(files & folders):
        _problem(listing, "duplicate", f"{seen[key]!r} is both a file and a folder of other entries", seen[key],
                 fix="rename the file or the folder")  # fmt: skip


def _check_sizes(listing: Listing, limits: Limits) -> None:
    fix = "if you trust this archive, pass limits=handlerkit.archive.Limits(...) with higher limits"
    if len(listing.entries) > limits.max_entries:
        _problem(listing, "zip-bomb", f"{len(listing.entries)} entries or more, over the limit of "
                 f"{limits.max_entries}", fix=fix)  # fmt: skip
    total = listing.total_size
    if total > limits.max_total_size:
        _problem(listing, "zip-bomb", f"it declares {format_bytes(total)} uncompressed, over the limit of "
                 f"{format_bytes(limits.max_total_size)}", fix=fix)  # fmt: skip
    if listing.format == "tgz":
        if total > limits.ratio_floor and total > limits.max_ratio * listing.archive_size:
            _problem(listing, "zip-bomb", f"{format_bytes(listing.archive_size)} of tar.gz expands to "
                     f"{format_bytes(total)} or more, over {limits.max_ratio:g}x", fix=fix)  # fmt: skip
        return
    for entry in listing.entries:
        ratio = entry.size / max(entry.compressed_size or 0, 1)
        if entry.size > limits.ratio_floor and ratio > limits.max_ratio:
            _problem(listing, "zip-bomb", f"{entry.name!r} expands {format_bytes(entry.compressed_size)} to "
                     f"{format_bytes(entry.size)} ({ratio:.0f}x, over {limits.max_ratio:g}x)", entry.name,
                     fix=fix)  # fmt: skip


def _check_manifest(listing: Listing, limits: Limits) -> None:
    by_path = {e.path: e for e in listing.entries if e.path}
    entry = by_path.get(MANIFEST)
    if entry is None or entry.kind != "file":
        _problem(listing, "manifest-missing", f"there is no {MANIFEST}: TorchServe cannot load the archive",
                 MANIFEST, fix=f"{REBUILD}; an archive without a manifest is not a model archive")  # fmt: skip
        return
    if entry.size > limits.max_manifest_size:
        _problem(listing, "manifest-malformed", f"{MANIFEST} declares {format_bytes(entry.size)}, over the limit of "
                 f"{format_bytes(limits.max_manifest_size)}", MANIFEST, fix=REBUILD)  # fmt: skip
        return
    try:
        data = _read_member(listing, entry, limit=limits.max_manifest_size)
        listing.manifest = parse_manifest(data, f"{listing.path.name}:{MANIFEST}", listing.path)
    except ArchiveError as exc:
        listing.problems.append(exc)
        return
    files = {e.path.casefold() for e in listing.entries if e.path and e.kind == "file"}
    for rule, message, member in manifest_problems(listing.manifest, files):
        _problem(listing, rule, message, member, fix=f"{REBUILD}, or correct {MANIFEST}")


def _read_member(listing: Listing, entry: Entry, limit: int) -> bytes:
    """One small entry's bytes (the manifest), read without writing anything."""
    try:
        if listing.format == "zip":
            with zipfile.ZipFile(listing.path) as zf:
                info = next(i for i in zf.infolist() if i.orig_filename == entry.name)  # the first, if duplicated
                with zf.open(info) as f:
                    data = f.read(limit + 1)
        else:
            data = listing.small[entry.name]
    except (zipfile.BadZipFile, EOFError, OSError, zlib.error, KeyError, StopIteration) as exc:
        raise ArchiveError(f"{entry.name} cannot be read ({exc})", listing.path, rule="corrupt", member=entry.name,
                           fix=f"download or copy it again, or {REBUILD}") from exc  # fmt: skip
    if len(data) > limit:
        raise ArchiveError(f"{entry.name} is larger than {format_bytes(limit)}", listing.path,
                           rule="manifest-malformed", member=entry.name, fix=REBUILD)  # fmt: skip
    return data


def read_manifest_entry(listing: Listing) -> dict[str, Any]:
    """The manifest of a listed archive, or the problem that stands in for it."""
    if listing.manifest is not None:
        return listing.manifest
    for problem in listing.problems:
        if problem.rule.startswith("manifest") and problem.member == MANIFEST:
            raise problem
    raise ArchiveError(f"{listing.path.name} holds no {MANIFEST}", listing.path, rule="manifest-missing",
                       member=MANIFEST, fix=REBUILD)  # fmt: skip


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a ``.mar``, a ``.tar.gz`` (without extracting) or a model dir.

    For a model dir without ``MAR-INF/MANIFEST.json``, the manifest handlerkit infers from its
    files (:func:`handlerkit.worker.modeldir.infer_manifest`).

    Raises:
        ArchiveError: not an archive, unreadable, or no (valid) manifest.
    """
    p = Path(path).expanduser()
    if p.is_dir():
        from handlerkit.worker.modeldir import infer_manifest
        from handlerkit.worker.modeldir import read_manifest as read_json

        return read_json(p / MANIFEST) if (p / MANIFEST).is_file() else infer_manifest(p)[0]
    return read_manifest_entry(list_archive(p))
