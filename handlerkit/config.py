"""Read and check model-config.yaml the way TorchServe 0.12 reads it.

TorchServe reads the file twice. The Java frontend (``ModelConfig.build``) picks out the
server keys (``batchSize``, ``maxWorkers``, ...) and *ignores, with a log line*, any value of
the wrong type: ``batchSize: "8"`` leaves the batch size at 1. The Python worker hands the
whole mapping to the handler as ``context.model_yaml_config``, and ``BaseHandler.initialize``
reads its ``pt2`` section to decide on ``torch.compile``.

handlerkit is stricter than the server where the server would fail quietly: a value of the
wrong type is a :class:`~handlerkit.errors.ConfigError` (all problems reported together, one
per line, each with its key path). Type rules follow the Java side exactly: an integer key needs
a YAML integer that fits in 32 bits (``"8"``, ``8.0`` and ``true`` are rejected, as
TorchServe ignores them), a boolean key needs a YAML boolean (``true``/``false``, and YAML 1.1's
``yes``/``no``/``on``/``off``, which both PyYAML and SnakeYAML read as booleans; the quoted
string ``"true"`` is rejected). Values TorchServe accepts but adjusts (``batchSize: 0`` becomes
1) and unknown keys that look like typos are warnings (:class:`~handlerkit.errors.HandlerkitWarning`).

Example::

    cfg = load_config("model-config.yaml")   # batchSize: 4 / pt2: {compile: {enable: true}}
    cfg.batch_size                           # 4 (None when absent)
    cfg.pt2.compile, cfg.pt2.reason          # True, "pt2.compile.enable is true: ..."
    cfg.raw                                  # what the handler sees as context.model_yaml_config
"""

from __future__ import annotations

import copy
import difflib
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from handlerkit.errors import ConfigError, HandlerkitWarning

__all__ = [
    "ModelConfig",
    "Pt2Config",
    "load_config",
    "parse_config",
    "SERVER_KEYS",
    "TORCHSERVE_PT2_BACKENDS",
]

#: Backend names TorchServe 0.12 accepts (``ts.utils.util.PT2Backend``); with any other name it
#: logs "<name> is not a supported backend" and serves the model uncompiled.
TORCHSERVE_PT2_BACKENDS: tuple[str, ...] = (
    "eager",
    "aot_eager",
    "inductor",
    "nvfuser",
    "aot_nvfuser",
    "aot_cudagraphs",
    "ofi",
    "fx2trt",
    "onnxrt",
    "ipex",
    "torchxla_trace_once",
    "openvino",
    "tensorrt",
    "hpu_backend",
)

# torch.compile's keyword arguments (torch 2.14), with the YAML types that make sense for them.
_COMPILE_KWARGS: dict[str, str] = {
    "fullgraph": "bool",
    "dynamic": "bool?",
    "backend": "str",
    "mode": "str?",
    "options": "mapping",
    "disable": "bool",
    "name": "str?",
    "recompile_limit": "int?",
    "isolate_recompiles": "bool",
    "dynamic_shapes": "any",
}
_COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_EXPORT_KEYS: dict[str, str] = {"aot_compile": "bool"}
_INT32 = (-(2**31), 2**31 - 1)


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
_KNOWN_TOP = (*_SERVER_KEYS, "handler", "pt2")

Pt2Schema = Literal["none", "compile", "export", "legacy-str", "legacy-dict"]


