"""What every subcommand shares: options, loading a model (dir or ``.mar``), files as requests,
JSON output, and the exit codes.

Exit codes: :data:`OK` (0), :data:`FAILED` (1: a handler failed, its code raised while loading,
or a check found a problem), :data:`USAGE` (2: a usage or input error, one line on stderr, no
traceback). Only the standard library is imported at module level: ``handlerkit --help`` must
not pay for torch.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

OK, FAILED, USAGE = 0, 1, 2

#: A model dir has a manifest or one of the files a manifest is inferred from
#: (handlerkit.worker.modeldir.infer_manifest); these, plus its weights suffixes.
_MODEL_DIR_FILES = ("MAR-INF/MANIFEST.json", "model.py", "handler.py", "model-config.yaml")
_JSON_VALUES = 4096  # a tensor with more values is described in --json output, not listed


class InputError(Exception):
    """A usage or input problem: one line on stderr, exit code 2."""


@dataclass
class Outcome:
    """What a subcommand produced: its exit code, the text for a person, the data for ``--json``."""

    code: int
    text: str
    data: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------ options
def output_options() -> argparse.ArgumentParser:
    """``--json`` and ``--no-progress``, shared by every subcommand (an argparse parent)."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("output")
    group.add_argument(
        "--json", action="store_true", help="print one JSON document on stdout (for scripts), nothing else"
    )
    group.add_argument(
        "--no-progress",
        dest="progress",
        action="store_const",
        const=False,
        default=None,
        help="no progress bars (default: shown when stderr is a terminal)",
    )
    return parent


def model_command(
    commands: Any,
    parents: Sequence[argparse.ArgumentParser],
    name: str,
    help: str,
    description: str,
    command: Any,
    *,
    files: str = "+",
) -> argparse.ArgumentParser:
    """A subcommand that runs a model on files: ``MODEL FILES...`` and the model options; the
    caller adds its own options to the parser returned."""
    parser = commands.add_parser(name, help=help, description=description, parents=parents)
    add_model_arguments(parser, files=files)
    parser.set_defaults(command=command)
    return parser


def add_model_arguments(parser: argparse.ArgumentParser, *, files: str = "+") -> None:
    """``MODEL FILES...`` and the options that say how to load and feed the model."""
    parser.add_argument("model", metavar="MODEL", help="a model dir (an unpacked .mar) or a .mar file")
    parser.add_argument(
        "files", metavar="FILES", nargs=files, help="request bodies, one request per file, all in one batch"
    )
    group = parser.add_argument_group("model")
    group.add_argument("--handler", metavar="SPEC", help="handler spec (default: the manifest's handler)")
    group.add_argument(
        "--config", metavar="YAML", help="a model-config.yaml to use instead of the manifest's configFile"
    )
    group.add_argument(
        "--content-type",
        metavar="TYPE",
        help="the Content-Type of every request (default: guessed from each file's extension: "
        "images -> image/*, .json -> application/json, .txt -> text/plain)",
    )


def add_threads_argument(parser: Any) -> None:
    """``--threads N`` on a parser or argument group, for the commands that time (``time``,
    ``compile``, ``formats``); :func:`torch_threads` applies it."""
    parser.add_argument(
        "--threads",
        metavar="N",
        type=positive,
        help="torch's intra-op CPU threads for the run (torch.set_num_threads); default: torch's own. "
        "1 gives steadier timings of a small model on a busy machine",
    )


@contextlib.contextmanager
def torch_threads(args: argparse.Namespace) -> Iterator[None]:
    """The run with ``--threads N`` applied (``torch.set_num_threads``, put back after: ``main``
    may run inside a notebook or a test), and thread warnings that name ``--threads``, the
    remedy a terminal has."""
    from handlerkit.worker.devices import threads_advice

    count = getattr(args, "threads", None)
    with threads_advice("run with --threads {n}"):
        if count is None:
            yield
            return
        import torch

        before = torch.get_num_threads()
        torch.set_num_threads(count)
        try:
            yield
        finally:
            torch.set_num_threads(before)


def sizes(text: str) -> list[int]:
    """An argparse type: ``"1,2,4,8"`` -> ``[1, 2, 4, 8]`` (positive, no repeats)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected batch sizes like 1,2,4,8: got {text!r}") from None
    if not values or any(v < 1 for v in values) or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"expected distinct positive batch sizes like 1,2,4,8: got {text!r}")
    return values


def positive(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer: got {text!r}")
    return value


def non_negative(text: str) -> int:
    """An argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0: got {text!r}")
    return value


