"""A saved model's refusal of an input size, named: the file, the input, the dimension, and
the command that re-exports it with that dimension dynamic.

Each runtime says it its own way: ONNX Runtime ``Got invalid dimensions for input: item_ids
... index: 1 Got: 2 Expected: 7`` (an ``InvalidArgument``), ``torch.export``'s module
``Guard failed: item_ids.size()[1] == 7`` (an ``AssertionError``), AOTInductor with
``AOTI_RUNTIME_CHECK_INPUTS=1`` ``input_handles[1]: unmatched dim value at 1, expected: 7, but
got: 2`` (a ``RuntimeError``). :func:`shape_refusal` reads all three into one
:class:`ArtifactShapeError`, naming every dimension the call misses when the file's fixed sizes
are known (a runtime names only the first it checks), and the loaders of
:mod:`handlerkit.formats.load` raise it where the model is called.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any

from handlerkit.errors import HandlerkitError

__all__ = ["AOTI_NAMES", "ArtifactShapeError", "ShapeChecked", "checked_forward", "fixed_sizes", "shape_refusal"]

#: The AOTInductor package metadata key holding the inputs' names (its own errors say input_handles[1]).
AOTI_NAMES = "handlerkit.input_names"


class ArtifactShapeError(HandlerkitError, RuntimeError):
    """A saved model refused an input's size because it was exported for another.

    A ``RuntimeError`` too, as the refusals of ``torch.export`` and AOTInductor it replaces were
    caught as such. ``fix`` says how to re-export the model with those dimensions dynamic.

    Attributes:
        artifact: the model file's name (``model.onnx``).
        input / dim / expected / got: the first dimension refused: the input's name
            (``forward``'s parameter; ``input 1`` when unknown), the dimension's index (0 is
            the batch), what the file takes (``"= 7"``, ``"<= 1024"``), the size the call gave
            (None when unknown).
        refused: every dimension refused that is known, as ``(input, dim, expected, got)``.
    """

    def __init__(self, message: str, *, fix: str, artifact: str, refused: list[tuple[str, int, str, int | None]]):
        super().__init__(message, fix=fix)
        self.artifact = artifact
        self.refused = refused
        self.input, self.dim, self.expected, self.got = refused[0]


_OPS = {"==": "=", "<=": "<=", ">=": ">=", "<": "<", ">": ">"}
_FLIPPED = {"<=": ">=", ">=": "<=", "<": ">", ">": "<", "==": "=="}
# What each runtime says when a dimension does not fit (ONNX Runtime's InvalidArgument,
# torch.export's guard, AOTInductor's input check with AOTI_RUNTIME_CHECK_INPUTS=1).
_REFUSALS = (
    re.compile(
        r"Got invalid dimensions for input: (?P<name>\S+) for the following indices\s+"
        r"index: (?P<dim>\d+) Got: (?P<got>\d+) Expected: (?P<expected>\d+)"
    ),
    re.compile(r"Guard failed: (?P<name>\w+)\.size\(\)\[(?P<dim>\d+)\] (?P<op>==|<=|>=|<|>) (?P<expected>\d+)\s*$"),
    re.compile(r"Guard failed: (?P<expected>\d+) (?P<rop>==|<=|>=|<|>) (?P<name>\w+)\.size\(\)\[(?P<dim>\d+)\]\s*$"),
    re.compile(
        r"input_handles\[(?P<index>\d+)\]: unmatched dim value at (?P<dim>\d+), expected: (?P<expected>\d+), "
        r"but got: (?P<got>\d+)"
    ),
    re.compile(
        r"input_handles\[(?P<index>\d+)\]: dim value is too (?:large|small) at (?P<dim>\d+), expected to be "
        r"(?P<op><=|>=) (?P<expected>\d+), but got: (?P<got>\d+)"
    ),
)
#: The lab format that re-exports a loaded format (the legacy .so is re-saved as a .pt2 package).
_LAB_FORMAT = {"onnx": "onnx", "export": "export", "aoti": "aoti", "aoti-so": "aoti"}


def shape_refusal(
    exc: BaseException,
    path: str | None,
    fmt: str,
    names: list[str] | None,
    inputs: tuple = (),
    fixed: list[dict[int, int]] | None = None,
) -> ArtifactShapeError | None:
    """The :class:`ArtifactShapeError` for ``exc`` when it is a runtime's refusal of an input
    size (else None): the file ``path`` of format ``fmt`` (one of :data:`FORMATS`), its inputs'
    ``names`` (by position; None when unknown), the ``inputs`` of the call that failed, and
    the sizes the file fixes (per input, dim -> size; None when unknown), so that every
    dimension refused is named, not only the first the runtime checked."""
    text = str(exc)
    for pattern in _REFUSALS:
        found = pattern.search(text)
        if found is not None:
            break
    else:
        return None
    parts = found.groupdict()
    dim = int(parts["dim"])
    names = list(names or [])
    index: int | None
    if parts.get("index") is not None:
        position = int(parts["index"])
        index, name = position, names[position] if position < len(names) else f"input {position}"
    else:
        name = parts["name"]
        index = names.index(name) if name in names else None
    op = _FLIPPED[parts["rop"]] if parts.get("rop") else parts.get("op") or "=="
    got = int(parts["got"]) if parts.get("got") else _size(inputs, index, dim)
    refused = [(name, dim, f"{_OPS[op]} {parts['expected']}", got)]
    for i, sizes in enumerate(fixed or []):
        for d, size in sizes.items():
            actual = _size(inputs, i, d)
            key = names[i] if i < len(names) else f"input {i}"
            if actual is not None and actual != size and (key, d) != (name, dim):
                refused.append((key, d, f"= {size}", actual))
    order = {n: i for i, n in enumerate(names)}
    refused.sort(key=lambda r: (order.get(r[0], len(names)), r[1]))
    artifact = os.path.basename(path) if path else f"the {fmt} model"
    exported = " and ".join(f"{n} dim {d} {e}" for n, d, e, _ in refused)
    gives = [str(g) for *_, g in refused if g is not None]
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return ArtifactShapeError(
        f"{artifact} was exported for {exported}"
        + (f"; this call gives {' and '.join(gives)}" if len(gives) == len(refused) else "")
        + f" ({first})",
        fix=_reexport_fix(path, fmt, [(n, d) for n, d, *_ in refused]),
        artifact=artifact,
        refused=refused,
    )


def _size(inputs: tuple, index: int | None, dim: int) -> int | None:
    shape = getattr(inputs[index], "shape", None) if index is not None and index < len(inputs) else None
    return int(shape[dim]) if shape is not None and dim < len(shape) else None


def _reexport_fix(path: str | None, fmt: str, refused: list[tuple[str, int]]) -> str:
    lab = _LAB_FORMAT.get(fmt, fmt)
    model_dir = os.path.dirname(path) if path else "MODEL_DIR"
    command = f"handlerkit formats {model_dir} FILES --formats {lab} --save {lab} --replace"
    others = [(name.split()[-1], dim) for name, dim in refused if dim != 0]  # "input 1": the lab takes positions
    if not others:
        return (
            f"re-export it with a dynamic batch: {command} (in a notebook: h.compare_formats(batch, save={lab!r}, "
            "replace=True)); or send batches of the size it was exported for"
        )
    wanted: dict[str, list[int]] = {}
    for name, dim in others:
        wanted.setdefault(name, []).append(dim)
    declared = "{" + ", ".join(f"{int(n) if n.isdigit() else repr(n)}: {ds}" for n, ds in wanted.items()) + "}"
    labels = " and ".join(f"{name} dim {dim}" for name, dim in others)
    return (
        f"re-export it with {labels} dynamic: {command} --dynamic {','.join(f'{n}:{d}' for n, d in others)} "
        f"(in a notebook: h.compare_formats(batch, save={lab!r}, replace=True, dynamic_shapes={declared})); FILES "
        "whose requests differ in those sizes make the lab find them by itself"
    )


class ShapeChecked:
    """A compiled model (AOTInductor's) whose refusal of an input size is an :class:`ArtifactShapeError`;
    every other attribute is the model's."""

    def __init__(self, model: Any, path: str, fmt: str, names: list[str] | None) -> None:
        self._model, self._path, self._format, self._names = model, path, fmt, names

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._model(*args, **kwargs)
        except RuntimeError as exc:
            refusal = shape_refusal(exc, self._path, self._format, self._names, args)
            if refusal is None:
                raise
            raise refusal from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def __repr__(self) -> str:
        return repr(self._model)


def checked_forward(module: Any, path: str, names: list[str], fixed: list[dict[int, int]]) -> Any:
    """``module`` (a ``torch.export`` program's module) with its guard failures turned into
    :class:`ArtifactShapeError`. The forward is wrapped on the instance, so the module stays the
    ``nn.Module`` it is (its parameters are still found, ``.to`` still moves it)."""
    forward = module.forward

    @functools.wraps(forward)
    def checked(*args: Any, **kwargs: Any) -> Any:
        try:
            return forward(*args, **kwargs)
        except AssertionError as exc:  # torch._assert: "Guard failed: item_ids.size()[1] == 7"
            refusal = shape_refusal(exc, path, "export", names, args, fixed)
            if refusal is None:
                raise
            raise refusal from exc

    module.forward = checked
    return module


def fixed_sizes(program: Any) -> list[dict[int, int]]:
    """The sizes a ``torch.export`` program fixes, per user input (a dynamic size is symbolic)."""
    user = set(program.graph_signature.user_inputs)
    fixed = []
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in user:
            shape = getattr(node.meta.get("val"), "shape", ())
            fixed.append({d: int(size) for d, size in enumerate(shape) if isinstance(size, int)})
    return fixed
