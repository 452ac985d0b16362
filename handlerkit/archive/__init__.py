"""Model archives (``.mar``): build them as ``torch-model-archiver`` 0.12 does, open them safely.

Build from a model dir (its manifest, or the one handlerkit infers, gives the defaults) or
from files one by one, in the archiver's three forms::

    from handlerkit import archive
    mar = archive.build("fixtures/models/image_classifier", "model_store")   # model_store/image_classifier.mar
    archive.build(None, "store", model_name="shapes", handler="handler.py", serialized_file="model.pt",
                  model_file="model.py", extra_files=["index_to_name.json"], archive_format="tgz")

The manifest is the archiver's, key for key (:mod:`~handlerkit.archive.pack`); weights are
stored rather than deflated, which makes building a 500 MB archive several times faster
(:mod:`~handlerkit.archive.write`, ``benchmarks/archive_vs_model_archiver.py``).

Open any archive, whoever built it::

    model_dir = archive.open_mar("shapes.mar", "unpacked/shapes")   # or a temp dir
    archive.read_manifest("shapes.mar")                             # without extracting
    archive.inspect_archive("shapes.mar")                           # files, sizes, manifest

Before writing a byte, opening refuses archives that break a rule (:data:`RULES`,
:mod:`~handlerkit.archive.rules`): paths escaping the target (``..``, absolute), links,
devices, duplicate names, declared sizes over the zip-bomb :class:`Limits`, entries sharing
data, a missing or malformed ``MAR-INF/MANIFEST.json``, a manifest naming a missing file, a
truncated file (:mod:`~handlerkit.archive.read`). Each refusal is an :class:`ArchiveError`
naming the archive, the entry, the rule and the fix; extraction is all or nothing
(:mod:`~handlerkit.archive.extract`).

``MockContext.from_mar(path)`` (and ``from_model_dir`` given a ``.mar``) extracts into a
private temp dir that lives as long as the context (:func:`open_temporary`).

The package, one concept per module: ``rules`` (the rules, the limits, the error), ``pack``
(what goes in, the manifest), ``write`` (zip, tar.gz, folder), ``read`` (sniffing, listing,
checking), ``extract`` (all or nothing, temp dirs), ``inspect`` (what an archive holds).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from handlerkit.archive.extract import ExtractedArchive, context_from_mar, open_mar, open_temporary
from handlerkit.archive.inspect import ArchiveInfo, FileInfo, inspect_archive
from handlerkit.archive.pack import plan
from handlerkit.archive.read import is_archive, read_manifest
from handlerkit.archive.rules import RULES, ArchiveError, Limits
from handlerkit.archive.write import FORMATS
from handlerkit.archive.write import write as _write

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
    return _write(planned.files, planned.manifest, output, archive_format=archive_format, compression=compression,
                 progress=progress)
