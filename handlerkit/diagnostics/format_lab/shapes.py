"""The model's input dimensions in the format lab: which vary, and which each format accepts.

An exported model accepts only the sizes it was exported for, so the lab must know which of
the model's input dimensions vary besides the batch. The batch says so: each request is run
alone (with the eager model) and the inference stage's inputs compared with the batch's; a
dimension whose size differs varies (the ranker pads the batch's item lists to the longest, so
``item_ids`` dim 1 is 7 in the batch and 2 for a short request alone). The user declares the
rest, or overrides what was seen: ``compare_formats(dynamic_shapes=...)`` or the model config's
``handler: {dynamic_shapes: ...}`` (:class:`handlerkit.worker.config.HandlerSettings`), input name
(``forward``'s parameter) or position -> the dimensions that vary (an empty list: none).

:class:`Dims` holds the answer; the exporters make those dimensions dynamic. :func:`probes`
builds inputs that vary them (each request alone whose shapes differ, repeated to the batch's
size, and the batch with every varying dimension one longer, its entries cycled), and
:func:`accepted` runs a format's model on them against eager's to say which dimensions it
takes: ``item_ids [batch, *]`` or ``item_ids [batch, =7]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from handlerkit._compare import same_output

__all__ = ["Dims", "Probe", "accepted", "configured_dims", "plan_dims", "probes", "run_alone"]


@dataclass
class Dims:
    """The model's inputs and which of their dimensions vary besides the batch.

    Attributes:
        names: the inputs' names, by position (``forward``'s parameters).
        sample: each input's shape in the batch.
        seen: input position -> dims whose size differs between the batch and its requests alone.
        sizes: ``(input, dim)`` -> the sizes seen.
        declared: input position -> dims declared to vary (replacing what was seen for that input).
        source: where ``declared`` came from (``"dynamic_shapes="``, ``"model-config.yaml ..."``).
    """

    names: list[str]
    sample: list[tuple[int, ...]]
    seen: dict[int, list[int]] = field(default_factory=dict)
    sizes: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    declared: dict[int, list[int]] = field(default_factory=dict)
    source: str = ""

    @property
    def dynamic(self) -> dict[int, list[int]]:
        """Input position -> the dims to export dynamic: what was declared, else what was seen."""
        chosen = {**self.seen, **self.declared}
        return {i: dims for i, dims in sorted(chosen.items()) if dims}

    @property
    def tried(self) -> list[tuple[int, int]]:
        """``(input, dim)`` of the dims the lab varies: those to export dynamic and those seen varying."""
        chosen = {(i, d) for i, dims in self.seen.items() for d in dims}
        chosen |= {(i, d) for i, dims in self.dynamic.items() for d in dims}
        return sorted(chosen)

    def label(self, index: int, dim: int) -> str:
        """``"item_ids dim 1"``."""
        return f"{self.names[index]} dim {dim}"

    def describe(self) -> str:
        """The dims that vary and why, for a note: ``item_ids dim 1 (sizes 2, 7: seen in the batch)``."""
        parts = []
        for index, dims in self.dynamic.items():
            for dim in dims:
                sizes = self.sizes.get((index, dim))
                why = "declared" if index in self.declared else "seen in the batch"
                shown = f"sizes {', '.join(map(str, sizes))}: " if sizes and len(sizes) > 1 else ""
                parts.append(f"{self.label(index, dim)} ({shown}{why})")
        return ", ".join(parts)

    def fixed(self) -> list[str]:
        """Dims seen varying that a declaration keeps fixed."""
        return [self.label(i, d) for i, dims in self.seen.items() for d in dims if d not in self.dynamic.get(i, [])]

    def to_dict(self) -> dict[str, Any]:
        return {
            "inputs": {name: list(shape) for name, shape in zip(self.names, self.sample)},
            "dynamic": {self.names[i]: dims for i, dims in self.dynamic.items()},
            "seen": {self.names[i]: dims for i, dims in self.seen.items()},
            "declared": {self.names[i]: dims for i, dims in self.declared.items()},
        }


@dataclass
class Probe:
    """Inputs that vary some dims: the model's input tensors, the inference stage's input (same
    structure as the batch's), the sizes changed (``(input, dim)`` -> size), and the request
    of the batch they come from (None: the batch made longer)."""

    label: str
    inputs: tuple
    data: Any
    changed: dict[tuple[int, int], int]
    request: int | None = None


def configured_dims(view: Any) -> tuple[Mapping[Any, Any] | None, str]:
    """``handler.dynamic_shapes`` of the harness's model config, and where it came from."""
    import warnings

    from handlerkit.errors import HandlerkitWarning
    from handlerkit.worker.config import parse_config

    raw = getattr(view.context, "model_yaml_config", None)
    if not isinstance(raw, Mapping) or not isinstance(raw.get("handler"), Mapping):
        return None, ""
    with warnings.catch_warnings():  # the config's own warnings were given when it was read
        warnings.simplefilter("ignore", HandlerkitWarning)
        settings = parse_config({"handler": raw["handler"]}, source="model-config.yaml").handler
    return settings.dynamic_shapes, "model-config.yaml handler.dynamic_shapes"


def run_alone(view: Any, batch: Any) -> list[tuple[int, Any]]:
    """Each request of ``batch`` run alone (the harness's model as it is): ``(index, run)`` for
    those that ran (a request that fails alone tells nothing about shapes)."""
    if len(batch) < 2:
        return []
    runs = []
    for index, single in enumerate(batch.split()):
        try:
            runs.append((index, view.run(single)))
        except Exception:  # the batch ran; one request alone may not
            continue
    return runs


def _tensors(data: Any) -> tuple:
    return data if isinstance(data, tuple) else (data,)


def plan_dims(
    names: list[str], inputs: tuple, alone: list[tuple[int, Any]], declared: Mapping[Any, Any] | None, source: str
) -> Dims:
    """What varies: the inference inputs of the requests alone against the batch's; ``declared``
    (input name or position -> dims) replaces what was seen for the inputs it names.

    Raises:
        ValueError: ``declared`` names an input the model does not take, or a dim it does not have
            (ConfigError when ``declared`` is the model config's).
    """
    import torch

    dims = Dims(list(names), [tuple(x.shape) for x in inputs], source=source)
    for index, shape in enumerate(dims.sample):
        for dim in range(1, len(shape)):
            sizes = {shape[dim]}
            for _, run in alone:
                stage = run.stages.get("inference")
                others = _tensors(stage.input) if stage is not None else ()
                if index < len(others) and isinstance(others[index], torch.Tensor) and others[index].dim() > dim:
                    sizes.add(int(others[index].shape[dim]))
            dims.sizes[(index, dim)] = sorted(sizes)
            if len(sizes) > 1:
                dims.seen.setdefault(index, []).append(dim)
    for key, wanted in (declared or {}).items():
        index = _position(key, dims.names, source)
        rank = len(dims.sample[index])
        bad = [d for d in wanted if not isinstance(d, int) or d < 1 or d >= rank]
        if bad:
            _refuse(
                f"{source or 'dynamic_shapes'}: {dims.names[index]} has dims 1 to {rank - 1} besides the batch "
                f"(its shape in the batch is {list(dims.sample[index])}), not {bad}",
                source,
            )
        dims.declared[index] = sorted(set(wanted))
    return dims


def _position(key: Any, names: list[str], source: str) -> int:
    if isinstance(key, int) and not isinstance(key, bool) and 0 <= key < len(names):
        return key
    if isinstance(key, str) and key in names:
        return names.index(key)
    from handlerkit._text import suggestion

    hint = suggestion(key, names) if isinstance(key, str) else ""
    _refuse(
        f"{source or 'dynamic_shapes'} names input {key!r}{hint}, and the model takes {len(names)}: "
        f"{', '.join(names)} (by name, as forward calls them, or by position from 0)",
        source,
    )


def _refuse(message: str, source: str) -> NoReturn:
    """A bad declaration: a ConfigError when the model config made it, else a ValueError (an argument)."""
    if source.startswith("model-config"):
        from handlerkit.errors import ConfigError

        raise ConfigError(message, fix="name the model's inputs as its forward does, with dims 1 and up")
    raise ValueError(message)


def probes(dims: Dims, data: Any, inputs: tuple, alone: list[tuple[int, Any]]) -> list[Probe]:
    """Inputs that vary the dims seen varying or to export dynamic, the batch's size kept: each
    request alone whose sizes differ (its rows repeated to the batch's size), then the batch
    with each of those dims one longer (its entries cycled)."""
    import torch

    dynamic = dims.tried
    if not dynamic:
        return []
    n = int(inputs[0].shape[0]) if inputs and inputs[0].dim() else 1
    found: list[Probe] = []
    shapes_seen = {tuple(tuple(x.shape) for x in inputs)}
    for index, run in alone:
        stage = run.stages.get("inference")
        theirs = _tensors(stage.input) if stage is not None else ()
        if len(theirs) != len(inputs) or not all(isinstance(x, torch.Tensor) and x.dim() for x in theirs):
            continue
        rows = tuple(x[torch.arange(n, device=x.device) % x.shape[0]] for x in theirs)
        shapes = tuple(tuple(x.shape) for x in rows)
        changed = {(i, d): int(rows[i].shape[d]) for i, d in dynamic if rows[i].shape[d] != inputs[i].shape[d]}
        if shapes in shapes_seen or not changed:
            continue
        shapes_seen.add(shapes)
        label = f"request {index} alone ({_sizes(dims, changed)})"
        found.append(Probe(label, rows, _like(data, rows), changed, index))
    longer = list(inputs)
    changed = {}
    for i, d in dynamic:
        size = int(longer[i].shape[d])
        if size == 0:
            continue
        cycled = torch.arange(size + 1, device=longer[i].device) % size
        longer[i] = longer[i].index_select(d, cycled)
        changed[(i, d)] = size + 1
    if changed:
        found.append(
            Probe(f"the batch made longer ({_sizes(dims, changed)})", tuple(longer), _like(data, longer), changed)
        )
    return found


def _sizes(dims: Dims, changed: dict[tuple[int, int], int]) -> str:
    return ", ".join(f"{dims.label(i, d)} = {size}" for (i, d), size in changed.items())


def _like(data: Any, tensors: Any) -> Any:
    """``tensors`` in the structure of the inference stage's input (a tuple, or one tensor)."""
    return tuple(tensors) if isinstance(data, tuple) else tensors[0]


@dataclass
class Accepted:
    """Which dims a format's model took: input name -> one entry per dim (``"batch"``, ``"*"``
    a varied size taken, ``"=7"`` the only size taken, ``"7"`` the batch's, not varied), and a
    sentence per dim it refused."""

    dims: dict[str, list[str]]
    refused: list[str]


def accepted(
    model: Any, eager: Any, dims: Dims, found: list[Probe], batch_ok: bool, atol: float, rtol: float
) -> Accepted:
    """Run ``model`` and ``eager`` on each probe: a dim is taken when every probe that varied it
    gave eager's outputs (probes eager itself fails are left out)."""
    import torch

    from handlerkit.formats import ArtifactShapeError

    taken: set[tuple[int, int]] = set()
    refused: dict[tuple[int, int], list[tuple[str, str]]] = {}
    for probe in found:
        try:
            with torch.inference_mode():
                expected = eager(*probe.inputs)
        except Exception:  # the model itself does not take these sizes
            continue
        why = None
        try:
            with torch.inference_mode():
                actual = model(*probe.inputs)
            if not same_output(actual, expected, atol, rtol):
                why = "wrong output"
        except ArtifactShapeError as exc:
            why = f"exported for {exc.input} dim {exc.dim} {exc.expected}"
        except Exception as exc:  # any failure is the format's answer
            text = str(exc).strip().splitlines()
            why = f"{type(exc).__name__}: {text[0] if text else ''}"
        for key in probe.changed:
            if why is None:
                taken.add(key)
            else:
                refused.setdefault(key, []).append((str(probe.changed[key]), why))
    table: dict[str, list[str]] = {}
    for index, (name, shape) in enumerate(zip(dims.names, dims.sample)):
        entries = ["batch" if batch_ok else str(shape[0])] if shape else []
        for dim in range(1, len(shape)):
            key = (index, dim)
            entries.append(f"={shape[dim]}" if key in refused else "*" if key in taken else str(shape[dim]))
        table[name] = entries
    sentences = [
        f"{dims.label(i, d)} fixed = {dims.sample[i][d]} ({', '.join(sizes)} refused: {'; '.join(dict.fromkeys(why))})"
        for (i, d), tried in refused.items()
        for sizes, why in [([size for size, _ in tried], [reason for _, reason in tried])]
    ]
    return Accepted(table, sentences)


def shown(table: dict[str, list[str]]) -> str:
    """``"user_ids [batch]; item_ids [batch, *]"``."""
    return "; ".join(f"{name} [{', '.join(entries)}]" for name, entries in table.items())
