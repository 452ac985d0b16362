"""The ``handlerkit`` command: every harness feature from a terminal or a CI script.

``handlerkit demo`` runs the built-in image classifier on the bundled shapes model, stage by
stage; ``new`` writes a handler of your own (a model dir, its tests, a notebook). ``run``,
``check``, ``time``, ``compile`` and ``formats`` take ``MODEL FILES...`` (a model dir or a ``.mar``; one
request per file), ``manifest`` writes a model dir's manifest, ``archive`` builds a ``.mar`` and
``inspect`` says what is in one; ``check --protocol v2 URL`` checks a running server against the
Open Inference Protocol v2 instead. One module per subcommand; each defines ``add_parser`` and a
``command`` returning an :class:`~handlerkit.cli._common.Outcome`. Their heavy imports (torch,
the harness) happen inside ``command``, so ``handlerkit --help`` imports only the standard
library and stays fast.

Every subcommand takes ``--json`` (one JSON document on stdout and nothing else: what a handler
prints goes to stderr) and ``--no-progress``. Exit codes: 0 success; 1 a handler failed (a
stage raised, or its code raised while loading: a syntax or import error, a failing
constructor) or a check found a problem; 2 a usage or input error (one line on stderr, no
traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from handlerkit._text import suggestion
from handlerkit.cli._common import (
    FAILED,
    USAGE,
    InputError,
    Outcome,
    failed_to_load,
    jsonable,
    load_location,
    one_line,
    output_options,
    with_location,
)
from handlerkit.cli.demo import demo_paths

__all__ = ["demo_paths", "main"]

#: The subcommands, in the order ``--help`` lists them, and their modules (``time`` is in
#: ``timing.py``: a ``time`` attribute on this package would read like the standard module).
_COMMANDS = {
    "demo": "demo",
    "new": "new",
    "run": "run",
    "check": "check",
    "time": "timing",
    "compile": "compile",
    "formats": "formats",
    "manifest": "manifest",
    "archive": "archive",
    "inspect": "inspect",
    "serve": "serve",
}
_INTERRUPTED = 130  # what a shell reports for Ctrl-C


class _Parser(argparse.ArgumentParser):
    """argparse with its usage errors on one line (argparse prints the usage block first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE, f"handlerkit: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``handlerkit`` parser with every subcommand."""
    parser = _Parser(
        prog="handlerkit",
        description="Develop, debug and ship TorchServe-style model handlers, one stage at a time.",
        epilog="Exit codes: 0 ok; 1 a handler failed (to load, or in a stage) or a check found a problem; "
        "2 a usage or input error.",
    )
    parser.add_argument("--version", action="version", version=f"handlerkit {_version()}")
    commands = parser.add_subparsers(dest="name", metavar="COMMAND", parser_class=_Parser)
    parents = [output_options()]
    for module in _COMMANDS.values():
        importlib.import_module(f"handlerkit.cli.{module}").add_parser(commands, parents)
    parser.set_defaults(subparsers=commands.choices)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``handlerkit`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        _refuse_unknown_command(parser, argv)
        argv = _optional_values_last(parser, argv)
        args, extra = parser.parse_known_args(argv)
        if extra:
            _refuse_extra(args, extra, parser)
    except SystemExit as exc:  # --help, --version, and usage errors (already printed)
        return exc.code if isinstance(exc.code, int) else USAGE
    if getattr(args, "command", None) is None:
        parser.print_help()
        return USAGE
    stdout = sys.stdout
    with _one_line_warnings():
        try:
            # Under --json, stdout carries the document alone: what the handler prints goes to stderr.
            with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
                outcome = args.command(args)
        except KeyboardInterrupt:
            print("handlerkit: interrupted", file=sys.stderr)
            return _INTERRUPTED
        except Exception as exc:
            outcome = _failure(exc)
            if outcome is None:
                raise  # a bug in handlerkit: the traceback is what a report needs
            print(f"handlerkit: error: {outcome.text}", file=sys.stderr)
            if args.json:
                print(json.dumps(outcome.data, indent=2), file=stdout)
            return outcome.code
    if args.json:
        print(json.dumps(jsonable({**outcome.data, "exit_code": outcome.code}), indent=2), file=stdout)
    else:
        print(outcome.text, file=stdout)
    return outcome.code


def _failure(exc: Exception) -> Outcome | None:
    """The exit code and line for an error a user can meet; None for anything else (a bug)."""
    from handlerkit.errors import HandlerkitError, StageError

    location = None
    if isinstance(exc, StageError):  # the handler ran and raised: a failed run, not bad input
        code, text, location = FAILED, str(exc), exc.location
    elif failed_to_load(exc):  # the handler's own code raised while loading: a check failed too
        location = load_location(exc)
        code, text = FAILED, with_location(exc, location)
    elif isinstance(exc, (InputError, HandlerkitError, OSError)):  # a bad path, archive, manifest, config, spec
        code, text = USAGE, one_line(exc)
    else:
        return None
    error: dict[str, Any] = {
        "type": type(exc).__name__,
        "message": getattr(exc, "message", None) or str(exc),
        "fix": getattr(exc, "fix", None),
    }
    if isinstance(exc, StageError):
        error.update(stage=exc.stage, request=exc.request_index)
    if location is not None:
        error["location"] = {"file": location[0], "line": location[1], "source": location[2]}
    return Outcome(code, text, {"error": error, "exit_code": code})


def _refuse_unknown_command(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """``handlerkit chek``: one line naming the commands, with the likeliest one."""
    if not argv or argv[0].startswith("-"):
        return
    names = list(_COMMANDS)
    if argv[0] not in names:
        parser.error(
            f"unknown command {argv[0]!r}{suggestion(argv[0], names, prefix=True)}; the commands are {', '.join(names)}"
        )


def _optional_values_last(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """An option whose value is optional (``--sweep [SIZES]``) takes the next word whatever it
    is: ``handlerkit time --sweep MODEL FILE`` would read MODEL as SIZES. Where the next word is
    no value of the option (its type refuses it), the option moves to the end of the line, where
    it takes its default, and MODEL stays MODEL. Only a word that names a file or a directory moves
    it: ``--sweep 0,2`` still fails on its value, ``--sweep=SIZES`` and ``--sweep 1,2`` are kept."""
    command = (parser.get_default("subparsers") or {}).get(argv[0]) if argv else None
    if command is None:
        return argv
    optional = {
        option: action
        for action in command._actions
        if action.nargs == "?" and callable(action.type)
        for option in action.option_strings
    }
    out = list(argv)
    for i, word in enumerate(argv[:-1]):
        action = optional.get(word)
        following = argv[i + 1]
        if action is None or following.startswith("-") or not os.path.exists(following):
            continue
        try:
            action.type(following)
        except (argparse.ArgumentTypeError, TypeError, ValueError):
            out.remove(word)
            out.append(word)
    return out


def _refuse_extra(args: argparse.Namespace, extra: Sequence[str], parser: argparse.ArgumentParser) -> NoReturn:
    """Unknown arguments, reported by the subcommand they were given to, with the likeliest option."""
    command: argparse.ArgumentParser = args.subparsers.get(args.name, parser) if args.name else parser
    options = [o for action in command._actions for o in action.option_strings]  # argparse has no public list
    unknown = next((e.partition("=")[0] for e in extra if e.startswith("--")), None)
    hint = suggestion(unknown, options, prefix=True) if unknown else ""
    command.error(f"unrecognized arguments: {' '.join(extra)}{hint}")


@contextlib.contextmanager
def _one_line_warnings() -> Iterator[None]:
    """Warnings shown as ``handlerkit: warning: ...`` lines rather than Python's two-line form
    with the source line; restored on exit (``main`` may run inside a notebook or a test)."""
    original = warnings.formatwarning

    def formatted(message: Any, category: type[Warning], filename: str, lineno: int, line: str | None = None) -> str:
        text = " ".join(str(message).split())
        if text.startswith("handlerkit: "):
            return f"handlerkit: warning: {text[len('handlerkit: ') :]}\n"
        return f"handlerkit: warning: {category.__name__}: {text} ({filename}:{lineno})\n"

    warnings.formatwarning = formatted
    try:
        yield
    finally:
        warnings.formatwarning = original


def _version() -> str:
    from handlerkit import __version__

    return __version__
