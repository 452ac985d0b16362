"""The rules a model archive must keep, the error that names the one broken, and the manifest.

Also the files no archive sweeps in (:data:`NEVER_SWEPT`): hidden files and names that look
like secrets.

Shared by reading (:mod:`handlerkit.archive.read`), extracting
(:mod:`handlerkit.archive.extract`) and building (:mod:`handlerkit.archive.pack`); the public
names are re-exported by :mod:`handlerkit.archive`.
"""

from __future__ import annotations

import fnmatch
import json
import os
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from handlerkit.errors import ModelLoadError

__all__ = [
    "MANIFEST",
    "NEVER_SWEPT",
    "RULES",
    "ArchiveError",
    "Entry",
    "Limits",
    "Listing",
    "handler_file",
    "manifest_problems",
    "name_problem",
    "normalise",
    "parse_manifest",
    "secret_looking",
]  # fmt: skip

MANIFEST = "MAR-INF/MANIFEST.json"
REBUILD = "rebuild it with handlerkit.archive.build (or torch-model-archiver 0.12)"

#: Every rule an archive can break, with what it means.
RULES: dict[str, str] = {
    "not-an-archive": "the file is not a zip (.mar) nor a gzipped tar (.tar.gz)",
    "truncated": "the archive ends early or its directory is damaged",
    "corrupt": "an entry's data or headers disagree with the archive's directory",
    "zip-slip": "an entry's path climbs out of the target with '..'",
    "absolute-path": "an entry's path is absolute",
    "unsafe-name": "an entry's name holds a backslash, a NUL or nothing",
    "symlink": "an entry is a symbolic or hard link",
    "special-file": "an entry is a device, a FIFO or a socket",
    "duplicate": "two entries land on the same path (or one is both a file and a folder)",
    "encrypted": "an entry is encrypted",
    "compression": "an entry uses a compression TorchServe cannot read (only stored and deflated)",
    "zip-bomb": "declared sizes over the limits, or entries sharing their data",
    "disk-space": "the declared size does not fit on the target's disk",
    "manifest-missing": f"there is no {MANIFEST}",
    "manifest-malformed": f"{MANIFEST} is not what TorchServe 0.12 loads",
    "manifest-file-missing": "the manifest names a file the archive does not hold",
}

#: Files a folder, a glob or a model dir never sweeps into an archive (pattern -> why),
#: matched on the file's name, case-insensitively. torch-model-archiver packs
#: them all from an ``--extra-files`` folder; building refuses instead (rule ``secret-file``)
#: or, for a model dir, leaves them out and names them. A file named explicitly is packed;
#: ``.git`` never is.
NEVER_SWEPT: dict[str, str] = {
    ".env": "looks like environment secrets",
    ".env.*": "looks like environment secrets",
    ".netrc": "looks like login credentials",
    ".npmrc": "looks like a registry token",
    ".pypirc": "looks like a package index token",
    ".git*": "belongs to version control",
    "*.pem": "looks like a private key or certificate",
    "*.key": "looks like a private key",
    "id_rsa*": "looks like an SSH key",
    "id_dsa*": "looks like an SSH key",
    "id_ecdsa*": "looks like an SSH key",
    "id_ed25519*": "looks like an SSH key",
    "*.p12": "looks like a key store",
    "*.pfx": "looks like a key store",
    "credentials*": "looks like credentials",
    ".*": "is a hidden file",
}


def secret_looking(name: str) -> str | None:
    """Why a file name is never swept in (``"looks like a private key (*.key)"``), or None."""
    lowered = name.lower()
    for pattern, what in NEVER_SWEPT.items():
        if fnmatch.fnmatchcase(lowered, pattern):
            return f"{what} ({pattern})"
    return None


# What TorchServe 0.12's frontend (ModelArchive.validate) refuses to load without.
_REQUIRED = ("modelName", "modelVersion")
_REQUIRED_TOP = ("runtime", "archiverVersion", "createdOn")
_FILE_KEYS = ("serializedFile", "modelFile", "requirementsFile", "configFile")


class ArchiveError(ModelLoadError):
    """An archive refused (or one that cannot be built), with the rule it breaks.

    Attributes:
        path: the archive (or the file at fault when building).
        rule: a key of :data:`RULES` (building adds ``exists``, ``missing-file``,
            ``no-handler``, ``model-name``, ``name-collision`` and ``secret-file``: a folder,
            a glob or an unpacked ``.mar`` would sweep in a file of :data:`NEVER_SWEPT`).
        member: the entry at fault, when there is one.
        problems: every problem found (this one first); opening reports them together.
    """

    def __init__(
        self,
        message: str,
        path: str | os.PathLike[str] | None = None,
        *,
        rule: str,
        member: str | None = None,
        fix: str | None = None,
        problems: list[ArchiveError] | None = None,
    ) -> None:
        super().__init__(message, os.fspath(path) if path is not None else None, fix=fix)
        self.rule = rule
        self.member = member
        self.problems: list[ArchiveError] = list(problems) if problems else [self]

    def __reduce__(self) -> Any:  # keyword-only arguments: pickle and copy rebuild it this way
        return (_rebuild, (self.message, self.__dict__.copy()))


def _rebuild(message: str, state: dict[str, Any]) -> ArchiveError:
    error = ArchiveError(message, rule=state.get("rule", ""))
    error.__dict__.update(state)
    return error


