"""``handlerkit run MODEL FILES...``: one batch through the handler's ``handle``, stage by stage."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

from handlerkit._compare import shown
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
    "request per file, through TorchServe's handle(); print each stage and each request's answer "
    "(bytes are described: PNG image, 24x16, 1.2 KiB (image/png)). With --json, a bytes answer "
    'is {"content_type": what the handler set, "base64": the bytes}. Without FILES, run '
    "initialize alone: does the model load? Exit code 1 when a stage raised or the output breaks "
    "TorchServe's contract."
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
    """Run ``files`` as one batch; the text is the run's tables and each request's answer."""
    run = model.harness.run(named_requests(model, files, content_type))  # a StageError: exit code 1 (main)
    code = FAILED if any(p.severity == "error" for p in run.problems) else OK
    types = _content_types(model.context, run.output)
    text = f"{header(model)}\n{run}\n\n{answers(files, run.output, types)}"
    data = {
        "model": model.label,
        "handler": model.harness.name,
        "requests": [os.path.basename(f) for f in files],
        "batch_size": run.batch_size,
        "mode": run.mode,
        "total_ms": run.total_ms,
        "stages": stage_rows_of(run.stages),
        "problems": problem_rows(run.problems, files),
        "output": [_json_answer(item, t) for item, t in zip(run.output, types)] if types else jsonable(run.output),
    }
    return Outcome(code, text, data)


def answers(paths: Sequence[str], output: object, content_types: Sequence[str | None] = ()) -> str:
    """One row per request: its file and its answer (the top three classes of a ``{label:
    score}`` dict, a description of bytes, else the item itself, cut to a line)."""
    from handlerkit._text import render_text

    if not isinstance(output, list):  # the contract table above says what is wrong with it
        return render_text(["request", "handle returned"], [["(all)", shown(output, 80)]])
    types = list(content_types) or [None] * len(output)
    rows = [[os.path.basename(path), _answer(item, t)] for path, item, t in zip(paths, output, types)]
    return render_text(["request", "answer"], rows)


def _answer(item: Any, content_type: str | None) -> str:
    if isinstance(item, dict) and item and all(_number(v) for v in item.values()):
        ranked = sorted(item.items(), key=lambda kv: -float(kv[1]))
        return ", ".join(f"{label} {float(p):.3f}" for label, p in ranked[:3])
    if isinstance(item, (bytes, bytearray)):
        return describe_bytes(bytes(item), content_type)
    return shown(item, 80)


def describe_bytes(data: bytes, content_type: str | None = None) -> str:
    """What a bytes answer is, from its header and the content type the handler set:
    ``PNG image, 24x16, 1.2 KiB (image/png)``, ``WAV audio, 1 channel(s), 8000 Hz, 1.00 s, ...``."""
    from handlerkit._text import format_bytes

    kind = _sniffed(data)
    if kind is None and content_type and content_type.startswith(("text/", "application/json")):
        try:
            kind = shown(data.decode("utf-8"), 60)
        except UnicodeDecodeError:
            kind = None
    described = f"{kind or 'bytes'}, {format_bytes(len(data))}"
    return f"{described} ({content_type})" if content_type else described


def _sniffed(data: bytes) -> str | None:
    """An image's format and size (Pillow reads its header only) or a WAV's format; else None."""
    import io

    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        import wave

        try:
            with wave.open(io.BytesIO(data)) as wav:
                seconds = wav.getnframes() / wav.getframerate()
                return f"WAV audio, {wav.getnchannels()} channel(s), {wav.getframerate()} Hz, {seconds:.2f} s"
        except (wave.Error, EOFError, ZeroDivisionError):
            return "WAV audio (its header does not read)"
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            return f"{image.format} image, {image.width}x{image.height}"
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        return None


def _content_types(context: Any, output: object) -> list[str | None]:
    """The content type the handler set for each answer (the worker sends it); [] for no list."""
    if not isinstance(output, list):
        return []
    get = getattr(context, "get_response_content_type", None)
    return [get(i) if get is not None else None for i in range(len(output))]


def _json_answer(item: Any, content_type: str | None) -> Any:
    """An answer as JSON: bytes as ``{"content_type", "base64"}``, the rest as :func:`jsonable`."""
    if isinstance(item, (bytes, bytearray)):
        import base64

        return {"content_type": content_type, "base64": base64.b64encode(bytes(item)).decode("ascii")}
    return jsonable(item)


def _number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True
