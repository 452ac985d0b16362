"""``handlerkit new NAME --kind image|text|tabular``: a handler of your own, working from the start.

Writes ``NAME/`` (in the working directory, or in ``-o DIR``):

- ``model/``, the model dir TorchServe loads: ``handler.py`` (a
  :class:`~handlerkit.handlers.BaseHandler` subclass with its own ``preprocess``, which answers
  a request it cannot read alone with ``self.refuse``, and ``postprocess``), ``model.py`` and its weights
  ``model.pt``, ``index_to_name.json``, ``model-config.yaml``, and the ``MAR-INF/MANIFEST.json``
  that ``handlerkit manifest`` writes (:func:`handlerkit.cli.manifest.write_manifest`);
- ``requests/``, sample requests; ``test_handler.py``, tests with handlerkit's pytest plugin
  (``pytest.ini`` names the model dir); ``NAME.ipynb``, a notebook stepping through the stages;
- ``make_weights.py``, which wrote ``model.pt`` from code (seeded; nothing is downloaded).

Its tests pass, its notebook runs, and ``handlerkit run``, ``check`` and ``archive`` work on
``NAME/model`` as soon as it is written. The tests and the notebook sit beside the model dir, not
in it: a dir with a manifest is packed whole by ``handlerkit archive`` (an unpacked ``.mar``,
:mod:`handlerkit.archive.pack`), and an archive should hold what the server needs.

The templates ship in the package (``handlerkit/assets/new/``: ``common/`` for every kind, one
folder per kind); ``{{name}}``, ``{{what}}``, ``{{requests}}`` and ``{{labels}}`` in them are
filled in, ``notebook.ipynb`` becomes ``NAME.ipynb`` and ``gitignore`` ``.gitignore``.
Everything is written in a hidden folder beside ``NAME/`` and renamed at the end, so a failure
leaves nothing behind.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from handlerkit.cli._common import OK, InputError, Outcome


@dataclass(frozen=True)
class Kind:
    """A kind of handler ``new`` writes: what it is, and its sample requests with the label
    its model gives each (the tests and the notebook assert them)."""

    what: str
    requests: tuple[tuple[str, str], ...]

    @property
    def described(self) -> str:
        """``what`` inside a sentence."""
        return self.what[0].lower() + self.what[1:]


KINDS = {
    "image": Kind(
        "An image classifier: an image in (PNG, JPEG...), its colour out (red, green or blue)",
        (("requests/red.png", "red"), ("requests/blue.png", "blue")),
    ),
    "text": Kind(
        "A text classifier: text in, its sentiment out (positive or negative)",
        (("requests/positive.txt", "positive"), ("requests/negative.txt", "negative")),
    ),
    "tabular": Kind(
        'A tabular classifier: a JSON body {"features": [4 numbers]} in, the iris species out '
        "(setosa, versicolor or virginica)",
        (("requests/setosa.json", "setosa"), ("requests/virginica.json", "virginica")),
    ),
}
MODEL_DIR = "model"
_PLACEHOLDER = re.compile(r"\{\{[a-z_]+\}\}")  # {{name}}; an f-string's {{"features": ...}} is none
#: What each file is, for the listing (the notebook is ``NAME.ipynb``).
ROLES = {
    "model/": "the model dir: what TorchServe loads, what handlerkit archive packs",
    "model/MAR-INF/MANIFEST.json": "its manifest (handlerkit manifest model --force rewrites it)",
    "model/handler.py": "the handler: preprocess, inference, postprocess",
    "model/model.py": "the model class",
    "model/model.pt": "the model's weights, from make_weights.py",
    "model/index_to_name.json": "the labels of the model's outputs",
    "model/model-config.yaml": "TorchServe's model config: batch size, workers, timeouts",
    "model/vocab.txt": "the vocabulary: line i is token id i",
    "requests/": "sample requests",
    "test_handler.py": "its tests: run pytest here (handlerkit's pytest plugin)",
    "pytest.ini": "names the model dir for the plugin",
    ".ipynb": "a notebook stepping through the stages",
    "make_weights.py": "wrote model/model.pt: put your training here",
    ".gitignore": "what git leaves out",
}
HELP = "write a handler of your own: a model dir, its tests and a notebook"
DESCRIPTION = (
    "Write NAME/: the model dir NAME/model (handler.py, model.py, model.pt, index_to_name.json, "
    "model-config.yaml, MAR-INF/MANIFEST.json), sample requests, tests with handlerkit's pytest plugin "
    "and a notebook. It works at once: pytest passes, and handlerkit run, check and archive take "
    "NAME/model. The weights are made by NAME/make_weights.py (no download). Kinds: "
    + "; ".join(f"{name}: {kind.described}" for name, kind in KINDS.items())
    + "."
)


def add_parser(commands: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("new", help=HELP, description=DESCRIPTION, parents=parents)
    parser.add_argument("name", metavar="NAME", help="the model's name, and the folder's")
    parser.add_argument("--kind", choices=tuple(KINDS), default="image", help="what it takes in (default: image)")
    parser.add_argument(
        "-o", "--output-dir", metavar="DIR", default=".", help="where NAME/ is written (default: the working directory)"
    )
    parser.set_defaults(command=command)


def templates() -> Path:
    """The folder of the templates (inside the package)."""
    return Path(str(resources.files("handlerkit") / "assets" / "new"))


def create(name: str, kind: str = "image", output_dir: str | os.PathLike[str] = ".") -> Path:
    """Write the project ``output_dir/name`` of ``kind`` (see the module docstring); returns its path.

    Raises:
        InputError: a name TorchServe does not accept, an unknown kind, or a path that exists.
    """
    from handlerkit.archive import ArchiveError
    from handlerkit.archive.manifest import check_model_name
    from handlerkit.cli.manifest import write_manifest

    try:
        check_model_name(name)
    except ArchiveError as exc:
        raise InputError(
            f"{exc.message}; give NAME letters, digits, '_', '-' and '.', a letter or digit first"
        ) from None
    if kind not in KINDS:
        raise InputError(f"unknown kind {kind!r}: the kinds are {', '.join(KINDS)}")
    parent = Path(output_dir)
    target = parent / name
    if os.path.lexists(target):
        raise InputError(f"{target} exists: choose another NAME or -o DIR, or move it away")
    parent.mkdir(parents=True, exist_ok=True)
    staging = parent / f".{name}.{uuid.uuid4().hex[:8]}"  # made by mkdir, so the umask applies
    staging.mkdir()
    try:
        values = _values(name, KINDS[kind])
        for folder in (templates() / "common", templates() / kind):
            _copy(folder, staging, values)
        (staging / "notebook.ipynb").rename(staging / f"{name}.ipynb")
        (staging / "gitignore").rename(staging / ".gitignore")  # a dotfile would not ship in the wheel
        _make_weights(staging)
        write_manifest(staging / MODEL_DIR, model_name=name)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _values(name: str, kind: Kind) -> dict[str, str]:
    paths, labels = zip(*kind.requests)
    return {"name": name, "what": kind.what, "requests": json.dumps(list(paths)), "labels": json.dumps(list(labels))}


def _copy(folder: Path, to: Path, values: dict[str, str]) -> None:
    """``folder``'s files into ``to``, with ``{{key}}`` filled in in the text files."""
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for file in files:
            source = Path(root, file)
            destination = to / source.relative_to(folder)
            destination.parent.mkdir(parents=True, exist_ok=True)
            if source.suffix in (".py", ".ipynb", ".yaml", ".ini"):
                destination.write_text(_fill(source.read_text(encoding="utf-8"), values, source), encoding="utf-8")
            else:
                shutil.copyfile(source, destination)


