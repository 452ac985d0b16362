"""``handlerkit check MODEL FILES...``: TorchServe's contract checked on a batch (``Harness.check``);
``handlerkit check --protocol v2 URL``: a running server checked against the Open Inference
Protocol v2 (:func:`handlerkit.serving.v2_check.check`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from handlerkit.cli._common import (
    FAILED,
    OK,
    InputError,
    Outcome,
    header,
    jsonable,
    loaded_batch,
    model_command,
    problem_rows,
)

HELP = "check a handler against TorchServe's contract on files, or a server against the v2 protocol"
DESCRIPTION = (
    "Run the handler of MODEL on FILES and check what TorchServe would reject or clients would "
    "trip on: one output item per request, JSON-serialisable items, response statuses, the same "
    "answer alone and in the batch, other encodings of each request, and for a compiled model the "
    "recompile gate. With --protocol v2, MODEL is a running server's URL instead (no FILES): its "
    "health, metadata and inference endpoints and its answers to bad requests are checked against "
    "the Open Inference Protocol v2, one row per endpoint and rule. Exit code 1 when a check fails."
)


def add_parser(commands: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    parser = model_command(commands, parents, "check", HELP, DESCRIPTION, command, files="*")
    for action in parser._actions:  # argparse has no public way to reword a shared positional's help
        if action.dest == "model":
            action.help = "a model dir (an unpacked .mar) or a .mar file; with --protocol v2, a server's URL"
    tolerance = parser.add_argument_group("tolerance (batch parity)")
    tolerance.add_argument("--atol", type=float, default=1e-4, help="absolute tolerance (default: 1e-4)")
    tolerance.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance (default: 1e-4)")
    protocol = parser.add_argument_group("a server (--protocol v2 URL)")
    protocol.add_argument(
        "--protocol",
        choices=["v2"],
        help="check the server at URL (given as MODEL) against the Open Inference Protocol v2",
    )
    protocol.add_argument(
        "--model", dest="served_model", metavar="NAME", help="the served model to check (default: the one it lists)"
    )
    protocol.add_argument(
        "--inputs",
        metavar="JSON",
        help="a file holding the well-formed request's v2 inputs (a list, or a request with 'inputs'), for a "
        "model that needs other data (default: built from the model's metadata, a BYTES element being a small "
        "PNG, base64)",
    )
    protocol.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for each answer (default: 10)")


def command(args: argparse.Namespace) -> Outcome:
    if args.protocol == "v2":
        return _protocol_v2(args)
    for option, value in (("--model NAME", args.served_model), ("--inputs JSON", args.inputs)):
        if value is not None:
            raise InputError(f"{option} is for a served model: it needs --protocol v2 URL")
    if not args.files:
        raise InputError("check needs FILES: one request body per file (or --protocol v2 URL to check a server)")
    with loaded_batch(args) as (model, batch):
        report = model.harness.check(batch, atol=args.atol, rtol=args.rtol, progress=args.progress)
        data = {"model": model.label, **jsonable(dataclasses.asdict(report)), "ok": report.ok}
        data["problems"] = problem_rows(report.problems, args.files)
        return Outcome(OK if report.ok else FAILED, f"{header(model)}\n{report}", data)


def _protocol_v2(args: argparse.Namespace) -> Outcome:
    from handlerkit.serving.v2_check import check

    if args.files:
        raise InputError(f"--protocol v2 takes one URL and no FILES: got {' '.join([args.model, *args.files])}")
    report = check(args.model, args.served_model, inputs=_inputs(args.inputs), timeout=args.timeout)
    return Outcome(OK if report.ok else FAILED, str(report), report.to_dict())


def _inputs(path: str | None) -> Any:
    """The v2 inputs in the ``--inputs`` file: a list, or a request's ``inputs``."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
    except (OSError, ValueError) as exc:
        raise InputError(f"--inputs {path}: expected a JSON file of v2 inputs: {exc}") from exc
    return data.get("inputs") if isinstance(data, dict) else data
