"""Type checks for YAML values, and the collector of what a config parser finds.

Shared by :mod:`handlerkit.worker.config` and :mod:`handlerkit.worker.pt2`. A parser records *problems*
(values TorchServe would fail on or ignore: errors, each with its key path and, when known,
its fix) and *notes* (warnings) in one :class:`Findings`, then raises every problem at once
as a single :class:`~handlerkit.errors.ConfigError`.

Type rules follow TorchServe's Java frontend (SnakeYAML + ``ModelConfig.java``): an integer is
a YAML integer that fits in 32 bits (not ``"8"``, ``8.0`` or ``true``), a boolean is a YAML
boolean (not the quoted string ``"true"``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from handlerkit.errors import ConfigError

INT32 = (-(2**31), 2**31 - 1)

_EXPECTED = {
    "int": "an integer",
    "bool": "a boolean (true or false)",
    "str": "a string",
    "mapping": "a mapping",
    "int_list": "a list of integers",
}


class Problem(NamedTuple):
    """One value that does not validate: its key path, what is wrong, and the fix if known."""

    path: str
    text: str
    fix: str | None = None


@dataclass
class Findings:
    """Problems (errors) and notes (warnings) collected while parsing one config."""

    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def problem(self, path: str, text: str, fix: str | None = None) -> None:
        """Record an error; ``text`` names the key path itself."""
        self.problems.append(Problem(path, text, fix))

    def note(self, text: str) -> None:
        """Record a warning (without the ``handlerkit: `` prefix)."""
        self.notes.append(text)

    def check(self, value: Any, kind: str, path: str) -> bool:
        """Check one value against a kind; record a problem and return False when it is wrong.

        Kinds: ``int``, ``bool``, ``str``, ``mapping``, ``int_list``; a trailing ``?`` allows
        null; ``any`` accepts everything.
        """
        if kind == "any" or (kind.endswith("?") and value is None):
            return True
        kind = kind.rstrip("?")
        if kind not in _EXPECTED:  # pragma: no cover - a programming error in a parser's tables
            raise ValueError(f"unknown kind {kind!r}")
        if kind == "int" and is_int(value):
            if INT32[0] <= value <= INT32[1]:
                return True
            self.problem(path, f"{path} must be an integer that fits in 32 bits, got {value}")
            return False
        if kind == "int_list" and isinstance(value, list):
            results = [self.check(item, "int", f"{path}[{i}]") for i, item in enumerate(value)]
            return all(results)
        if _is_kind(value, kind):
            return True
        hint, fix = "", None
        quoted = _unquoted(value, kind)
        if quoted is not None:
            hint = f" (TorchServe ignores a quoted {'number' if kind == 'int' else 'boolean'})"
            fix = f"write {quoted} without quotes"
        self.problem(path, f"{path} must be {_EXPECTED[kind]}, got {describe(value)}{hint}", fix)
        return False

    def raise_problems(self, source: str) -> None:
        """Raise one ConfigError listing every problem (one per line), if there are any."""
        if not self.problems:
            return
        fixes = [p for p in self.problems if p.fix]
        if len(fixes) == 1:
            fix = fixes[0].fix
        else:
            fix = "; ".join(f"{p.path}: {p.fix}" for p in fixes) or None
        raise ConfigError(
            "\n".join(f"{source}: {p.text}" for p in self.problems), fix=fix, problems=[p.text for p in self.problems]
        )


def describe(value: Any) -> str:
    """A value for a message: its type and a short repr (``str 'eight'``, ``null``)."""
    if value is None:
        return "null"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def is_int(value: Any) -> bool:
    """An integer, not a bool (YAML's and JSON's integers; ``True`` is an ``int`` in Python)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_kind(value: Any, kind: str) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if kind == "mapping":
        return isinstance(value, Mapping)
    return False  # int and int_list are checked by the caller


def _unquoted(value: Any, kind: str) -> str | None:
    """The YAML to write when a string is the quoted form of a value of ``kind``, else None."""
    if not isinstance(value, str):
        return None
    text = value.strip().lower()
    if kind == "int" and text.lstrip("+-").isdigit():
        return value.strip()
    if kind == "bool" and text in ("true", "false", "yes", "no", "on", "off"):
        return "true" if text in ("true", "yes", "on") else "false"
    return None


_YAML_FIX = "indent with spaces (not tabs), put a space after each ':', and quote values that contain ': ' or start with '{', '[', '*' or '&'"


def read_yaml(path: str | os.PathLike[str], *, what: str, missing_fix: str) -> Any:
    """``yaml.safe_load`` of a config file, every way it can fail a :class:`ConfigError`.

    Args:
        path: the file.
        what: what the file is, for messages (``"model config"``, ``"metrics config"``).
        missing_fix: the fix when the file does not exist.
    """
    import yaml  # lazily: keeps `import handlerkit` fast

    source = os.fspath(path)
    try:
        with open(source, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError as exc:
        raise ConfigError(f"{source}: no such {what} (looked in {os.path.abspath(source)})", fix=missing_fix) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"{source}: the {what} cannot be read: {exc}", fix="make it a readable UTF-8 text file"
        ) from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = " ".join(p for p in (getattr(exc, "context", None), getattr(exc, "problem", None)) if p)
        near = f" near line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(
            f"{source}{where}: not valid YAML: {problem or str(exc).splitlines()[0]}",
            fix=f"check the YAML{near}: {_YAML_FIX}",
        ) from exc