@dataclass(frozen=True)
class Limits:
    """Zip-bomb limits, checked on the sizes an archive declares before anything is written.

    The defaults admit any model TorchServe users archive (tens of GB of weights, vocabularies
    that deflate 10x) and refuse the classic bombs (deflate peaks near 1032:1; overlapping
    entries). Pass your own to :func:`handlerkit.archive.open_mar` to loosen or tighten them.

    Attributes:
        max_total_size: the sum of the entries' uncompressed sizes.
        max_ratio: uncompressed / compressed, for any entry larger than ``ratio_floor`` (for a
            tar.gz, the whole archive's).
        ratio_floor: entries (archives) smaller than this are not ratio-checked.
        max_entries: how many entries.
        max_manifest_size: the size of ``MAR-INF/MANIFEST.json`` (read into memory).
    """

    max_total_size: int = 64 << 30
    max_ratio: float = 200.0
    ratio_floor: int = 1 << 20
    max_entries: int = 100_000
    max_manifest_size: int = 1 << 20


@dataclass(frozen=True)
class Entry:
    """One entry of an archive: its stored name, where it lands, its kind and sizes."""

    name: str
    path: str  # the normalised relative path in the model dir ("" when it is refused)
    kind: str  # file, dir, symlink, hardlink, special
    size: int
    compressed_size: int | None  # None in a tar.gz (one gzip stream for all)
    compression: str  # stored, deflated, bzip2, lzma, gzip, ...


@dataclass
class Listing:
    """What :func:`list_archive` found: the entries, the manifest, every problem."""

    path: Path
    format: str  # "zip" or "tgz"
    entries: list[Entry]
    archive_size: int
    prefix: str = ""  # the tar.gz's top folder ("<name>/"), stripped on extraction
    manifest: dict[str, Any] | None = None
    problems: list[ArchiveError] = field(default_factory=list)
    small: dict[str, bytes] = field(default_factory=dict)  # a tar.gz's manifest bytes, read while listing

    @property
    def total_size(self) -> int:
        return sum(e.size for e in self.entries)

    def raise_problems(self) -> None:
        """Raise the first problem, carrying all of them, when there is any."""
        if not self.problems:
            return
        first = self.problems[0]
        more = len(self.problems) - 1
        message = f"{self.path.name} refused [{first.rule}]: {first.message}"
        message += f" (and {more} more problem{'s' * (more > 1)}: see .problems)" if more else ""
        raise ArchiveError(
            message, first.path, rule=first.rule, member=first.member, fix=first.fix, problems=self.problems
        )


# ------------------------------------------------------------------------------------ names
_DRIVE = re.compile(r"^[A-Za-z]:")


def name_problem(name: str) -> tuple[str, str] | None:
    """(rule, why) when an entry name is unsafe to extract, else None."""
    if not name.strip("/") or "\x00" in name:
        return "unsafe-name", "an empty name or one holding a NUL byte"
    if name.startswith(("/", "\\")) or _DRIVE.match(name):
        return "absolute-path", "an absolute path"
    if ".." in re.split(r"[/\\]", name):
        return "zip-slip", "a '..' path component would write outside the target"
    if "\\" in name:
        return "unsafe-name", "a backslash, a folder separator on Windows"
    return None


def normalise(name: str) -> str:
    return "/".join(part for part in name.split("/") if part not in ("", "."))


def parse_manifest(data: bytes, where: str, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """A manifest from its bytes: a JSON object with a ``"model"`` object.

    Raises:
        ArchiveError: (``manifest-malformed``) anything else.
    """
    fix = f"{REBUILD}, or correct {MANIFEST}"
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArchiveError(f"{where} is not valid JSON ({exc})", path, rule="manifest-malformed", member=MANIFEST,
                           fix=fix) from exc  # fmt: skip
    if not isinstance(manifest, dict) or not isinstance(manifest.get("model"), dict):
        raise ArchiveError(f'{where} must be a JSON object with a "model" object, as torch-model-archiver writes',
                           path, rule="manifest-malformed", member=MANIFEST, fix=fix)  # fmt: skip
    return manifest


def handler_file(handler: Any) -> str | None:
    """The file a manifest's ``handler`` names for sure: ``x.py`` of ``x.py`` or ``x.py:fn``.

    TorchServe imports the module by its base name from the model dir's root.
    """
    if not isinstance(handler, str):
        return None
    module = handler.split(":", 1)[0]
    return posixpath.basename(module) if module.endswith(".py") else None


def manifest_problems(manifest: dict[str, Any], files: set[str]) -> list[tuple[str, str, str | None]]:
    """(rule, message, member) for what TorchServe 0.12 would refuse, and for named files absent."""
    model = manifest["model"]
    out: list[tuple[str, str, str | None]] = []
    missing = [k for k in _REQUIRED_TOP if not manifest.get(k)] + [f"model.{k}" for k in _REQUIRED if not model.get(k)]
    if missing:
        out.append(("manifest-malformed", f"{MANIFEST} lacks {', '.join(missing)}: TorchServe 0.12 refuses to load "
                    "it (e.g. 'Model version is not defined.')", MANIFEST))  # fmt: skip
    named = [(k, model.get(k)) for k in _FILE_KEYS if model.get(k) is not None]
    if handler_file(model.get("handler")):
        named.append(("handler", handler_file(model["handler"])))
    for key, value in named:
        if not isinstance(value, str) or name_problem(value) is not None:
            message = f"{MANIFEST} names {key} {value!r}: not a relative path in the archive"
            out.append(("manifest-malformed", message, MANIFEST))
        elif normalise(value).casefold() not in files:
            message = f"{MANIFEST} names {key} {value!r} but the archive holds no such file"
            out.append(("manifest-file-missing", message, value))
    return out
