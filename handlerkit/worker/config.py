"""Read and check model-config.yaml the way TorchServe 0.12 reads it.

TorchServe reads the file twice. The Java frontend (``ModelConfig.build``) picks out the
server keys (``batchSize``, ``maxWorkers``, ...) and *ignores, with a log line*, any value of
the wrong type: ``batchSize: "8"`` leaves the batch size at 1. The Python worker hands the
whole mapping to the handler as ``context.model_yaml_config``; the handler reads its own
``handler:`` section (:class:`HandlerSettings`) and ``BaseHandler.initialize`` reads ``pt2:``
to decide on ``torch.compile`` (:mod:`handlerkit.worker.pt2`, :class:`Pt2Config`).

handlerkit is stricter than the server where the server would fail quietly: a value of the
wrong type is a :class:`~handlerkit.errors.ConfigError` (all problems reported together, one
per line, each with its key path; ``error.fix`` says what to write). Type rules follow the Java
side exactly: an integer key needs a YAML integer that fits in 32 bits (``"8"``, ``8.0`` and
``true`` are rejected, as TorchServe ignores them), a boolean key needs a YAML boolean
(``true``/``false``, and YAML 1.1's ``yes``/``no``/``on``/``off``, which both PyYAML and
SnakeYAML read as booleans; the quoted string ``"true"`` is rejected). Values TorchServe accepts
but adjusts (``batchSize: 0`` becomes 1) and unknown keys that look like typos are warnings
(:class:`~handlerkit.errors.HandlerkitWarning`).

Example::

    cfg = load_config("model-config.yaml")   # batchSize: 4 / pt2: {compile: {enable: true}}
    cfg.batch_size                           # 4 (None when absent)
    cfg.handler.topk, cfg.handler.tf32       # None, "auto" (typed, validated)
    cfg.handler.dynamic_shapes               # {"item_ids": (1,)} from handler: {dynamic_shapes: {item_ids: [1]}}
    cfg.pt2.compile, cfg.pt2.reason          # True, "pt2.compile.enable is true: ..."
    cfg.raw                                  # what the handler sees as context.model_yaml_config
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from handlerkit._stack import user_stacklevel
from handlerkit._text import did_you_mean, suggestion
from handlerkit._validate import Findings, describe, read_yaml
from handlerkit.errors import ConfigError, HandlerkitWarning
from handlerkit.worker.pt2 import TORCHSERVE_PT2_BACKENDS, Pt2Config, _parse_pt2
from handlerkit.worker.v2_tensors import metadata_problems

__all__ = [
    "SERVER_KEYS",
    "TORCHSERVE_PT2_BACKENDS",
    "HandlerSettings",
    "ModelConfig",
    "Pt2Config",
    "load_config",
    "parse_config",
]


@dataclass(frozen=True)
class _Key:
    """One key TorchServe's ModelConfig.java reads, with what it does to bad values."""

    yaml: str
    attr: str
    kind: str  # "int" | "bool" | "str" | "int_list" | "mapping"
    minimum: int | None = None
    below: str = ""  # what TorchServe does with a value under minimum
    choices: tuple[str, ...] = ()


_SERVER_KEY_LIST: tuple[_Key, ...] = (
    _Key("minWorkers", "min_workers", "int", 1, "raises it to 1"),
    _Key("maxWorkers", "max_workers", "int", 0, "ignores it"),
    _Key("batchSize", "batch_size", "int", 1, "raises it to 1"),
    _Key("maxBatchDelay", "max_batch_delay", "int", 0, "ignores it"),
    _Key("responseTimeout", "response_timeout", "int", 1, "ignores it and keeps 120 s"),
    _Key("startupTimeout", "startup_timeout", "int", 1, "ignores it and keeps 120 s"),
    _Key("deviceType", "device_type", "str", choices=("cpu", "gpu")),
    _Key("deviceIds", "device_ids", "int_list"),
    _Key("parallelType", "parallel_type", "str", choices=("pp", "tp", "pptp", "custom")),
    _Key("parallelLevel", "parallel_level", "int", 0, "ignores it"),
    _Key("torchrun", "torchrun", "mapping"),
    _Key("maxRetryTimeoutInSec", "max_retry_timeout_in_sec", "int", 0, "raises it to 0"),
    _Key("clientTimeoutInMills", "client_timeout_in_mills", "int", 0, "raises it to 0 (no timeout)"),
    _Key("jobQueueSize", "job_queue_size", "int", 0, "raises it to 0 (the server default)"),
    _Key("useJobTicket", "use_job_ticket", "bool"),
    _Key("sequenceMaxIdleMSec", "sequence_max_idle_msec", "int", 0, "raises it to 0"),
    _Key("sequenceTimeoutMSec", "sequence_timeout_msec", "int", 0, "raises it to 0"),
    _Key("maxSequenceJobQueueSize", "max_sequence_job_queue_size", "int", 1, "raises it to 1"),
    _Key("maxNumSequence", "max_num_sequence", "int", 1, "raises it to 1"),
    _Key("continuousBatching", "continuous_batching", "bool"),
    _Key("sequenceBatching", "sequence_batching", "bool"),
    _Key("asyncCommunication", "async_communication", "bool"),
    _Key("useVenv", "use_venv", "bool"),
)
_SERVER_KEYS: dict[str, _Key] = {k.yaml: k for k in _SERVER_KEY_LIST}