@dataclass(frozen=True)
class Pt2Config:
    """What TorchServe 0.12's ``BaseHandler.initialize`` would do with the ``pt2`` section.

    Attributes:
        schema: ``"none"`` (no ``pt2``), ``"compile"`` (``pt2: {compile: {...}}``), ``"export"``
            (``pt2: {export: {...}}`` without ``compile``), ``"legacy-str"`` (``pt2: inductor``)
            or ``"legacy-dict"`` (``pt2: {backend: ..., mode: ...}``).
        compile: whether ``torch.compile`` is to be applied: requested by the config, and with
            arguments torch.compile accepts (an unknown keyword, an unknown ``mode`` or ``mode``
            with ``options`` make torch.compile raise, and TorchServe then serves the model
            uncompiled). TorchServe also skips it when the backend is outside its list: see
            :attr:`backend_known_to_torchserve` and :attr:`torchserve_compiles`.
        compile_options: keyword arguments for ``torch.compile`` (a copy, ``enable`` removed).
        backend: the backend name, or None for torch's default.
        backend_known_to_torchserve: False when :attr:`backend` is not one of
            :data:`TORCHSERVE_PT2_BACKENDS`; TorchServe 0.12 then skips compilation with only a
            log line. (handlerkit's handler checks ``torch._dynamo.list_backends()`` instead.)
        aot_compile: ``pt2.export.aot_compile`` is true (a ``.so`` serialized file is loaded
            with AOTInductor).
        deprecated: the legacy schema was used (TorchServe logs a deprecation warning).
        reason: a sentence saying why the model is or is not compiled.
    """

    schema: Pt2Schema = "none"
    compile: bool = False
    compile_options: dict[str, Any] = field(default_factory=dict)
    backend: str | None = None
    backend_known_to_torchserve: bool = True
    aot_compile: bool = False
    deprecated: bool = False
    reason: str = "no pt2 section: the model is not compiled"

    @property
    def torchserve_compiles(self) -> bool:
        """Whether TorchServe 0.12 itself would apply ``torch.compile``."""
        return self.compile and self.backend_known_to_torchserve

    def __repr__(self) -> str:
        parts = [f"schema={self.schema!r}", f"compile={self.compile}"]
        if self.compile_options:
            parts.append(f"compile_options={self.compile_options!r}")
        if not self.backend_known_to_torchserve:
            parts.append("backend_known_to_torchserve=False")
        if self.aot_compile:
            parts.append("aot_compile=True")
        if self.deprecated:
            parts.append("deprecated=True")
        return f"Pt2Config({', '.join(parts)})"


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
        handler: a copy of the ``handler:`` section ({} when absent).
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
    handler: dict[str, Any] = field(default_factory=dict)
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
    import yaml  # lazily: keeps `import handlerkit` fast

    source = os.fspath(path)
    try:
        with open(source, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError as exc:
        raise ConfigError(
            f"{source}: no such file; check the path (a model dir's config is the file named by "
            f"the manifest's configFile, usually model-config.yaml)"
        ) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: cannot be read: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_error_message(source, exc)) from exc
    config = _parse(data, source)
    _emit(config, stacklevel=3)
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
    _emit(config, stacklevel=3)
    return config


# ----------------------------------------------------------------------------------------------
# Parsing


def _emit(config: ModelConfig, stacklevel: int) -> None:
    where = "" if config.source.startswith("<") else f" (in {config.source})"
    for message in config.warnings:
        warnings.warn(f"handlerkit: {message}{where}", HandlerkitWarning, stacklevel=stacklevel)


def _yaml_error_message(source: str, exc: Exception) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None)
    context = getattr(exc, "context", None)
    what = " ".join(p for p in (context, problem) if p) or str(exc).splitlines()[0]
    near = f" near line {mark.line + 1}" if mark is not None else ""
    return (
        f"{source}{where}: not valid YAML: {what}. Fix the YAML{near}: indent with spaces (not tabs), "
        f"put a space after each ':', and quote values that contain ': ' or start with '{{', '[', '*' or '&'"
    )


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def _looks_like(value: Any, kind: str) -> bool:
    """Whether a string is the quoted form of a value of `kind` (for a friendlier message)."""
    if not isinstance(value, str):
        return False
    text = value.strip().lower()
    if kind == "int":
        return text.lstrip("+-").isdigit()
    if kind == "bool":
        return text in ("true", "false", "yes", "no", "on", "off")
    return False


