"""``handlerkit inspect PATH``: what is in a ``.mar`` or a model dir, and whether TorchServe can load it.

The manifest, the files, the model config (validated by :mod:`handlerkit.worker.config`), the handler
the manifest names, resolved as TorchServe's loader would (:func:`handlerkit.worker.loading.resolve_handler`:
its module imported and its class built, ``initialize`` not run), and the model's format
(:func:`handlerkit.formats.detect_format`). What would stop TorchServe from loading it is a
problem: exit code 1.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from handlerkit._render import Rendered, Table
from handlerkit.cli._common import FAILED, OK, InputError, Outcome, jsonable, model_dir_problem

HELP = "show a .mar or model dir: manifest, config, handler, format"
DESCRIPTION = (
    "Show the manifest, files and model config of PATH (a .mar, a .tar.gz or a model dir), resolve "
    "its handler as TorchServe's loader would (the module imported and the class built; "
    "initialize is not run, so no weights are loaded) and name the model's format. Exit code 1 "
    "when something would stop TorchServe from loading it."
)
_LISTED = 50  # files listed in the text output (all of them in --json)


@dataclass(repr=False)
class InspectReport(Rendered):
    """What :func:`inspect_path` found.

    Attributes:
        path / kind: what was inspected: ``"mar"``, ``"tgz"`` or ``"dir"``.
        manifest: MAR-INF/MANIFEST.json (or the manifest inferred for a dir without one).
        inferred: for an inferred manifest, each key and why.
        files: ``{"name", "bytes"}`` per file (``"compressed"`` and ``"method"`` too in a ``.mar``).
        config: the model config's source, server keys, ``pt2`` decision, handler keys.
        handler: the resolved handler: ``spec``, ``kind``, ``name``, ``origin``, ``file``.
        model: ``format``, ``serializedFile``, ``modelFile``.
        problems: ``{"what", "message", "fix"}`` for each thing TorchServe would fail on.
        notes: warnings met on the way (config typos, inferred keys...).
    """

    path: str
    kind: str
    manifest: dict[str, Any] = field(default_factory=dict)
    inferred: dict[str, str] = field(default_factory=dict)
    files: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    handler: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    problems: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {**jsonable(asdict(self)), "ok": self.ok}

    def _summary(self) -> str:
        model = self.manifest.get("model", {})
        name = f"{model.get('modelName', '?')} {model.get('modelVersion', '')}".strip()
        handler = self.handler.get("name") or model.get("handler") or "no handler"
        fmt = self.model.get("format") or "unknown format"
        verdict = "loads" if self.ok else f"{len(self.problems)} problem(s)"
        return f"{os.path.basename(self.path)} ({self.kind}): model {name}, handler {handler}, {fmt}: {verdict}"

    def _tables(self) -> list[Table]:
        kv = ("", "")
        manifest = [[key, value] for key, value in _flat(self.manifest)]
        manifest += [[f"{key} (inferred)", why] for key, why in self.inferred.items()]
        zipped = any("compressed" in f for f in self.files)
        file_rows = [
            [f["name"], f["bytes"], *([f["compressed"], f["method"]] if zipped else [])] for f in self.files[:_LISTED]
        ]
        if len(self.files) > _LISTED:
            file_rows.append([f"... {len(self.files) - _LISTED} more", None, *([None, None] if zipped else [])])
        file_headers = ("file", "bytes", *(("stored bytes", "method") if zipped else ()))
        return [
            Table(kv, manifest, "manifest"),
            Table(file_headers, file_rows, "files"),
            Table(kv, [[k, v] for k, v in _flat(self.config)], "model config"),
            Table(kv, [[k, v] for k, v in self.handler.items() if v is not None], "handler"),
            Table(kv, [[k, v] for k, v in self.model.items() if v is not None], "model"),
            Table(("what", "problem", "fix"), [[p["what"], p["message"], p["fix"]] for p in self.problems], "problems"),
        ]

    def _notes(self) -> list[str]:
        return list(self.notes)


def _flat(mapping: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = []
    for key, value in mapping.items():
        if isinstance(value, dict) and value:
            rows += _flat(value, f"{prefix}{key}.")
        else:
            rows.append((f"{prefix}{key}", value))
    return rows


def add_parser(commands: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("inspect", help=HELP, description=DESCRIPTION, parents=parents)
    parser.add_argument("path", metavar="PATH", help="a .mar, a .tar.gz (tgz archive) or a model dir")
    parser.set_defaults(command=command)


def command(args: argparse.Namespace) -> Outcome:
    report = inspect_path(args.path)
    return Outcome(OK if report.ok else FAILED, str(report), report.to_dict())


def inspect_path(path: str) -> InspectReport:
    """Inspect a ``.mar``, a ``.tar.gz`` or a model dir (see the module docstring).

    Raises:
        InputError: no such path, a dir that is no model dir, a file that is no archive.
        HandlerkitError: an archive refused (:class:`handlerkit.archive.ArchiveError`) or a
            malformed manifest.
    """
    report = InspectReport(path=path, kind="dir")
    with warnings.catch_warnings(record=True) as caught, _directory(path) as directory:
        warnings.simplefilter("always")
        from handlerkit.archive import inspect_archive

        listing = inspect_archive(path)  # the files as stored (an archive refused raised above)
        report.kind = {"zip": "mar"}.get(listing.format, listing.format)
        report.files = [
            {
                "name": f.name,
                "bytes": f.size,
                **({"compressed": f.compressed_size, "method": f.compression} if f.compressed_size is not None else {}),
            }
            for f in listing.files
        ]
        report.manifest, report.inferred = listing.manifest or {"model": {}}, dict(listing.inferred)
        if report.inferred:
            report.notes.append(
                "no MAR-INF/MANIFEST.json: the manifest was inferred from the files (see "
                "'(inferred)' above); archive it with handlerkit archive to fix it"
            )
        config = _config(report, directory, report.manifest["model"])
        _handler(report, directory, report.manifest["model"])
        _model(report, directory, report.manifest["model"], config)
    from handlerkit.errors import HandlerkitWarning

    for w in caught:
        if issubclass(w.category, HandlerkitWarning):
            report.notes.append(" ".join(str(w.message).removeprefix("handlerkit: ").split()))
        else:  # not about the model: shown as usual
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return report


@contextlib.contextmanager
def _directory(path: str) -> Iterator[str]:
    """The model dir to inspect: ``path``, or an archive unpacked (safely) into a temporary dir
    removed on exit. Nothing is loaded: a broken config or handler is a finding, not an error."""
    if not os.path.exists(path):
        raise InputError(f"no such model dir or .mar: {path}")
    if os.path.isdir(path):
        problem = model_dir_problem(path)
        if problem:
            raise InputError(problem)
        yield path
        return
    from handlerkit.archive import open_temporary  # refuses what is no archive, or an unsafe one

    with open_temporary(path) as extracted:
        yield os.fspath(extracted.path)


def _problem(report: InspectReport, what: str, exc: BaseException) -> None:
    report.problems.append(
        {"what": what, "message": " ".join(str(getattr(exc, "message", exc)).split()), "fix": getattr(exc, "fix", None)}
    )


def _config(report: InspectReport, directory: str, model: dict[str, Any]) -> Any:
    """The model config the manifest names, validated; None when there is none or it is broken."""
    from handlerkit.errors import HandlerkitError
    from handlerkit.worker.config import load_config

    name = model.get("configFile")
    if not name:
        report.config = {"source": "none (the manifest names no configFile)"}
        return None
    try:
        config = load_config(os.path.join(directory, name))
    except HandlerkitError as exc:
        report.config = {"source": name}
        _problem(report, "config", exc)
        return None
    report.config = {"source": name, **config.server, "pt2": config.pt2.reason or config.pt2.schema}
    if config.handler:
        report.config["handler keys"] = ", ".join(sorted(config.handler))
    return config


def _handler(report: InspectReport, directory: str, model: dict[str, Any]) -> None:
    from handlerkit.errors import HandlerkitError
    from handlerkit.worker.loading import resolve_handler

    spec = model.get("handler")
    report.handler = {"spec": spec}
    if not spec:
        report.problems.append(
            {
                "what": "handler",
                "message": "the manifest names no handler",
                "fix": "archive with --handler (a built-in name such as image_classifier, or a .py)",
            }
        )
        return
    try:
        resolved = resolve_handler(spec, directory)
    except (HandlerkitError, ImportError, ValueError) as exc:
        _problem(report, "handler", exc)
        return
    name = resolved.cls.__name__ if resolved.cls is not None else resolved.function_name
    module_file = resolved.module_file
    if module_file and os.path.commonpath(
        [os.path.realpath(module_file), os.path.realpath(directory)]
    ) == os.path.realpath(directory):
        module_file = os.path.relpath(module_file, directory)  # not the temporary dir a .mar went to
    report.handler.update(
        kind=resolved.kind, name=name, module=resolved.module.__name__, file=module_file, origin=resolved.origin
    )


def _model(report: InspectReport, directory: str, model: dict[str, Any], config: Any) -> None:
    from handlerkit.errors import HandlerkitError
    from handlerkit.formats import detect_format

    serialized, model_file = model.get("serializedFile"), model.get("modelFile")
    report.model = {"serializedFile": serialized, "modelFile": model_file}
    for role, name in (("serializedFile", serialized), ("modelFile", model_file)):
        if name and not os.path.isfile(os.path.join(directory, name)):
            report.problems.append(
                {
                    "what": "model",
                    "message": f"the manifest's {role} {name!r} is missing",
                    "fix": "archive the file, or correct MAR-INF/MANIFEST.json",
                }
            )
            return
    aot = bool(config is not None and config.pt2.aot_compile)
    try:
        report.model["format"] = detect_format(
            os.path.join(directory, serialized) if serialized else None, model_file, aot_compile=aot
        )
    except HandlerkitError as exc:
        custom = report.handler.get("origin") in ("model_dir", "file")
        if custom and not (serialized or model_file):
            report.model["format"] = "none (the handler loads its own model)"
        else:
            _problem(report, "model", exc)
