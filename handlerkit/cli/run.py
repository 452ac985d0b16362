"""``handlerkit run MODEL FILES...``: one batch through the handler's ``handle``, stage by stage."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

from handlerkit.cli._common import (
    FAILED,
    OK,
    Loaded,
    Outcome,
    header,
    jsonable,
    loaded,
    model_command,
    named_requests,
    problem_rows,
    stage_rows_of,
)

HELP = "run a model's handler on files, stage by stage"
DESCRIPTION = (
    "Run the handler of MODEL (a model dir, i.e. an unpacked .mar, or a .mar file) on FILES, one "
    "request per file, through TorchServe's handle(); print each stage and the predictions. "
    "Without FILES, run initialize alone: does the model load? Exit code 1 when a stage raised "
    "or the output breaks TorchServe's contract."
)


def add_parser(commands: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    model_command(commands, parents, "run", HELP, DESCRIPTION, command, files="*")


def command(args: argparse.Namespace) -> Outcome:
    with loaded(args) as model:
        if not args.files:
            return initialize(model)
        return run_files(model, args.files, args.content_type)


def initialize(model: Loaded) -> Outcome:
    """``initialize`` alone (a StageError: exit code 1, from main)."""
    result = model.harness.initialize()
    data = {"model": model.label, "handler": model.harness.name, "stages": stage_rows_of({"initialize": result})}
    return Outcome(OK, f"{header(model)}\n{result}", data)


def run_files(model: Loaded, files: Sequence[str], content_type: str | None = None) -> Outcome:
    """Run ``files`` as one batch; the text is the run's tables and the top predictions."""
    run = model.harness.run(named_requests(model, files, content_type))  # a StageError: exit code 1 (main)
    code = FAILED if any(p.severity == "error" for p in run.problems) else OK
    text = f"{header(model)}\n{run}\n\n{predictions(files, run.output)}"
    data = {
        "model": model.label,
        "handler": model.harness.name,
        "requests": [os.path.basename(f) for f in files],
        "batch_size": run.batch_size,
        "mode": run.mode,
        "total_ms": run.total_ms,
        "stages": stage_rows_of(run.stages),
        "problems": problem_rows(run.problems, files),
        "output": jsonable(run.output),
    }
    return Outcome(code, text, data)


def predictions(paths: Sequence[str], output: object) -> str:
    """One row per request: its file and the top three classes, or the item itself."""
    from handlerkit._text import render_text

    if not isinstance(output, list):  # the contract table above says what is wrong with it
        return render_text(["request", "handle returned"], [["(all)", repr(output)[:80]]])
    rows = []
    for path, item in zip(paths, output):
        if isinstance(item, dict) and item and all(_number(v) for v in item.values()):
            ranked = sorted(item.items(), key=lambda kv: -float(kv[1]))
            top = ", ".join(f"{label} {float(p):.3f}" for label, p in ranked[:3])
        else:
            top = repr(item)[:80]
        rows.append([os.path.basename(path), top])
    return render_text(["request", "top predictions"], rows)


def _number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True
