"""``handlerkit manifest DIR``: write a model dir's ``MAR-INF/MANIFEST.json``, as torch-model-archiver 0.12 does.

The manifest is the one ``handlerkit archive DIR`` would write into the ``.mar``
(:func:`handlerkit.archive.plan` makes it, :mod:`handlerkit.archive.manifest` lays it out): the
files handlerkit infers (``handler.py``, ``model.py``, the one weights file,
``model-config.yaml``) unless the options name others, and every file it names must be in the
dir, where TorchServe looks. With it, loading the dir no longer warns that its manifest was
inferred, and the dir is an unpacked ``.mar``: ``handlerkit archive`` packs it whole
(:mod:`handlerkit.archive.pack`), so the output names the files that this adds to an archive,
and a hidden or secret-looking file that would make ``archive`` refuse the dir.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from handlerkit.cli._common import OK, InputError, Outcome

HELP = "write a model dir's MAR-INF/MANIFEST.json (torch-model-archiver 0.12's)"
DESCRIPTION = (
    "Write DIR/MAR-INF/MANIFEST.json: the manifest torch-model-archiver 0.12 writes, the one "
    "handlerkit archive would put in the .mar. Its files are the dir's handler.py, model.py, single "
    "weights file and model-config.yaml, unless the options name others (files of DIR). With a "
    "manifest, handlerkit archive packs the dir whole, as an unpacked .mar: the output names the files "
    "that adds."
)
_MANIFEST = "MAR-INF/MANIFEST.json"  # handlerkit.archive.rules.MANIFEST, not imported for --help


def add_parser(commands: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("manifest", help=HELP, description=DESCRIPTION, parents=parents)
    parser.add_argument("model_dir", metavar="DIR", help="the model dir")
    files = parser.add_argument_group("what it names (torch-model-archiver's options; files of DIR)")
    files.add_argument("--model-name", metavar="NAME", help="modelName (default: DIR's name)")
    files.add_argument("--handler", metavar="SPEC", help="a built-in name or a .py file (default: handler.py)")
    files.add_argument("--model-file", metavar="FILE", help="the .py defining the model class (default: model.py)")
    files.add_argument(
        "--serialized-file", metavar="FILE", help="the weights (default: the dir's only .pt, .pth, .onnx ... file)"
    )
    files.add_argument("--requirements-file", metavar="FILE", help="a requirements.txt installed by TorchServe")
    files.add_argument("--config-file", metavar="YAML", help="the model config (default: model-config.yaml)")
    files.add_argument("--version", dest="model_version", metavar="VERSION", help="modelVersion (default: 1.0)")
    parser.add_argument("-f", "--force", action="store_true", help=f"replace an existing {_MANIFEST}")
    parser.set_defaults(command=command)


@dataclass
class Written:
    """A manifest written: where, what, and what it changes for ``handlerkit archive``.

    Attributes:
        path: the ``MAR-INF/MANIFEST.json`` written.
        manifest: its content.
        now_packed: the dir's files ``archive`` packs now that it did not before (the dir is
            packed whole once it has a manifest).
        refused: why ``archive`` now refuses the dir (a hidden or secret-looking file), or None.
    """

    path: Path
    manifest: dict[str, Any]
    now_packed: list[str] = field(default_factory=list)
    refused: str | None = None

    def notes(self) -> list[str]:
        """What a person should know, one line each."""
        notes = []
        if self.now_packed:
            notes.append(
                f"with a manifest, handlerkit archive packs the dir whole (an unpacked .mar), so now also "
                f"{', '.join(self.now_packed)}: move out what the server does not need"
            )
        if self.refused:
            notes.append(f"handlerkit archive now refuses the dir: {self.refused}")
        return notes


def write_manifest(
    model_dir: str | os.PathLike[str],
    *,
    force: bool = False,
    model_name: str | None = None,
    handler: str | None = None,
    model_file: str | None = None,
    serialized_file: str | None = None,
    requirements_file: str | None = None,
    config_file: str | None = None,
    version: str | None = None,
) -> Written:
    """Write ``model_dir``'s ``MAR-INF/MANIFEST.json``: the manifest ``handlerkit archive`` would write.

    The arguments are :func:`handlerkit.archive.plan`'s; the files they name must be in the dir.

    Raises:
        InputError: no such dir, a manifest there already (without ``force``), no handler, a
            model name TorchServe refuses, or a named file outside the dir.
        ArchiveError: what else :func:`~handlerkit.archive.plan` refuses (a missing file).
        ModelLoadError: several weights files and none named, a malformed manifest.
    """
    from handlerkit.archive import ArchiveError, plan

    src = Path(model_dir)
    if not src.is_dir():
        raise InputError(f"{os.fspath(model_dir)} is not a directory: give the model dir")
    path = src / _MANIFEST
    if path.exists() and not force:
        raise InputError(
            f"{path} exists: pass --force to write it anew (its keys are kept unless the options change them)"
        )
    try:
        before = plan(src, src, model_name=model_name, handler=handler, model_file=model_file,
                      serialized_file=serialized_file, requirements_file=requirements_file,
                      config_file=config_file, version=version)  # fmt: skip
    except ArchiveError as exc:  # plan's words for Python callers (handler=, model_name=), as options
        if exc.rule == "no-handler":
            raise InputError(f"{src} has no handler.py: pass --handler (a built-in name such as "
                             "image_classifier, or a .py file of the dir, file.py:function too)") from None  # fmt: skip
        if exc.rule == "model-name":
            raise InputError(f"{exc.message}; pass --model-name with letters, digits, '_', '-' and '.'") from None
        raise
    _check_inside(src, before.manifest["model"])
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(before.manifest, indent=2), encoding="utf-8")  # as archive writes it into a .mar
    written = Written(path, before.manifest)
    try:
        after = plan(src, src)
    except ArchiveError as exc:
        written.refused = exc.message + (f" ({exc.fix})" if exc.fix else "")
    else:
        packed_before = {f.name for f in before.files}
        written.now_packed = [f.name for f in after.files if f.name not in packed_before]
    return written


def _check_inside(src: Path, model: dict[str, Any]) -> None:
    """Every file the manifest names is in the dir's root, where TorchServe looks for it."""
    from handlerkit.archive.manifest import FILE_KEYS, handler_source

    named = [(key, model.get(key)) for key in FILE_KEYS] + [("handler", handler_source(model.get("handler", "")))]
    outside = [f"{key} {value}" for key, value in named if value and not (src / value).is_file()]
    if outside:
        raise InputError(
            f"the manifest would name {', '.join(outside)}, which {src} does not hold: a manifest names files of "
            "its model dir; copy them in (or name them to handlerkit archive, which packs them from where they are)"
        )


def command(args: argparse.Namespace) -> Outcome:
    written = write_manifest(
        args.model_dir,
        force=args.force,
        model_name=args.model_name,
        handler=args.handler,
        model_file=args.model_file,
        serialized_file=args.serialized_file,
        requirements_file=args.requirements_file,
        config_file=args.config_file,
        version=args.model_version,
    )
    notes = written.notes()
    text = f"wrote {written.path}\n{json.dumps(written.manifest, indent=2)}"
    text += "".join(f"\nnote: {note}" for note in notes)
    data = {"path": str(written.path), "manifest": written.manifest, "now_packed": written.now_packed,
            "refused": written.refused, "notes": notes}  # fmt: skip
    return Outcome(OK, text, data)