#: The server keys of TorchServe 0.12's ``ModelConfig.java``: YAML name -> ModelConfig attribute.
SERVER_KEYS: Mapping[str, str] = MappingProxyType({k.yaml: k.attr for k in _SERVER_KEY_LIST})

# torchrun's keys (ModelConfig.TorchRun.build): name -> (kind, minimum, what TorchServe does below it).
_TORCHRUN_KEYS: dict[str, tuple[str, int | None, str]] = {
    "nnodes": ("int", 1, "resets it to 1"),
    "nproc-per-node": ("int", 1, "resets it to 1"),
    "rdzv-backend": ("str", None, ""),
    "rdzv-endpoint": ("str", None, ""),
    "rdzv-conf": ("str", None, ""),
    "monitor-interval": ("int", 1, "resets it to 5"),
    "node-rank": ("int", 0, "resets it to 0"),
    "OMP_NUMBER_THREADS": ("int", 1, "resets it to 1"),
}

# Top-level names a typo is compared against (free sections other than these are fine).
_KNOWN_TOP = (*_SERVER_KEYS, "handler", "pt2", "v2")

# The handler: keys handlerkit reads, with their defaults (HandlerSettings' typed fields).
_HANDLER_DEFAULTS: dict[str, Any] = {"profile": False, "tf32": "auto", "topk": None, "dynamic_shapes": None}