def _check_type(value: Any, kind: str, path: str, problems: list[str]) -> bool:
    """Check one value against a kind; append a problem line and return False when it is wrong.

    Kinds: ``int``, ``bool``, ``str``, ``mapping``, ``int_list``; a trailing ``?`` allows null;
    ``any`` accepts everything.
    """
    if kind == "any":
        return True
    if kind.endswith("?"):
        if value is None:
            return True
        kind = kind[:-1]
    hint = ""
    if kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            if _INT32[0] <= value <= _INT32[1]:
                return True
            problems.append(f"{path} must be an integer that fits in 32 bits, got {value}")
            return False
        expected = "an integer"
        if _looks_like(value, "int"):
            hint = f" (TorchServe ignores a quoted number: write {value.strip()} without quotes)"
    elif kind == "bool":
        if isinstance(value, bool):
            return True
        expected = "a boolean (true or false)"
        if _looks_like(value, "bool"):
            word = "true" if value.strip().lower() in ("true", "yes", "on") else "false"
            hint = f" (TorchServe ignores a quoted boolean: write {word} without quotes)"
    elif kind == "str":
        if isinstance(value, str):
            return True
        expected = "a string"
    elif kind == "mapping":
        if isinstance(value, Mapping):
            return True
        expected = "a mapping"
    elif kind == "int_list":
        if isinstance(value, list):
            ok = True
            for i, item in enumerate(value):
                ok = _check_type(item, "int", f"{path}[{i}]", problems) and ok
            return ok
        expected = "a list of integers"
    else:  # pragma: no cover - a programming error in the tables above
        raise ValueError(f"unknown kind {kind!r}")
    problems.append(f"{path} must be {expected}, got {_describe(value)}{hint}")
    return False


def _nearest(
    key: str, candidates: tuple[str, ...] | list[str], cutoff: float = 0.75, prefix: bool = True
) -> str | None:
    """The known key `key` was most likely meant to be, if any (`prefix`: accept a unique
    candidate that starts with it, e.g. ``aot`` -> ``aot_compile``)."""
    norm = key.lower().replace("_", "").replace("-", "")
    for c in candidates:
        if c.lower().replace("_", "").replace("-", "") == norm:
            return c
    if prefix and len(norm) >= 3:
        prefixed = [c for c in candidates if c.lower().replace("_", "").replace("-", "").startswith(norm)]
        if len(prefixed) == 1:
            return prefixed[0]
    lowered = {c.lower(): c for c in candidates}
    match = difflib.get_close_matches(key.lower(), list(lowered), n=1, cutoff=cutoff)
    return lowered[match[0]] if match else None


def _parse(data: Any, source: str) -> ModelConfig:
    if data is None:
        raise ConfigError(
            f"{source}: the file is empty; TorchServe 0.12 cannot register a model with an empty "
            f"config. Write at least one key (e.g. 'batchSize: 1'), or drop --config-file"
        )
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{source}: the top level must be a mapping of keys to values (e.g. 'batchSize: 4'), "
            f"got {_describe(data)}"
        )

    problems: list[str] = []
    notes: list[str] = []
    values: dict[str, Any] = {}
    sections: dict[str, Any] = {}
    handler: dict[str, Any] = {}

    for key, value in data.items():
        if not isinstance(key, str):
            problems.append(
                f"top-level key {key!r} must be a string (TorchServe's frontend fails on "
                f"{type(key).__name__} keys); quote it"
            )
            continue
        spec = _SERVER_KEYS.get(key)
        if spec is not None:
            if _check_type(value, spec.kind, key, problems):
                values[spec.attr] = _server_value(spec, value, notes, problems)
            continue
        if key == "pt2":
            continue  # analysed below
        if key == "handler":
            if _check_type(value, "mapping", "handler", problems):
                handler = copy.deepcopy(dict(value))
                if "profile" in handler:
                    _check_type(handler["profile"], "bool", "handler.profile", problems)
            continue
        sections[key] = copy.deepcopy(value)
        near = _nearest(key, _KNOWN_TOP, cutoff=0.8, prefix=False)
        if near is not None:
            notes.append(
                f"unknown top-level key {key!r} (did you mean {near!r}?); TorchServe "
                f"passes it to the handler as a free section and does not apply it as {near!r}"
            )

    pt2 = Pt2Config()
    if "pt2" in data:
        pt2 = _parse_pt2(data["pt2"], source, problems, notes)

    if problems:
        error = ConfigError("\n".join(f"{source}: {p}" for p in problems))
        error.problems = list(problems)  # type: ignore[attr-defined]
        raise error

    return ModelConfig(
        raw=data,  # type: ignore[arg-type]
        source=source,
        handler=handler,
        pt2=pt2,
        sections=sections,
        warnings=tuple(notes),
        **values,
    )