def _fill(text: str, values: dict[str, str], source: Path) -> str:
    """``{{key}}`` replaced by its value (escaped as a JSON string's content in a notebook)."""
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", json.dumps(value)[1:-1] if source.suffix == ".ipynb" else value)
    left = _PLACEHOLDER.search(text)
    if left:  # a template naming a value nobody gives: handlerkit's bug, not the user's
        raise RuntimeError(f"{source} holds the placeholder {left.group()} and no value is given for it")
    return text


def _make_weights(project: Path) -> None:
    """Run the project's ``make_weights.py`` on its model dir, loaded from its file."""
    spec = importlib.util.spec_from_file_location("make_weights", project / "make_weights.py")
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {project / 'make_weights.py'}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(project / MODEL_DIR)


def listing(project: Path) -> list[tuple[str, str]]:
    """``(file, what it is)`` for what ``new`` wrote; the sample requests as one row."""
    rows: list[tuple[str, str]] = []
    for path in sorted(project.rglob("*")):
        rel = path.relative_to(project).as_posix()
        if "__pycache__" in path.parts or rel.startswith("requests/"):
            continue
        if rel == "requests":
            names = ", ".join(sorted(p.name for p in path.iterdir()))
            rows.append(("requests/", f"{ROLES['requests/']}: {names}"))
        elif path.is_dir():
            if f"{rel}/" in ROLES:
                rows.append((f"{rel}/", ROLES[f"{rel}/"]))
        else:
            rows.append((rel, ROLES.get(rel) or ROLES.get(path.suffix, "")))
    return rows


def command(args: argparse.Namespace) -> Outcome:
    from handlerkit._text import render_text

    project = create(args.name, args.kind, args.output_dir)
    kind = KINDS[args.kind]
    relative = os.path.relpath(project)
    shown = str(project) if relative.startswith("..") else relative
    steps = [
        f"cd {shlex.quote(shown)}",
        "python -m pytest",
        f"handlerkit run {MODEL_DIR} " + " ".join(path for path, _ in kind.requests),
        f"handlerkit check {MODEL_DIR} " + " ".join(path for path, _ in kind.requests),
        f"handlerkit archive {MODEL_DIR} -o model_store",
    ]
    rows = listing(project)
    text = (
        f"wrote {shown}/: {kind.described}\n"
        + render_text(["file", "what it is"], [list(row) for row in rows])
        + "\nnext:\n"
        + "\n".join(f"  {step}" for step in steps)
    )
    data = {
        "path": str(project),
        "kind": args.kind,
        "model_dir": str(project / MODEL_DIR),
        "files": [{"name": name, "what": what} for name, what in rows],
        "requests": [path for path, _ in kind.requests],
        "next": steps,
    }
    return Outcome(OK, text, data)
