"""Model archives (``.mar``): build them as ``torch-model-archiver`` 0.12 does, open them safely.

Build from a model dir or from files one by one, in the archiver's forms::

    from handlerkit import archive
    mar = archive.build("fixtures/models/image_classifier", "model_store")   # model_store/image_classifier.mar
    archive.build(None, "store", model_name="shapes", handler="handler.py", serialized_file="model.pt",
                  model_file="model.py", extra_files=["index_to_name.json"], archive_format="tgz")

What goes in, and why, before anything is written::

    plan = archive.plan("my_model", "model_store")   # a Plan: .files (name, size, reason), .left_out
    print(plan)                                      # the table; notes name what is not packed
    plan.write("tgz")                                # model_store/my_model.tar.gz; build() is plan().write()

From a model dir, the files its manifest references (inferred from the files when there is no
``MAR-INF/MANIFEST.json``), the local modules they import and ``index_to_name.json`` are
packed; training scripts, notes and secrets are left out and named. An unpacked ``.mar`` is
packed whole. Hidden and secret-looking files are never swept in by a folder or a glob
(:mod:`~handlerkit.archive.pack`). The manifest is the archiver's, key for key
(:mod:`~handlerkit.archive.manifest`). Weights are stored rather than deflated and text is
deflated, in a ``.mar`` and in a ``.tar.gz`` alike, so a 500 MB model archives at disk speed
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

The package, one concept per module: ``rules`` (the rules, the limits, the error, what is
never swept in), ``pack`` (what goes in, and why), ``imports`` (a model dir's modules that
code imports), ``manifest`` (the archiver's manifest), ``write`` (zip, tar.gz, folder),
``read`` (sniffing, listing, checking), ``extract`` (all or nothing, temp dirs), ``inspect``
(what an archive holds).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from handlerkit.archive.extract import ExtractedArchive, context_from_mar, open_mar, open_temporary
from handlerkit.archive.inspect import ArchiveInfo, FileInfo, inspect_archive
from handlerkit.archive.pack import LeftOut, PackedFile, Plan, plan
from handlerkit.archive.read import is_archive, read_manifest
from handlerkit.archive.rules import NEVER_SWEPT, RULES, ArchiveError, Limits
from handlerkit.archive.write import check_options

if TYPE_CHECKING:
    from handlerkit.formats.compile_cache import Recorded

__all__ = [
    "NEVER_SWEPT",
    "RULES",
    "ArchiveError",
    "ArchiveInfo",
    "ExtractedArchive",
    "FileInfo",
    "LeftOut",
    "Limits",
    "PackedFile",
    "Plan",
    "add_compile_cache",
    "build",
    "context_from_mar",
    "inspect_archive",
    "is_archive",
    "open_mar",
    "open_temporary",
    "plan",
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
    compile_cache: Any = None,
) -> Path:
    """Build a model archive with the manifest ``torch-model-archiver`` 0.12 would write.

    Args:
        source: a model dir, whose manifest (or the one inferred from its files) gives every
            default and which contributes the files its manifest references and what they
            evidently need (an unpacked ``.mar``: every file; see :mod:`~handlerkit.archive.pack`);
            or None, to give the files one by one. :func:`plan` says what goes in and why.
        output_dir: where the archive goes (created if missing).
        model_name: the archive's and the model's name (default: the manifest's, else the
            dir's); ``^[A-Za-z0-9][A-Za-z0-9_\\-.]*$``.
        handler: a built-in name (``image_classifier``), a file (``dir/handler.py``,
            ``dir/handler.py:fn``, ``dir/handler:fn``) archived as its base name.
        model_file, serialized_file, requirements_file, config_file: files archived under their
            base names and named in the manifest. Relative paths are looked up in ``source``
            first, then in the working directory.
        extra_files: files (to the root), folders (their contents, sub-folders kept) and globs;
            a string is split on commas, as ``--extra-files``. A folder or glob holding a hidden
            or secret-looking file (:data:`NEVER_SWEPT`) is refused; name that file to pack it.
        version: ``modelVersion`` (default: the manifest's, else ``"1.0"``).
        archive_format: ``"default"`` (``<name>.mar``, a zip), ``"tgz"`` (``<name>.tar.gz``),
            ``"no-archive"`` (the folder ``<name>/``) or ``"zip-store"`` (a zip, nothing deflated).
        force: replace an existing output (else :class:`ArchiveError`, rule ``exists``).
        progress: a progress bar in MiB (None: where a person watches, see ``_progress``).
        compression: ``"auto"`` (weights and incompressible files stored, the rest deflated),
            ``"deflate"`` (everything, as the archiver) or ``"store"``.
        compile_cache: a batch (``hk.batch(...)``): the handler's model is compiled on it in a
            fresh process, and ``compile-cache.bin`` (``torch.compiler.save_cache_artifacts()``)
            and its tag ``compile-cache.json`` are packed too, with ``compile-kernels.zip`` (the C++
            kernels Inductor built, so a CPU cold start builds none); ``hk.BaseHandler`` loads them
            before its first compiled call where the tag matches
            (:mod:`~handlerkit.formats.compile_cache`).

    Returns:
        The ``.mar``, ``.tar.gz`` or folder written.

    Raises:
        ArchiveError: a missing input file (``missing-file``), no handler (``no-handler``), a
            bad model name, two files with one archive name (``name-collision``), a hidden or
            secret-looking file swept in (``secret-file``), a manifest naming a file that is
            not archived, or an existing output without ``force``.
        HandlerkitError: ``compile_cache`` given, and the handler does not compile its model
            or fails on the batch.
    """
    check_options(archive_format, compression)
    planned = plan(
        source,
        output_dir,
        model_name=model_name,
        handler=handler,
        model_file=model_file,
        serialized_file=serialized_file,
        extra_files=extra_files,
        requirements_file=requirements_file,
        config_file=config_file,
        version=version,
    )
    if compile_cache is None:
        return planned.write(archive_format, force=force, compression=compression, progress=progress)
    with tempfile.TemporaryDirectory(prefix="handlerkit-compile-cache-") as workdir:
        add_compile_cache(planned, compile_cache, workdir)
        return planned.write(archive_format, force=force, compression=compression, progress=progress)


def add_compile_cache(planned: Plan, batch: Any, workdir: str | os.PathLike[str]) -> Recorded:
    """Add a compile cache recorded on ``batch`` to ``planned`` (what ``compile_cache=`` does).

    The plan is written as a folder under ``workdir``, its handler compiled there in a fresh
    process (:func:`~handlerkit.formats.compile_cache.record`), and ``compile-cache.bin``,
    ``compile-cache.json`` and (on CPU) ``compile-kernels.zip``, left in ``workdir``, join the
    plan: write it before ``workdir`` goes.
    """
    import dataclasses

    from handlerkit.formats.compile_cache import record
    from handlerkit.formats.compile_kernels import KERNELS_FILE

    model_dir, cache_dir = Path(workdir, "model"), Path(workdir, "cache")
    cache_dir.mkdir(parents=True, exist_ok=True)
    folder = dataclasses.replace(planned, output_dir=model_dir).write("no-archive", progress=False)
    recorded = record(os.fspath(folder), batch, os.fspath(cache_dir), label=f"model {planned.model_name!r}")
    listed = ", ".join(f"{n} {kind}" for kind, n in recorded.artifacts.items())
    shipped = [(recorded.cache, f"compile cache ({listed})"), (recorded.tag, "the compile cache's tag")]
    if recorded.kernels is not None:
        shipped.append((recorded.kernels, "the compile cache's C++ kernels"))
    names = {os.path.basename(path) for path in (recorded.cache, recorded.tag, recorded.kernels or KERNELS_FILE)}
    planned.files[:] = [f for f in planned.files if f.name not in names]  # an earlier recording is replaced
    for path, what in shipped:
        planned.files.append(PackedFile(os.path.basename(path), os.path.getsize(path), Path(path), what))
    return recorded