def _server_value(spec: _Key, value: Any, notes: list[str], problems: list[str]) -> Any:
    """A type-checked server value, with warnings for what TorchServe adjusts."""
    if spec.kind == "int" and spec.minimum is not None and value < spec.minimum:
        notes.append(f"{spec.yaml}: {value} is below {spec.minimum}; TorchServe 0.12 {spec.below}")
    elif spec.kind == "str" and spec.choices and value.lower() not in spec.choices:
        near = _nearest(value, list(spec.choices), cutoff=0.6)
        hint = f" (did you mean {near!r}?)" if near else ""
        notes.append(
            f"{spec.yaml}: {value!r} is not one of {', '.join(spec.choices)}{hint}; "
            f"TorchServe 0.12 treats it as unset"
        )
    elif spec.kind == "int_list":
        return list(value)
    elif spec.kind == "mapping":  # torchrun
        return _parse_torchrun(value, notes, problems)
    return value


def _parse_torchrun(value: Mapping[Any, Any], notes: list[str], problems: list[str]) -> dict[str, Any]:
    for key, item in value.items():
        path = f"torchrun.{key}"
        if not isinstance(key, str):
            problems.append(f"torchrun key {key!r} must be a string (TorchServe's frontend fails on it)")
            continue
        spec = _TORCHRUN_KEYS.get(key)
        if spec is None:
            near = _nearest(key, list(_TORCHRUN_KEYS))
            hint = f" (did you mean {near!r}?)" if near else ""
            notes.append(f"unknown key {path}{hint}; TorchServe 0.12 ignores it")
            continue
        kind, minimum, below = spec
        if _check_type(item, kind, path, problems) and minimum is not None and item < minimum:
            notes.append(f"{path}: {item} is below {minimum}; TorchServe 0.12 {below}")
    return copy.deepcopy(dict(value))


# ----------------------------------------------------------------------------------------------
# pt2


def _flow(value: Any) -> str:
    """A value as one line of flow-style YAML, for messages."""
    import yaml

    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10_000).strip()


def _unknown_keys(
    mapping: Mapping[Any, Any], known: tuple[str, ...] | list[str], path: str, consequence: str, notes: list[str]
) -> list[str]:
    unknown = [k for k in mapping if k not in known]
    for key in unknown:
        near = _nearest(str(key), known) if isinstance(key, str) else None
        hint = f" (did you mean {near!r}?)" if near else ""
        notes.append(f"unknown key {path}.{key}{hint}; {consequence}")
    return [str(k) for k in unknown]


