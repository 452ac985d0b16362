"""``handlerkit archive [SOURCE] -o OUTDIR``: build a ``.mar`` (:func:`handlerkit.archive.build`).

Prints the archive written, every file packed with its size and why it is in, the model dir's
files left out, and the ``torchserve`` command that serves it; ``--json`` gives the same as
data (:meth:`handlerkit.archive.Plan.to_dict` plus the path, format, size and time).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from handlerkit.cli._common import OK, InputError, Outcome, check_files, requests

HELP = "build a .mar (or a no-archive dir, or a .tar.gz)"
DESCRIPTION = (
    "Build a model archive from SOURCE (a model dir: its MAR-INF/MANIFEST.json, or files named as "
    "handlerkit infers them) and/or from the files named by the options, with the "
    "MAR-INF/MANIFEST.json torch-model-archiver 0.12 writes. From a model dir, the files its manifest "
    "references, the local modules they import and index_to_name.json are packed, and everything else "
    "is named as left out (an unpacked .mar, with MAR-INF/MANIFEST.json, is packed whole); hidden and "
    "secret-looking files (.env, *.pem, id_rsa...) are never swept in. Weights are stored as they are and "
    "text is deflated, so big models archive fast. The options are torch-model-archiver's."
)
FORMATS = ("default", "no-archive", "tgz", "zip-store")  # handlerkit.archive's, not imported for --help


def add_parser(commands: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("archive", help=HELP, description=DESCRIPTION, parents=parents)
    parser.add_argument(
        "source", metavar="SOURCE", nargs="?", help="a model dir to archive (optional with the file options)"
    )
    parser.add_argument(
        "-o",
        "--output-dir",
        "--export-path",
        dest="output_dir",
        metavar="OUTDIR",
        required=True,
        help="where the archive is written",
    )
    files = parser.add_argument_group("what goes in (torch-model-archiver's options)")
    files.add_argument("--model-name", metavar="NAME", help="modelName (default: the manifest's, else SOURCE's name)")
    files.add_argument("--handler", metavar="SPEC", help="the handler: a built-in name or a .py file")
    files.add_argument("--model-file", metavar="FILE", help="the .py defining the model class (eager models)")
    files.add_argument("--serialized-file", metavar="FILE", help="the weights: .pt, .pth, .onnx, .pt2 ...")
    files.add_argument(
        "--extra-files",
        metavar="FILES",
        action="append",
        default=[],
        help="more files (to the root), folders (their contents) or globs, comma-separated; "
        "may be repeated. A folder or glob holding a hidden or secret-looking file is refused; "
        "a file named here is packed",
    )
    files.add_argument("--requirements-file", metavar="FILE", help="a requirements.txt installed by TorchServe")
    files.add_argument("--config-file", metavar="YAML", help="the model-config.yaml")
    files.add_argument(
        "--version", dest="model_version", metavar="VERSION", help="modelVersion (default: the manifest's, else 1.0)"
    )
    out = parser.add_argument_group("the archive")
    out.add_argument(
        "--format",
        "--archive-format",
        dest="archive_format",
        choices=FORMATS,
        default="default",
        help="default: NAME.mar; no-archive: a NAME/ dir; tgz: NAME.tar.gz; zip-store: a .mar with "
        "nothing deflated (default: default)",
    )
    out.add_argument(
        "--compression",
        choices=("auto", "deflate", "store"),
        default="auto",
        help="auto: weights and compressed files stored, the rest deflated; deflate: everything, "
        "as torch-model-archiver (default: auto)",
    )
    out.add_argument("-f", "--force", action="store_true", help="overwrite an existing archive")
    out.add_argument(
        "--compile-cache",
        metavar="FILES",
        nargs="+",
        help="compile the handler's model on these request files in a fresh process and ship "
        "torch.compiler.save_cache_artifacts() as compile-cache.bin (tagged with the torch version and "
        "device kind); hk.BaseHandler loads it before its first compiled call where the tag matches",
    )
    parser.set_defaults(command=command)


def command(args: argparse.Namespace) -> Outcome:
    if args.source is not None and not os.path.isdir(args.source):
        what = "is not a directory" if os.path.exists(args.source) else "does not exist"
        raise InputError(f"SOURCE {args.source} {what}: give the model dir to archive")
    if args.source is None and not (args.model_name and args.handler):
        raise InputError("give SOURCE (a model dir), or --model-name and --handler with the model's files")
    from handlerkit._text import format_bytes
    from handlerkit.archive import add_compile_cache, plan

    start = time.perf_counter()
    planned = plan(
        args.source,
        args.output_dir,
        model_name=args.model_name,
        handler=args.handler,
        model_file=args.model_file,
        serialized_file=args.serialized_file,
        extra_files=[part for value in args.extra_files for part in value.split(",") if part],
        requirements_file=args.requirements_file,
        config_file=args.config_file,
        version=args.model_version,
    )
    if args.compile_cache:
        check_files(args.compile_cache)
        with tempfile.TemporaryDirectory(prefix="handlerkit-compile-cache-") as workdir:
            recorded = add_compile_cache(planned, requests(args.compile_cache), workdir)
            path = planned.write(
                args.archive_format, force=args.force, compression=args.compression, progress=args.progress
            )
    else:
        recorded = None
        path = planned.write(
            args.archive_format, force=args.force, compression=args.compression, progress=args.progress
        )
    seconds = time.perf_counter() - start
    size = _size(os.fspath(path))
    store = os.path.dirname(os.path.abspath(path))
    text = (
        f"wrote {path} ({format_bytes(size)}) in {seconds:.2f} s\n{planned}\n"
        f"serve it: torchserve --start --ncs --model-store {store} "
        f"--models {planned.model_name}={os.path.basename(os.fspath(path))}"
    )
    data = {
        "path": os.fspath(path),
        "format": args.archive_format,
        "bytes": size,
        "seconds": seconds,
        **planned.to_dict(),
    }
    if recorded is not None:
        data["compile_cache"] = {"artifacts": recorded.artifacts, "first_call_s": recorded.first_call_s}
        listed = ", ".join(f"{n} {kind}" for kind, n in recorded.artifacts.items())
        text += (
            f"\ncompile cache: {listed} artifact(s), recorded in {recorded.first_call_s:.1f} s (first compiled call)"
        )
    return Outcome(OK, text, data)


def _size(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, names in os.walk(path) for f in names)
