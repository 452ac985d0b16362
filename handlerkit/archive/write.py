"""Writing a planned archive: a zip (``.mar``), a gzipped tar or a folder, never half of one.

The archiver copies every file to a temp folder and deflates all of it (and gzips a tgz at
level 9). Here files are read once, straight into the output; weights and other incompressible
files are stored, not deflated (:func:`compression_for`; a tgz mostly of such files is gzipped
at level 0, deflate's stored blocks); the manifest is written last, as the archiver does; the
output is written to a hidden sibling and renamed into place, so an interrupted build leaves
no half archive.
"""

from __future__ import annotations

import datetime
import gzip
import io
import json
import os
import shutil
import tarfile
import uuid
import zipfile
import zlib
from pathlib import Path
from collections.abc import Mapping
from typing import Any, BinaryIO

from handlerkit._progress import Bar
from handlerkit.archive.rules import MANIFEST

__all__ = ["FORMATS", "STORED_SUFFIXES", "compression_for", "write"]

#: archive_format → what is written (``zip-store``: the archiver's uncompressed zip).
FORMATS = {"default": ".mar", "zip-store": ".mar", "tgz": ".tar.gz", "no-archive": ""}
#: Stored, never deflated: weights (random-looking floats deflate by a few percent at ~30 MB/s)
#: and files that are compressed already.
STORED_SUFFIXES = (".pt", ".pth", ".pt2", ".bin", ".onnx", ".safetensors", ".ckpt", ".h5", ".so", ".engine",
                   ".plan", ".tflite", ".gguf", ".npz", ".zip", ".mar", ".gz", ".tgz", ".bz2", ".xz", ".zst",
                   ".whl", ".jpg", ".jpeg", ".png", ".webp", ".mp3", ".mp4")  # fmt: skip
_PROBE = 256 << 10  # bytes deflated to decide whether a large file is worth deflating
_CHUNK = 1 << 20


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
    # One gzip stream for all, so one level: 0 (deflate's stored blocks, still a valid gzip)
    # when most bytes are weights or incompressible, as the zip stores them (500 MB of float32
    # gzip at ~45 MB/s at any level here and shrink by ~7 %), else 6.
    sizes = {path: path.stat().st_size for path in files.values()}
    stored = sum(size for path, size in sizes.items() if compression_for(path, size, compression) == zipfile.ZIP_STORED)
    level = 0 if stored * 2 > sum(sizes.values()) else 6
    with (
        open(staging, "xb") as raw,
        gzip.GzipFile(name, "wb", level, raw) as gz,  # the gzip header names <name>.tar, as tarfile's would
        tarfile.open(fileobj=gz, mode="w", copybufsize=_CHUNK) as tf,
    ):
        for rel, path in files.items():
            info = tf.gettarinfo(str(path), arcname=f"{top}/{rel}")
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(path, "rb") as src:
                tf.addfile(info, _Counted(src, bar))
        info = tarfile.TarInfo(f"{top}/{MANIFEST}")
        info.size, info.mtime, info.mode = len(manifest), int(datetime.datetime.now().timestamp()), 0o644
        tf.addfile(info, io.BytesIO(manifest))


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