def _parse_pt2(value: Any, source: str, problems: list[str], notes: list[str]) -> Pt2Config:
    """Mirror ``BaseHandler.initialize``'s reading of ``pt2`` (TorchServe 0.12)."""
    if isinstance(value, str):
        # TorchServe tests `"compile" in pt2` and `"export" in pt2` before checking the type, so a
        # string is searched for those words as substrings.
        if "compile" in value:
            problems.append(
                f"pt2 is the string {value!r}: TorchServe 0.12 looks for 'compile' in it, finds the "
                f"substring and fails with TypeError (string indices must be integers); write "
                f"pt2: {{compile: {{enable: true, backend: inductor}}}}"
            )
            return Pt2Config()
        if "export" in value:
            notes.append(
                f"pt2: {value!r} contains 'export', so TorchServe 0.12 takes it for the export "
                f"schema and does not compile; write pt2: {{export: {{aot_compile: true}}}} or "
                f"pt2: {{compile: {{enable: true, backend: ...}}}}"
            )
            return Pt2Config(schema="legacy-str", deprecated=True, reason=f"pt2: {value!r} is read as the export schema: not compiled")
        notes.append(
            f"pt2: {value!r} is the legacy schema (TorchServe 0.12 still compiles it but logs a "
            f"deprecation warning); write pt2: {{compile: {{enable: true, backend: {value}}}}}"
        )
        return _compile_config("legacy-str", {"backend": value}, problems, notes, deprecated=True, path="pt2")

    if not isinstance(value, Mapping):
        crash = (
            "fails with ValueError 'pt2 should be str or dict'"
            if isinstance(value, list)
            else "fails with TypeError (it tests 'compile' in pt2)"
        )
        problems.append(
            f"pt2 must be a backend name (string) or a mapping, got {_describe(value)}; TorchServe 0.12 "
            f"{crash}. Write pt2: {{compile: {{enable: true, backend: inductor}}}}"
        )
        return Pt2Config()

    aot_compile = False
    if "export" in value:
        export = value["export"]
        if _check_type(export, "mapping", "pt2.export", problems):
            _unknown_keys(
                export, tuple(_EXPORT_KEYS), "pt2.export", "TorchServe 0.12 reads only pt2.export.aot_compile", notes
            )
            if "aot_compile" in export and _check_type(export["aot_compile"], "bool", "pt2.export.aot_compile", problems):
                aot_compile = export["aot_compile"]

    if "compile" in value:
        _unknown_keys(value, ("compile", "export"), "pt2", "TorchServe 0.12 ignores it next to pt2.compile", notes)
        section = value["compile"]
        if not _check_type(section, "mapping", "pt2.compile", problems):
            return Pt2Config(schema="compile")
        if "enable" not in section:
            problems.append(
                f"pt2.compile has no 'enable' key: TorchServe 0.12 fails with KeyError 'enable'. "
                f"Add enable: true (or enable: false to switch compilation off), e.g. "
                f"pt2: {_flow({'compile': {'enable': True, **dict(section)}})}"
            )
            return Pt2Config(schema="compile")
        enable = section["enable"]
        options = {k: v for k, v in section.items() if k != "enable"}
        if not _check_type(enable, "bool", "pt2.compile.enable", problems):
            return Pt2Config(schema="compile")
        if not enable:
            _compile_config("compile", options, problems, [], deprecated=False, path="pt2.compile")
            return Pt2Config(
                schema="compile",
                compile_options=copy.deepcopy(options),
                backend=options.get("backend") if isinstance(options.get("backend"), str) else None,
                aot_compile=aot_compile,
                reason="pt2.compile.enable is false: the model is not compiled",
            )
        return _compile_config(
            "compile", options, problems, notes, deprecated=False, path="pt2.compile", aot_compile=aot_compile
        )

    if "export" in value:
        _unknown_keys(value, ("compile", "export"), "pt2", "TorchServe 0.12 ignores it next to pt2.export", notes)
        reason = "pt2.export without pt2.compile: TorchServe 0.12 does not call torch.compile"
        if aot_compile:
            reason += "; pt2.export.aot_compile is true: a .so serialized file is loaded with AOTInductor"
        return Pt2Config(schema="export", aot_compile=aot_compile, reason=reason)

    # Legacy: the mapping itself is torch.compile's keyword arguments.
    options = dict(value)
    if "enable" in options:
        notes.append(
            f"pt2.enable: TorchServe 0.12 reads a pt2 mapping without 'compile' as torch.compile's "
            f"arguments, and torch.compile has no 'enable' (it raises TypeError, so the model is "
            f"served uncompiled); write pt2: {_flow({'compile': options})}"
        )
        return Pt2Config(
            schema="legacy-dict",
            compile_options=copy.deepcopy(options),
            deprecated=True,
            reason="pt2.enable is not a torch.compile argument: torch.compile raises TypeError, the model is not compiled",
        )
    notes.append(
        f"pt2: {_flow(options)} is the legacy schema (TorchServe 0.12 still compiles it but logs a "
        f"deprecation warning); write pt2: {_flow({'compile': {'enable': True, **options}})}"
    )
    return _compile_config("legacy-dict", options, problems, notes, deprecated=True, path="pt2")


