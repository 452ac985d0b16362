"""Which modules of a model dir its Python files import, found by reading their source.

TorchServe's worker runs in the model dir with the dir first on ``sys.path``, so a handler's
``import labels`` or ``from shapes_utils import resize`` finds ``labels.py`` or the package
``shapes_utils/`` there before anything installed. :func:`local_imports` follows those imports
from a set of files, transitively, by an AST scan: nothing is imported or run. It sees
``import x.y``, ``from x import y`` (inside functions too) and ``importlib.import_module("x")``
/ ``__import__("x")`` with a literal name; relative imports stay inside their package, which
is found whole. A name that resolves to nothing in the dir is an installed package (or a
mistake the worker will report), and is not followed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

__all__ = ["imported_names", "local_imports", "resolve"]

_DYNAMIC = {"import_module", "__import__"}  # importlib.import_module("x"), __import__("x")
_SKIPPED_DIRS = {"__pycache__", "__MACOSX"}


def imported_names(source: str, filename: str = "<source>") -> set[str]:
    """The top-level names ``source`` imports absolutely: ``import a.b`` and ``from a.b import c`` give ``a``.

    Raises:
        SyntaxError: ``source`` is not Python.
    """
    names: set[str] = set()
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and _called(node.func) in _DYNAMIC and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and not first.value.startswith("."):
                names.add(first.value.split(".")[0])
    return names


def _called(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def resolve(root: Path, name: str) -> Path | None:
    """What ``import name`` finds in ``root``: ``name.py``, the package folder ``name/``, or an
    extension module (``name.so``, ``name.cpython-311-x86_64-linux-gnu.so``); else None."""
    module = root / f"{name}.py"
    if module.is_file():
        return module
    package = root / name
    if package.is_dir() and any(_python_files(package)):  # a regular or a namespace package
        return package
    for suffix in ("so", "pyd"):
        found = sorted(root.glob(f"{name}.*{suffix}"))
        if found and found[0].is_file() and found[0].name.split(".")[0] == name:
            return found[0]
    return None


def _python_files(folder: Path) -> Iterator[Path]:
    """The ``.py`` files of a package, as the archiver sweeps folders (no caches, no dot-folders)."""
    for path in sorted(folder.iterdir()):
        if path.is_dir():
            if path.name not in _SKIPPED_DIRS and not path.name.startswith("."):
                yield from _python_files(path)
        elif path.suffix == ".py":
            yield path


def local_imports(root: Path, files: Iterable[tuple[str, Path]]) -> tuple[dict[Path, str], list[str]]:
    """The modules and packages of ``root`` that ``files`` import, directly or through each other.

    Args:
        root: the model dir.
        files: (name shown to the user, path) of the Python files to start from.

    Returns:
        ``{module file or package folder: the name of the first file found importing it}``,
        and a note for each file that could not be read as Python (it is not followed).
    """
    found: dict[Path, str] = {}
    notes: list[str] = []
    seen: set[Path] = set()
    queue = [(shown, path) for shown, path in files if path.suffix == ".py"]
    while queue:
        shown, path = queue.pop(0)
        if path.resolve() in seen:
            continue
        seen.add(path.resolve())
        try:
            names = imported_names(path.read_text(encoding="utf-8"), str(path))
        except (SyntaxError, UnicodeDecodeError, OSError) as exc:
            where = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) and exc.lineno else ""
            notes.append(f"{shown} was not scanned for local imports: {type(exc).__name__}{where}")
            continue
        for name in sorted(names):
            target = resolve(root, name)
            if target is None or target in found or target.resolve() == path.resolve():
                continue
            found[target] = shown
            if target.is_dir():
                queue += [(p.relative_to(root).as_posix(), p) for p in _python_files(target)]
            elif target.suffix == ".py":
                queue.append((target.name, target))
    return found, notes
