"""``handlerkit compile MODEL FILES...``: what ``torch.compile`` did (``Harness.compile_report``),
and with ``--batch-sizes`` the deploy-time gate: will traffic of those sizes recompile?"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from handlerkit.cli._common import (
    FAILED,
    OK,
    Outcome,
    add_threads_argument,
    header,
    jsonable,
    loaded_batch,
    model_command,
    non_negative,
    positive,
    sizes,
    torch_threads,
)

HELP = "report on torch.compile: cost, graph breaks, recompiles, the gate"
DESCRIPTION = (
    "Run the handler of MODEL on FILES with the model compiled as its model-config.yaml says "
    "(pt2: compile: enable: true), and report whether compilation applied, what the first call "
    "cost, graph breaks and recompiles with their fixes, and compiled against eager. With "
    "--batch-sizes, replay the batch at each size under fail_on_recompile: exit code 1 when a "
    "size recompiles (or the compile failed)."
)


def add_parser(commands: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    parser = model_command(commands, parents, "compile", HELP, DESCRIPTION, command)
    group = parser.add_argument_group("compile report")
    group.add_argument(
        "--batch-sizes",
        metavar="SIZES",
        type=sizes,
        help="the recompile gate: batch sizes traffic will bring, e.g. 1,2,4,8",
    )
    group.add_argument(
        "--repeat",
        metavar="N",
        type=positive,
        default=10,
        help="steady calls timed, compiled and eager each (default: 10)",
    )
    group.add_argument(
        "--warmup", metavar="N", type=non_negative, default=1, help="calls discarded before timing (default: 1)"
    )
    add_threads_argument(group)


def command(args: argparse.Namespace) -> Outcome:
    with torch_threads(args), loaded_batch(args) as (model, batch):
        report = model.harness.compile_report(
            batch, batch_sizes=args.batch_sizes, repeat=args.repeat, warmup=args.warmup, progress=args.progress
        )
        data = {"model": model.label, **jsonable(report.to_dict()), "ok": report.ok}
        return Outcome(OK if report.ok else FAILED, f"{header(model)}\n{report}", data)
