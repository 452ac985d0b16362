"""Writing a planned archive: a zip (``.mar``), a gzipped tar or a folder, never half of one.

The archiver copies every file to a temp folder and deflates all of it (and gzips a tgz at
level 9). Here files are read once, straight into the output, and each file gets the
compression it deserves (:func:`compression_for`): weights and other incompressible files are
stored, text is deflated. A zip sets that per entry. A ``.tar.gz`` is one gzip member whose
deflate level changes from file to file (:class:`_GzipStream`): text at level 6, weights at
level 0 (deflate's stored blocks, written at copy speed). Not several concatenated gzip members,
though that is valid gzip and Python and GNU tar read it: TorchServe 0.12's frontend reads a
``.tar.gz`` with commons-compress's ``GzipCompressorInputStream(in)``, which stops at the end
of the first member, and fails with "Truncated TAR archive" (or silently drops the files past
it). The manifest is written last, as the archiver does; the output is written to a hidden
sibling and renamed into place, so an interrupted build leaves no half archive.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import tarfile
import time
import uuid
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

from handlerkit._progress import Bar
from handlerkit.archive.rules import MANIFEST

__all__ = ["COMPRESSIONS", "FORMATS", "STORED_SUFFIXES", "check_options", "compression_for", "write"]

#: archive_format → what is written (``zip-store``: the archiver's uncompressed zip).
FORMATS = {"default": ".mar", "zip-store": ".mar", "tgz": ".tar.gz", "no-archive": ""}
#: ``auto``: weights and incompressible files stored, the rest deflated; ``deflate``: everything
#: (as the archiver); ``store``: nothing.
COMPRESSIONS = ("auto", "deflate", "store")
#: Stored, never deflated: weights (random-looking floats deflate by a few percent at ~30 MB/s)
#: and files that are compressed already.
STORED_SUFFIXES = (".pt", ".pth", ".pt2", ".bin", ".onnx", ".safetensors", ".ckpt", ".h5", ".so", ".engine",
                   ".plan", ".tflite", ".gguf", ".npz", ".zip", ".mar", ".gz", ".tgz", ".bz2", ".xz", ".zst",
                   ".whl", ".jpg", ".jpeg", ".png", ".webp", ".mp3", ".mp4")  # fmt: skip
_LEVEL = 6  # deflate level of what is deflated (zlib's default; 9 costs twice the time for ~1 % less)
_PROBE = 256 << 10  # bytes deflated to decide whether a large file is worth deflating
_CHUNK = 1 << 20


def check_options(archive_format: str, compression: str) -> None:
    """Raise ValueError for an unknown ``archive_format`` or ``compression``."""
    if archive_format not in FORMATS:
        raise ValueError(f"archive_format must be one of {sorted(FORMATS)}: got {archive_format!r}")
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be 'auto', 'deflate' or 'store': got {compression!r}")


def compression_for(path: Path, size: int, mode: str = "auto") -> int:
    """ZIP_STORED or ZIP_DEFLATED for one file.

    ``auto``: weights and compressed formats (:data:`STORED_SUFFIXES`) are stored; a file of 1
    MiB or more whose first 256 KiB deflate by less than 5 % is stored; the rest is deflated.
    ``store`` / ``deflate`` force one.
    """
    if mode == "store":
        return zipfile.ZIP_STORED
    if mode == "deflate":
        return zipfile.ZIP_DEFLATED
    if path.name.lower().endswith(STORED_SUFFIXES):
        return zipfile.ZIP_STORED
    if size >= 1 << 20:
        with open(path, "rb") as f:
            sample = f.read(_PROBE)
        if len(zlib.compress(sample, 1)) > 0.95 * len(sample):
            return zipfile.ZIP_STORED
    return zipfile.ZIP_DEFLATED


class _Counted:
    """A file read in chunks that advances a progress bar (in MiB)."""

    def __init__(self, f: BinaryIO, bar: Bar) -> None:
        self._f, self._bar, self._carry = f, bar, 0

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self._carry += len(data)
        if self._carry >= 1 << 20:
            self._bar.update(self._carry >> 20)
            self._carry &= (1 << 20) - 1
        return data


def write(
    files: Mapping[str, Path],
    manifest: dict[str, Any],
    output: Path,
    *,
    archive_format: str,
    compression: str,
    progress: bool | None,
) -> Path:
    """Write ``files`` (archive path -> file) and the manifest to ``output``, through a hidden
    sibling renamed into place."""
    staging = output.parent / f".{output.name}.{uuid.uuid4().hex[:8]}.partial"
    name = manifest["model"]["modelName"]
    total_mib = max(1, sum(path.stat().st_size for path in files.values()) >> 20)
    data = json.dumps(manifest, indent=2).encode("utf-8")
    try:
        with Bar(total_mib, f"archive {name} (MiB)", progress) as bar:
            if archive_format == "no-archive":
                _write_dir(files, data, staging, bar)
            elif archive_format == "tgz":
                _write_tgz(files, data, staging, name, output.name, compression, bar)
            else:
                _write_zip(files, data, staging, "store" if archive_format == "zip-store" else compression, bar)
        _replace(staging, output)
    except BaseException:
        if staging.is_dir():
            shutil.rmtree(staging, ignore_errors=True)
        elif staging.exists():
            staging.unlink()
        raise
    return output


def _replace(staging: Path, output: Path) -> None:
    if output.is_dir() and not output.is_symlink():
        old = output.parent / f".{output.name}.{uuid.uuid4().hex[:8]}.old"
        os.rename(output, old)
        os.rename(staging, output)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, output)


def _write_zip(files: Mapping[str, Path], manifest: bytes, staging: Path, compression: str, bar: Bar) -> None:
    with open(staging, "xb") as raw, zipfile.ZipFile(raw, "w") as zf:
        for rel, path in files.items():
            info = zipfile.ZipInfo.from_file(path, rel, strict_timestamps=False)
            info.compress_type = compression_for(path, info.file_size, compression)
            with open(path, "rb") as src, zf.open(info, "w") as dst:  # zip64 when large, by zipfile
                shutil.copyfileobj(_Counted(src, bar), dst, _CHUNK)
        zf.writestr(MANIFEST, manifest, compress_type=zipfile.ZIP_DEFLATED)


def _write_tgz(
    files: Mapping[str, Path], manifest: bytes, staging: Path, top: str, name: str, compression: str, bar: Bar
) -> None:
    mtime = int(time.time())
    with open(staging, "xb") as raw:
        gz = _GzipStream(raw, name.removesuffix(".gz"), mtime)  # names <name>.tar, as tarfile's header would
        with tarfile.TarFile(fileobj=gz, mode="w", copybufsize=_CHUNK, dereference=True) as tf:  # type: ignore[arg-type]
            for rel, path in files.items():
                info = tf.gettarinfo(str(path), arcname=f"{top}/{rel}")
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                stored = compression_for(path, info.size, compression) == zipfile.ZIP_STORED
                gz.level(0 if stored else _LEVEL)  # the header and the data at the file's level
                with open(path, "rb") as src:
                    tf.addfile(info, _Counted(src, bar))
            info = tarfile.TarInfo(f"{top}/{MANIFEST}")
            info.size, info.mtime, info.mode = len(manifest), mtime, 0o644
            gz.level(0 if compression == "store" else _LEVEL)
            tf.addfile(info, io.BytesIO(manifest))
        gz.close()


class _GzipStream:
    """One gzip member (RFC 1952) whose deflate level can change between writes.

    Each stretch at one level is raw deflate from a fresh compressor, ended with a sync flush
    (an empty stored block: byte-aligned, not final), so the stretches join into one valid
    deflate stream, as pigz joins blocks compressed apart; the last stretch is finished, and
    the trailer's CRC-32 and size cover everything written. A stretch never refers back into
    the one before, which costs a few bytes per change of level.
    """

    def __init__(self, raw: BinaryIO, name: str, mtime: int) -> None:
        self._raw = raw
        flags = 0x08  # FNAME
        raw.write(b"\x1f\x8b\x08" + bytes([flags]) + struct.pack("<I", mtime) + b"\x00\xff")
        raw.write(name.encode("latin-1", "replace") + b"\x00")
        self._crc = 0
        self._size = 0
        self._level: int | None = None
        self._deflate: Any = None
        self.level(_LEVEL)

    def level(self, level: int) -> None:
        """Deflate what is written next at ``level`` (0: stored blocks)."""
        if level == self._level:
            return
        if self._deflate is not None:
            self._raw.write(self._deflate.flush(zlib.Z_SYNC_FLUSH))
        self._deflate = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
        self._level = level

    def write(self, data: bytes) -> int:
        self._crc = zlib.crc32(data, self._crc)
        self._size += len(data)
        self._raw.write(self._deflate.compress(data))
        return len(data)

    def tell(self) -> int:
        return self._size

    def close(self) -> None:
        self._raw.write(self._deflate.flush(zlib.Z_FINISH))
        self._raw.write(struct.pack("<II", self._crc, self._size & 0xFFFFFFFF))


def _write_dir(files: Mapping[str, Path], manifest: bytes, staging: Path, bar: Bar) -> None:
    os.mkdir(staging)
    for rel, path in files.items():
        dest = staging.joinpath(*rel.split("/"))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
        shutil.copymode(path, dest)
        bar.update(path.stat().st_size >> 20)
    (staging / "MAR-INF").mkdir()
    (staging / MANIFEST).write_bytes(manifest)
