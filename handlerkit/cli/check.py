"""``handlerkit check MODEL FILES...``: TorchServe's contract checked on a batch (``Harness.check``)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import Any

from handlerkit.cli._common import FAILED, OK, Outcome, header, jsonable, loaded_batch, model_command, problem_rows

HELP = "check a handler against TorchServe's contract on files"
DESCRIPTION = (
    "Run the handler of MODEL on FILES and check what TorchServe would reject or clients would "
    "trip on: one output item per request, JSON-serialisable items, response statuses, the same "
    "answer alone and in the batch, other encodings of each request, and for a compiled model the "
    "recompile gate. Exit code 1 when a check fails."
)


def add_parser(commands: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    parser = model_command(commands, parents, "check", HELP, DESCRIPTION, command)
    tolerance = parser.add_argument_group("tolerance (batch parity)")
    tolerance.add_argument("--atol", type=float, default=1e-4, help="absolute tolerance (default: 1e-4)")
    tolerance.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance (default: 1e-4)")


def command(args: argparse.Namespace) -> Outcome:
    with loaded_batch(args) as (model, batch):
        report = model.harness.check(batch, atol=args.atol, rtol=args.rtol, progress=args.progress)
        data = {"model": model.label, **jsonable(dataclasses.asdict(report)), "ok": report.ok}
        data["problems"] = problem_rows(report.problems, args.files)
        return Outcome(OK if report.ok else FAILED, f"{header(model)}\n{report}", data)