@dataclass(frozen=True, eq=False)
class HandlerSettings(Mapping[str, Any]):
    """The ``handler:`` section of model-config.yaml, validated once.

    The keys handlerkit's handlers read are typed fields; every other key is kept in
    :attr:`extra` for custom handlers (TorchServe's own read e.g. ``model_path``). It also reads
    as the mapping that was written, so ``settings["topk"]``, ``settings.get("model_path")``,
    ``"x" in settings`` and ``dict(settings)`` work as on the plain dict.

    Attributes:
        profile: record ``ts_handler_<stage>`` times (TorchServe's ``handler: {profile: true}``).
        tf32: TF32 for CUDA matmuls and convolutions: ``"auto"`` (on for Ampere and newer, as
            TorchServe does), ``True`` or ``False``.
        topk: how many classes a classifier returns (a positive integer), None for its default.
        dynamic_shapes: the model's inputs whose sizes vary besides the batch, for the format
            lab (``h.compare_formats``, ``handlerkit formats``) to export them dynamic: input name
            (``forward``'s parameter) or position -> its dimensions that vary (1 and up; the
            batch, 0, always varies), e.g. ``handler: {dynamic_shapes: {item_ids: [1], mask: [1]}}``;
            an empty list keeps all of that input's fixed. TorchServe ignores the key; None when absent.
        extra: a copy of every other key of the section.
        written: the typed keys the section set (a value equal to its default still reads as
            written); a typed field that differs from its default always does.
    """

    profile: bool = False
    tf32: Literal["auto"] | bool = "auto"
    topk: int | None = None
    dynamic_shapes: Mapping[str | int, tuple[int, ...]] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    written: frozenset[str] = field(default=frozenset(), repr=False)

    def _typed_keys(self) -> list[str]:
        return [k for k, d in _HANDLER_DEFAULTS.items() if k in self.written or getattr(self, k) != d]

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key`` as written (typed field, else :attr:`extra`), or ``default``."""
        try:
            return self[key]
        except KeyError:
            return default

    def __getitem__(self, key: str) -> Any:
        if key in _HANDLER_DEFAULTS and key in self._typed_keys():
            return getattr(self, key)
        return self.extra[key]

    def __contains__(self, key: object) -> bool:
        return key in self._typed_keys() or key in self.extra

    def __iter__(self) -> Iterator[str]:
        yield from self._typed_keys()
        yield from self.extra

    def __len__(self) -> int:
        return len(self._typed_keys()) + len(self.extra)


@dataclass(frozen=True, repr=False)
class ModelConfig:
    """A parsed, validated model-config.yaml.

    Server keys are attributes with snake_case names (``batchSize`` -> ``batch_size``), None when
    absent; :data:`SERVER_KEYS` lists them. Values are as written (TorchServe's adjustments of
    out-of-range values are reported as warnings, not applied).

    Attributes:
        raw: the mapping exactly as YAML gave it; handlers receive it as
            ``context.model_yaml_config``. Never modified by handlerkit.
        source: where it came from (a path, or ``"<dict>"``).
        handler: the ``handler:`` section, typed (all defaults when absent).
        pt2: what TorchServe would do with the ``pt2:`` section.
        sections: copies of the other top-level sections (free sections for handlers,
            e.g. ``micro_batching``).
        warnings: the warnings issued while parsing (without the ``handlerkit: `` prefix).
    """

    raw: dict[str, Any]
    source: str = "<dict>"
    min_workers: int | None = None
    max_workers: int | None = None
    batch_size: int | None = None
    max_batch_delay: int | None = None
    response_timeout: int | None = None
    startup_timeout: int | None = None
    device_type: str | None = None
    device_ids: list[int] | None = None
    parallel_type: str | None = None
    parallel_level: int | None = None
    torchrun: dict[str, Any] | None = None
    max_retry_timeout_in_sec: int | None = None
    client_timeout_in_mills: int | None = None
    job_queue_size: int | None = None
    use_job_ticket: bool | None = None
    sequence_max_idle_msec: int | None = None
    sequence_timeout_msec: int | None = None
    max_sequence_job_queue_size: int | None = None
    max_num_sequence: int | None = None
    continuous_batching: bool | None = None
    sequence_batching: bool | None = None
    async_communication: bool | None = None
    use_venv: bool | None = None
    handler: HandlerSettings = field(default_factory=HandlerSettings)
    pt2: Pt2Config = field(default_factory=Pt2Config)
    sections: dict[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    @property
    def server(self) -> dict[str, Any]:
        """The server keys that are set, by their YAML names."""
        return {k.yaml: getattr(self, k.attr) for k in _SERVER_KEY_LIST if getattr(self, k.attr) is not None}

    def to_dict(self) -> dict[str, Any]:
        """A deep copy of :attr:`raw`."""
        return copy.deepcopy(self.raw)

    def __repr__(self) -> str:
        parts = [f"source={self.source!r}"]
        parts += [f"{name}={value!r}" for name, value in self.server.items()]
        if self.pt2.schema != "none":
            parts.append(f"pt2={self.pt2!r}")
        if self.handler:
            parts.append(f"handler={sorted(self.handler)!r}")
        if self.sections:
            parts.append(f"sections={sorted(self.sections)!r}")
        return f"ModelConfig({', '.join(parts)})"


# ----------------------------------------------------------------------------------------------
# Public entry points


def load_config(path: str | os.PathLike[str]) -> ModelConfig:
    """Read and validate a model-config.yaml file.

    Args:
        path: the file.

    Returns:
        The parsed config; warnings (typos, legacy ``pt2``, values TorchServe adjusts) are issued
        as :class:`~handlerkit.errors.HandlerkitWarning`.

    Raises:
        ConfigError: the file is missing, is not valid YAML, its top level is not a mapping, or
            values have the wrong type (all such problems in one message, one per line).
    """
    source = os.fspath(path)
    data = read_yaml(
        source,
        what="model config",
        missing_fix="check the path (a model dir's config is the file named by the manifest's configFile, "
        "usually model-config.yaml)",
    )
    config = _parse(data, source)
    _emit(config)
    return config


def parse_config(mapping: Mapping[str, Any], source: str = "<dict>") -> ModelConfig:
    """Validate an already-loaded model config (e.g. ``yaml.safe_load`` output).

    Args:
        mapping: the top-level mapping; kept as :attr:`ModelConfig.raw` without copying.
        source: a name for messages.

    Returns:
        The parsed config (warnings are issued as with :func:`load_config`).

    Raises:
        ConfigError: the top level is not a mapping or values have the wrong type.
    """
    config = _parse(mapping, source)
    _emit(config)
    return config


# ----------------------------------------------------------------------------------------------
# Parsing


def _emit(config: ModelConfig) -> None:
    where = "" if config.source.startswith("<") else f" (in {config.source})"
    for message in config.warnings:
        warnings.warn(f"handlerkit: {message}{where}", HandlerkitWarning, stacklevel=user_stacklevel())


def _parse(data: Any, source: str) -> ModelConfig:
    if data is None:
        raise ConfigError(
            f"{source}: the file is empty; TorchServe 0.12 cannot register a model with an empty config",
            fix="write at least one key (e.g. 'batchSize: 1'), or drop --config-file",
        )
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{source}: the top level must be a mapping of keys to values, got {describe(data)}",
            fix="write one 'key: value' per line, e.g. 'batchSize: 4'",
        )

    found = Findings()
    values: dict[str, Any] = {}
    sections: dict[str, Any] = {}
    handler = HandlerSettings()

    for key, value in data.items():
        if not isinstance(key, str):
            found.problem(
                repr(key),
                f"top-level key {key!r} must be a string (TorchServe's frontend fails on {type(key).__name__} keys)",
                fix=f"quote it: '{key}'",
            )
            continue
        spec = _SERVER_KEYS.get(key)
        if spec is not None:
            if found.check(value, spec.kind, key):
                values[spec.attr] = _server_value(spec, value, found)
        elif key == "handler":
            handler = _parse_handler(value, found)
        elif key == "v2":  # kept as a section; checked here so a bad one fails when the config is read
            _check_v2(value, found)
            sections[key] = copy.deepcopy(value)
        elif key != "pt2":  # pt2 is analysed below
            sections[key] = copy.deepcopy(value)
            near = did_you_mean(key, _KNOWN_TOP, cutoff=0.8)
            if near is not None:
                found.note(
                    f"unknown top-level key {key!r} (did you mean {near!r}?); TorchServe "
                    f"passes it to the handler as a free section and does not apply it as {near!r}"
                )

    pt2 = _parse_pt2(data["pt2"], found) if "pt2" in data else Pt2Config()
    found.raise_problems(source)
    return ModelConfig(
        raw=data,  # type: ignore[arg-type]
        source=source,
        handler=handler,
        pt2=pt2,
        sections=sections,
        warnings=tuple(found.notes),
        **values,
    )


_V2_EXAMPLE = "v2: {inputs: [{name: input-0, datatype: BYTES, shape: [-1]}], outputs: [...]}"


def _check_v2(value: Any, found: Findings) -> None:
    """``v2:``, the model's Open Inference Protocol v2 metadata (what ``GET /v2/models/<name>``
    declares on a KServe server): ``inputs`` and ``outputs``, lists of ``{name, datatype, shape}``."""
    if not isinstance(value, Mapping):
        found.problem("v2", f"v2 must be a mapping of inputs and outputs, got {describe(value)}", fix=_V2_EXAMPLE)
        return
    unknown = [str(key) for key in value if key not in ("inputs", "outputs")]
    problems = [f"unknown key v2.{key}: v2 holds inputs and outputs" for key in unknown]
    problems += [p for key in ("inputs", "outputs") for p in metadata_problems(value.get(key, []), f"v2.{key}")]
    if problems:
        found.problem("v2", "; ".join(problems), fix=f"declare each tensor as {{name, datatype, shape}}: {_V2_EXAMPLE}")


def _server_value(spec: _Key, value: Any, found: Findings) -> Any:
    """A type-checked server value, with warnings for what TorchServe adjusts."""
    if spec.kind == "int" and spec.minimum is not None and value < spec.minimum:
        found.note(f"{spec.yaml}: {value} is below {spec.minimum}; TorchServe 0.12 {spec.below}")
    elif spec.kind == "str" and spec.choices and value.lower() not in spec.choices:
        hint = suggestion(value, spec.choices, cutoff=0.6, prefix=True)
        found.note(
            f"{spec.yaml}: {value!r} is not one of {', '.join(spec.choices)}{hint}; TorchServe 0.12 treats it as unset"
        )
    elif spec.kind == "int_list":
        return list(value)
    elif spec.kind == "mapping":  # torchrun
        return _parse_torchrun(value, found)
    return value


def _parse_torchrun(value: Mapping[Any, Any], found: Findings) -> dict[str, Any]:
    for key, item in value.items():
        path = f"torchrun.{key}"
        if not isinstance(key, str):
            found.problem(
                path,
                f"torchrun key {key!r} must be a string (TorchServe's frontend fails on it)",
                fix=f"quote it: '{key}'",
            )
            continue
        spec = _TORCHRUN_KEYS.get(key)
        if spec is None:
            hint = suggestion(key, _TORCHRUN_KEYS, prefix=True)
            found.note(f"unknown key {path}{hint}; TorchServe 0.12 ignores it")
            continue
        kind, minimum, below = spec
        if found.check(item, kind, path) and minimum is not None and item < minimum:
            found.note(f"{path}: {item} is below {minimum}; TorchServe 0.12 {below}")
    return copy.deepcopy(dict(value))


def _parse_handler(value: Any, found: Findings) -> HandlerSettings:
    """The ``handler:`` section: typed keys checked, the others kept for custom handlers."""
    if not found.check(value, "mapping", "handler"):
        return HandlerSettings()
    typed: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, item in value.items():
        if key not in _HANDLER_DEFAULTS:
            extra[key] = copy.deepcopy(item)
            near = did_you_mean(key, _HANDLER_DEFAULTS, cutoff=0.8) if isinstance(key, str) else None
            if near is not None:
                found.note(
                    f"unknown key handler.{key} (did you mean {near!r}?); it is not read as {near!r}, "
                    f"only kept in handler.extra for a custom handler"
                )
        elif key == "profile":
            if found.check(item, "bool", "handler.profile"):
                typed[key] = item
        elif key == "tf32":
            if isinstance(item, bool) or item == "auto":
                typed[key] = item
            else:
                quoted = isinstance(item, str) and item.strip().lower() in ("true", "false", "auto")
                found.problem(
                    "handler.tf32",
                    f"handler.tf32 must be auto, true or false, got {describe(item)}",
                    fix=f"write {item.strip().lower()} without quotes or capitals"
                    if quoted
                    else "write tf32: auto (TF32 on Ampere and newer GPUs, as TorchServe does), true or false",
                )
        elif key == "dynamic_shapes":
            shapes = _dynamic_shapes(item, found)
            if shapes is not None:
                typed[key] = shapes
        elif item is None or _positive_int(item):  # topk: null means the handler's default
            typed[key] = item
        else:  # topk
            quoted = isinstance(item, str) and item.strip().isdigit() and int(item) > 0
            found.problem(
                "handler.topk",
                f"handler.topk must be a positive integer (how many classes to return), got {describe(item)}",
                fix=f"write {item.strip()} without quotes" if quoted else "write e.g. 'handler: {topk: 5}'",
            )
    return HandlerSettings(**typed, extra=extra, written=frozenset(typed))


def _dynamic_shapes(value: Any, found: Findings) -> Mapping[str | int, tuple[int, ...]] | None:
    """``handler.dynamic_shapes``: input name or position -> a list of dimension indices >= 1."""
    example = "write e.g. 'handler: {dynamic_shapes: {item_ids: [1], mask: [1]}}' (input -> its dims that vary)"
    if value is None:
        return None
    if not isinstance(value, Mapping):
        found.problem(
            "handler.dynamic_shapes",
            f"handler.dynamic_shapes must map the model's inputs to their dims that vary, got {describe(value)}",
            fix=example,
        )
        return None
    shapes: dict[str | int, tuple[int, ...]] = {}
    for name, dims in value.items():
        path = f"handler.dynamic_shapes.{name}"
        if not isinstance(name, str) and not (isinstance(name, int) and not isinstance(name, bool) and name >= 0):
            found.problem(
                path, f"{path}: an input is named (forward's parameter) or numbered, got {describe(name)}", fix=example
            )
        elif not isinstance(dims, list) or not all(_positive_int(d) for d in dims):
            batch = isinstance(dims, list) and 0 in dims
            found.problem(
                path,
                f"{path} must be a list of dimension indices 1 and up, got {describe(dims)}"
                + ("; dim 0, the batch, always varies" if batch else ""),
                fix=f"write {name}: {[d for d in dims if d != 0]}" if batch else example,
            )
        else:
            shapes[name] = tuple(sorted(set(dims)))
    return shapes


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