# ------------------------------------------------------------------------------- the model
def check_files(files: Sequence[str]) -> None:
    """Every request file exists (all missing ones named at once)."""
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise InputError(f"no such file: {', '.join(missing)}")


def model_dir_problem(path: str, handler: str | None = None) -> str | None:
    """Why ``path`` (a dir) is no model dir, or None: it needs a manifest, a file a manifest is
    inferred from (model.py, handler.py, model-config.yaml, weights), or the ``--handler`` file."""
    from handlerkit.worker.modeldir import WEIGHTS_SUFFIXES

    if any(os.path.isfile(os.path.join(path, name)) for name in _MODEL_DIR_FILES):
        return None
    names = os.listdir(path)
    if any(name.endswith(WEIGHTS_SUFFIXES) for name in names):
        return None
    handler_file = (handler or "").partition(":")[0]  # --handler handler.py[:fn], in the dir or elsewhere
    if handler_file.endswith(".py") and any(
        os.path.isfile(f) for f in (os.path.join(path, handler_file), handler_file)
    ):
        return None
    return (
        f"{path} is not a model dir: it has no MAR-INF/MANIFEST.json and none of model.py, handler.py, "
        f"model-config.yaml or a weights file ({', '.join(WEIGHTS_SUFFIXES)})"
    )


@dataclass
class Loaded:
    """A model ready to run: its harness (``harness.service`` holds the context) and its name
    (the manifest's ``modelName``)."""

    harness: Any
    label: str

    @property
    def context(self) -> Any:
        return self.harness.context


@contextlib.contextmanager
def loaded(args: argparse.Namespace) -> Iterator[Loaded]:
    """The ``MODEL`` of ``args`` opened as a harness (:meth:`Harness.open
    <handlerkit.harness.Harness.open>`: a model dir, or an archive unpacked into a temporary dir
    removed on exit), with the manifest's handler unless ``--handler``; request files checked first.

    Raises:
        InputError: a missing request file, no such path, or a dir that is no model dir.
        HandlerkitError: an archive refused, a malformed manifest or config, a handler that
            cannot be loaded.
    """
    check_files(getattr(args, "files", ()))
    yield from _opened(args.model, args.handler, args.config)


def _opened(path: str, handler: str | None, config: str | None) -> Iterator[Loaded]:
    """:meth:`Harness.open <handlerkit.harness.Harness.open>`, its errors telling the line that
    raised and naming an archive's files as ``MODEL/member`` (its temporary dir is gone once the
    command exits); the service is closed, and the archive's dir removed, on the way out."""
    if not os.path.exists(path):
        raise InputError(f"no such model dir or .mar: {path}")
    if os.path.isdir(path):
        problem = model_dir_problem(path, handler)
        if problem:
            raise InputError(problem)
    from handlerkit.errors import HandlerkitError
    from handlerkit.harness import Harness

    harness = None
    try:
        # Harness.open opens the model through Service.open, which unpacks an archive into a temp
        # dir it owns and, when loading fails, names the archive's files as MODEL/member.
        harness = Harness.open(path, handler, config=config)
        harness.fix_then = "run the command again"  # a terminal has no h.reload()
        # The model's name is the manifest's modelName (what TorchServe serves it as), not the path's.
        yield Loaded(harness, harness.context.model_name or os.path.basename(os.path.normpath(path)))
    except HandlerkitError as error:
        if failed_to_load(error) and getattr(error, "location", None) is None:
            error.location = load_location(error)  # type: ignore[attr-defined]
        archive = harness.service.archive if harness is not None else None
        if archive is not None:  # a stage failed in the archive's files (a load failure is named by Service.open)
            from handlerkit.archive.extract import name_archive_files

            name_archive_files(error, str(archive.path), path)
        raise
    finally:
        if harness is not None:
            harness.service.close()  # removes the archive's dir too


@contextlib.contextmanager
def loaded_batch(args: argparse.Namespace) -> Iterator[tuple[Loaded, Any]]:
    """:func:`loaded` and the batch of its request files (:func:`requests`), each named by its
    file in the harness's errors."""
    with loaded(args) as model:
        yield model, named_requests(model, args.files, args.content_type)


def open_model(path: str, handler: str | None = None) -> contextlib.AbstractContextManager[Loaded]:
    """:func:`loaded` for a path and a handler spec (``handlerkit demo``)."""
    return contextlib.contextmanager(_opened)(path, handler, None)


def named_requests(model: Loaded, files: Sequence[str], content_type: str | None = None) -> Any:
    """:func:`requests`, each request named in ``model``'s errors by its file as given on the
    command line (``bad.json``, not ``request 1``)."""
    batch = requests(files, content_type)
    model.harness.request_names.update({r.request_id: f for r, f in zip(batch, files)})
    return batch