def _compile_config(
    schema: Pt2Schema,
    options: dict[str, Any],
    problems: list[str],
    notes: list[str],
    *,
    deprecated: bool,
    path: str,
    aot_compile: bool = False,
) -> Pt2Config:
    """A Pt2Config for a compile request with these torch.compile options."""
    for key, value in options.items():
        kind = _COMPILE_KWARGS.get(key) if isinstance(key, str) else None
        if kind is not None:
            _check_type(value, kind, f"{path}.{key}", problems)
    unknown = _unknown_keys(
        options,
        tuple(_COMPILE_KWARGS),
        path,
        "torch.compile has no such argument: it raises TypeError and TorchServe 0.12 serves the model uncompiled",
        notes,
    )
    backend = options.get("backend")
    backend = backend if isinstance(backend, str) else None
    known = backend is None or backend in TORCHSERVE_PT2_BACKENDS
    mode = options.get("mode")
    blocked = ""
    if unknown:
        blocked = f"torch.compile has no argument {', '.join(map(repr, unknown))}"
    elif isinstance(mode, str) and mode not in _COMPILE_MODES:
        near = _nearest(mode, list(_COMPILE_MODES), cutoff=0.6)
        hint = f" (did you mean {near!r}?)" if near else ""
        blocked = f"torch.compile does not know mode {mode!r}"
        notes.append(
            f"{path}.mode: {mode!r} is not one of {', '.join(_COMPILE_MODES)}{hint}; torch.compile "
            f"raises and TorchServe 0.12 serves the model uncompiled"
        )
    elif mode is not None and options.get("options") is not None:
        blocked = "torch.compile refuses mode and options together"
        notes.append(
            f"{path}: mode and options are both set; torch.compile refuses that and TorchServe 0.12 "
            f"serves the model uncompiled. Keep one of them"
        )
    if not known:
        notes.append(
            f"{path}.backend: {backend!r} is not in TorchServe 0.12's backend list "
            f"(ts.utils.util.PT2Backend), so TorchServe skips compilation with only a log line "
            f"'{backend} is not a supported backend'; handlerkit compiles it if torch knows it"
        )

    call = ", ".join(["model", *(f"{k}={v!r}" for k, v in options.items())])
    origin = {
        "compile": "pt2.compile.enable is true",
        "legacy-str": f"pt2: {backend!r} (legacy schema)",
        "legacy-dict": "pt2 mapping without compile/export (legacy schema)",
    }.get(schema, path)
    if blocked:
        reason = f"{origin}, but {blocked}: torch.compile raises, so the model is not compiled"
    else:
        reason = f"{origin}: torch.compile({call})"
        if backend is None:
            reason += " with torch's default backend"
        if not known:
            reason += (
                f"; TorchServe 0.12 skips it because {backend!r} is not in its backend list, "
                f"handlerkit applies it if torch._dynamo.list_backends() has it"
            )
    if aot_compile:
        reason += "; pt2.export.aot_compile is true: a .so serialized file is loaded with AOTInductor"
    return Pt2Config(
        schema=schema,
        compile=not blocked,
        compile_options=copy.deepcopy(options),
        backend=backend,
        backend_known_to_torchserve=known,
        aot_compile=aot_compile,
        deprecated=deprecated,
        reason=reason,
    )
