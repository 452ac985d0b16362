"""``handlerkit formats MODEL FILES...``: the format lab (``Harness.compare_formats``), and with
``--save FORMAT`` the chosen format saved into the model dir."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from handlerkit.cli._common import (
    FAILED,
    OK,
    InputError,
    Outcome,
    add_threads_argument,
    header,
    jsonable,
    loaded_batch,
    model_command,
    non_negative,
    positive,
    torch_threads,
)

HELP = "compare the model's formats (TorchScript, ONNX, export, ...) inside the handler; --save one"
DESCRIPTION = (
    "Export the model of MODEL to each format (default: eager, torchscript, onnx, export; aoti and "
    "compile on request), run FILES through the handler's own preprocess and postprocess with each, "
    "and report whether the answers agree with eager, the export time, first call, steady-state "
    "median, peak memory, file size, and the batch sizes and input dimensions each accepts (those "
    "the FILES vary, e.g. lists of different lengths, or declared with --dynamic). With --save "
    "FORMAT, that format is written into the model dir and its manifest (and model-config.yaml's "
    "pt2) point at it, when its answers agree and a fresh load of the saved dir answers the FILES "
    "through the handler. Exit code 1 when a format fails or disagrees, or the save is refused."
)
_LAB_FORMATS = (
    "eager",
    "torchscript",
    "onnx",
    "export",
    "aoti",
    "compile",
)  # format_lab.LAB_FORMATS, not imported for --help


def add_parser(commands: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    parser = model_command(commands, parents, "formats", HELP, DESCRIPTION, command)
    group = parser.add_argument_group("format lab")
    group.add_argument(
        "--formats", metavar="A,B", type=_format_list, help="formats to try, e.g. torchscript,onnx (default: eager, "
        "torchscript, onnx, export; also aoti, compile)",
    )  # fmt: skip
    group.add_argument(
        "--save", metavar="FORMAT", choices=_LAB_FORMATS, help="write this format into the model dir when it agrees"
    )
    group.add_argument(
        "--replace", action="store_true", help="with --save, delete the files of earlier saves (never the weights)"
    )
    group.add_argument(
        "--dynamic", metavar="INPUT:DIM,...", type=_dynamic_dims, help="input dimensions that vary besides the "
        "batch, exported dynamic, e.g. item_ids:1,mask:1 (INPUT: forward's parameter or position; INPUT: alone "
        "keeps all its dims fixed; default: model-config.yaml's handler.dynamic_shapes, else what FILES vary)",
    )  # fmt: skip
    group.add_argument(
        "--repeat", metavar="N", type=positive, default=10, help="steady calls timed per format (default: 10)"
    )
    group.add_argument("--warmup", metavar="N", type=non_negative, default=1, help="calls discarded first (default: 1)")
    add_threads_argument(group)


def _format_list(text: str) -> list[str]:
    """An argparse type: ``"torchscript,onnx"`` -> ``["torchscript", "onnx"]``, each a lab format."""
    from handlerkit._text import suggestion

    names = [part.strip() for part in text.split(",") if part.strip()]
    for name in names:
        if name not in _LAB_FORMATS:
            raise argparse.ArgumentTypeError(
                f"unknown format {name!r}{suggestion(name, _LAB_FORMATS)}; the formats are {', '.join(_LAB_FORMATS)}"
            )
    if not names:
        raise argparse.ArgumentTypeError(f"expected formats like torchscript,onnx: got {text!r}")
    return names


def _dynamic_dims(text: str) -> dict[str | int, list[int]]:
    """An argparse type: ``"item_ids:1,mask:1"`` -> ``{"item_ids": [1], "mask": [1]}`` (``"2:1"``: input 2)."""
    dims: dict[str | int, list[int]] = {}
    for part in (p.strip() for p in text.split(",")):
        name, colon, dim = part.partition(":")
        name, dim = name.strip(), dim.strip()
        if not colon or not name or (dim and (not dim.isdigit() or int(dim) < 1)):
            raise argparse.ArgumentTypeError(
                f"expected INPUT:DIM pairs like item_ids:1,mask:1 (DIM 1 and up: the batch, 0, always varies): "
                f"got {part!r}"
            )
        key: str | int = int(name) if name.isdigit() else name
        dims.setdefault(key, [])
        if dim:
            dims[key].append(int(dim))
    return dims


def command(args: argparse.Namespace) -> Outcome:
    if args.replace and args.save is None:
        raise InputError("--replace deletes earlier saves when --save FORMAT saves a new one: give --save too")
    with torch_threads(args), loaded_batch(args) as (model, batch):
        try:
            report = model.harness.compare_formats(
                batch,
                formats=args.formats,
                repeat=args.repeat,
                warmup=args.warmup,
                save=args.save,
                replace=args.replace,
                dynamic_shapes=args.dynamic,
                progress=args.progress,
            )
        except ValueError as exc:  # the lab's arguments: --dynamic naming an input the model does not take
            raise InputError(str(exc).replace("dynamic_shapes=", "--dynamic", 1)) from exc
        ok = report.ok and (args.save is None or report.saved is not None)
        data = {"model": model.label, **jsonable(report.to_dict()), "ok": ok}
        return Outcome(OK if ok else FAILED, f"{header(model)}\n{report}", data)