def requests(files: Sequence[str], content_type: str | None = None) -> Any:
    """One batch, one request per file; the content type from ``content_type`` or the extension."""
    from handlerkit.worker.batches import batch
    from handlerkit.worker.requests import Request

    try:
        return batch(*(Request.from_file(f, content_type) for f in files))
    except (OSError, ValueError) as exc:
        raise InputError(str(exc)) from exc


def header(loaded: Loaded) -> str:
    """``handler image_classifier on cpu, model image_classifier``."""
    h = loaded.harness
    device = getattr(h.handler, "device", None) if h.handler is not None else None
    return f"handler {h.name} on {device or 'n/a'}, model {loaded.label}"


# --------------------------------------------------------------------------------- output
def jsonable(value: Any, _depth: int = 0) -> Any:
    """``value`` as plain JSON data: small tensors as lists, big ones (and bytes) described,
    non-finite floats as None (strict JSON has no NaN)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if _depth > 8:
        return repr(value)[:80]
    if isinstance(value, Mapping):
        return {str(k): jsonable(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v, _depth + 1) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<{len(bytes(value))} bytes>"
    size = value.numel() if callable(getattr(value, "numel", None)) else getattr(value, "size", None)
    if hasattr(value, "tolist") and isinstance(size, int) and size <= _JSON_VALUES:
        return jsonable(value.tolist(), _depth + 1)  # a small tensor or array, a numpy scalar
    if hasattr(value, "to_dict"):
        return jsonable(value.to_dict(), _depth + 1)
    if hasattr(value, "__dataclass_fields__"):
        import dataclasses

        return jsonable(dataclasses.asdict(value), _depth + 1)
    from handlerkit.summaries import describe

    return describe(value)


def failed_to_load(exc: BaseException) -> bool:
    """Whether ``exc`` is a handler that fails to load because its own code raised (a syntax
    error, an import error, a constructor that raises): the model is broken, as a weights
    mismatch is (exit code 1), not the command line (2). A spec that names nothing is usage."""
    from handlerkit.errors import HandlerLoadError

    return isinstance(exc, HandlerLoadError) and exc.__cause__ is not None


def load_location(exc: BaseException) -> tuple[str, int, str] | None:
    """``(file, line, source)`` of the code that raised while the handler loaded: the error's own
    ``location`` when it has one, else where its cause was raised (a SyntaxError where it says)."""
    location = getattr(exc, "location", None)
    if location is not None:
        return tuple(location)
    from handlerkit.recording.failures import raised_at

    return raised_at(exc.__cause__) if exc.__cause__ is not None else None


def with_location(exc: BaseException, location: tuple[str, int, str] | None) -> str:
    """The error's message, the line that raised (``at file:line: source``, as a StageError
    says it) when the message does not quote it yet, then its fix."""
    text = getattr(exc, "message", None) or str(exc)
    if location is not None and f"{location[0]}:{location[1]}" not in text:
        text += f"\n  at {location[0]}:{location[1]}: {location[2]}"
    fix = getattr(exc, "fix", None)
    return f"{text}\n  fix: {fix}" if fix else text


def one_line(exc: BaseException) -> str:
    """An error as one line: its message with the fix after it, newlines folded."""
    message = getattr(exc, "message", None) or str(exc)
    problems = getattr(exc, "problems", None)
    if problems and len(problems) > 1:
        message = "; ".join(str(p) for p in problems)
    fix = getattr(exc, "fix", None)
    text = " ".join(str(message).split())
    return f"{text} (fix: {' '.join(str(fix).split())})" if fix else text


def stage_rows_of(stages: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Stage results (a run's ``stages``) as JSON rows."""
    from handlerkit.summaries import describe

    return [
        {
            "stage": name,
            "ok": r.ok,
            "calls": r.calls,
            "wall_ms": r.wall_ms,
            "device_ms": r.device_ms,
            "output": describe(r.output),
            "error": one_line(r.error) if r.error is not None else None,
        }
        for name, r in stages.items()
    ]


def problem_rows(problems: Sequence[Any], files: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Problems as JSON rows; ``files``: the batch's request files, to name each problem's."""
    return [
        {
            "severity": p.severity,
            "check": p.check,
            "stage": p.stage,
            "request": p.request_index,
            "file": files[p.request_index] if p.request_index is not None and p.request_index < len(files) else None,
            "message": p.message,
            "fix": p.fix,
        }
        for p in problems
    ]
