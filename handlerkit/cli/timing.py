"""``handlerkit time MODEL FILES...``: per-stage timing over repeated runs, or a batch-size sweep."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from handlerkit.cli._common import (
    OK,
    Outcome,
    add_threads_argument,
    header,
    loaded_batch,
    model_command,
    non_negative,
    positive,
    sizes,
    torch_threads,
)

HELP = "time each stage over repeated runs (--sweep: across batch sizes)"
DESCRIPTION = (
    "Run the handler of MODEL on FILES (one batch) --warmup times unmeasured, then --repeat times "
    "measured, and print min / median / p90 / mean per stage. With --sweep, the batch is repeated "
    "to each size and latency and throughput are given per size."
)


def add_parser(commands: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    parser = model_command(commands, parents, "time", HELP, DESCRIPTION, command)
    group = parser.add_argument_group("timing")
    group.add_argument(
        "--sweep",
        metavar="SIZES",
        type=sizes,
        nargs="?",
        const=[1, 2, 4, 8],
        help="batch sizes to sweep, e.g. 1,2,4,8 (the default when SIZES is left out)",
    )
    group.add_argument(
        "--repeat",
        metavar="N",
        type=positive,
        default=None,
        help="measured runs (default: 20, or 10 per size in a sweep)",
    )
    group.add_argument(
        "--warmup",
        metavar="N",
        type=non_negative,
        default=None,
        help="unmeasured runs first (default: 3, or 2 per size in a sweep)",
    )
    add_threads_argument(group)


def command(args: argparse.Namespace) -> Outcome:
    with torch_threads(args), loaded_batch(args) as (model, batch):
        h = model.harness
        if args.sweep:
            report = h.sweep(
                batch,
                batch_sizes=args.sweep,
                warmup=_or(args.warmup, 2),
                repeat=_or(args.repeat, 10),
                progress=args.progress,
            )
        else:
            report = h.time(batch, warmup=_or(args.warmup, 3), repeat=_or(args.repeat, 20), progress=args.progress)
        data = {"model": model.label, "handler": h.name, "kind": "sweep" if args.sweep else "time", **report.to_dict()}
        return Outcome(OK, f"{header(model)}\n{report}", data)


def _or(value: int | None, default: int) -> int:
    return default if value is None else value
