"""The ``pt2:`` section of model-config.yaml: what TorchServe 0.12 does with it.

``BaseHandler.initialize`` reads ``pt2`` to decide on ``torch.compile`` (and on AOTInductor for
a ``.so`` serialized file). Three schemas are accepted:

- current: ``pt2: {compile: {enable: true, backend: inductor, mode: ...}}``; ``enable: false``
  means no compile, a missing backend means torch's default;
- ``pt2: {export: {aot_compile: true}}``: the AOTInductor path, no ``torch.compile``;
- legacy, still compiled with a deprecation log: ``pt2: inductor`` and
  ``pt2: {backend: inductor, mode: ...}`` (the mapping is torch.compile's keyword arguments).

:class:`Pt2Config` is the decision, with a sentence saying why. Where TorchServe would crash
(``pt2.compile`` without ``enable``, a ``pt2`` list) the parser records a problem; where it
would quietly serve the model uncompiled (an unknown torch.compile argument or mode, a backend
outside its list) it records a warning. :func:`handlerkit.worker.config.parse_config` runs it.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from handlerkit._text import suggestion
from handlerkit._validate import Findings, describe

__all__ = ["TORCHSERVE_PT2_BACKENDS", "Pt2Config", "Pt2Schema", "compile_modes"]

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
#: torch.compile's modes for the inductor backend when torch cannot be asked (torch 2.14's
#: ``torch._inductor.list_mode_options()``); :func:`compile_modes` asks the installed torch.
_COMPILE_MODES = ("default", "lite", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
_EXPORT_KEYS: dict[str, str] = {"aot_compile": "bool"}
_AOT_REASON = "pt2.export.aot_compile is true: a .so serialized file is loaded with AOTInductor"
_EXAMPLE = "pt2: {compile: {enable: true, backend: inductor}}"

Pt2Schema = Literal["none", "compile", "export", "legacy-str", "legacy-dict"]


@dataclass(frozen=True)
class Pt2Config:
    """What TorchServe 0.12's ``BaseHandler.initialize`` would do with the ``pt2`` section.

    Attributes:
        schema: ``"none"`` (no ``pt2``), ``"compile"`` (``pt2: {compile: {...}}``), ``"export"``
            (``pt2: {export: {...}}`` without ``compile``), ``"legacy-str"`` (``pt2: inductor``)
            or ``"legacy-dict"`` (``pt2: {backend: ..., mode: ...}``).
        compile: whether ``torch.compile`` is to be applied: requested by the config, and with
            arguments torch.compile accepts (an unknown keyword, ``mode`` with ``options``, or,
            for the inductor backend, a ``mode`` outside :func:`compile_modes` make
            torch.compile raise, and TorchServe then serves the model uncompiled). TorchServe
            also skips it when the backend is outside its list, or missing from torch: see
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
        """Whether TorchServe 0.12 would serve a compiled model, with the torch installed here.

        True when :attr:`compile` holds, the backend is in TorchServe's list
        (:attr:`backend_known_to_torchserve`) and the installed torch has it
        (``torch._dynamo.list_backends(exclude_tags=())``, asked lazily, only for a named
        backend). TorchServe's list holds backends today's torch lacks (``nvfuser``, ``ofi``,
        ``fx2trt``...): TorchServe calls ``torch.compile``, which raises ``InvalidBackend``, logs
        it and serves the model uncompiled, so this is False. False too when torch cannot be
        imported (TorchServe does not compile without it).
        """
        if not (self.compile and self.backend_known_to_torchserve):
            return False
        backends = _torch_backends()
        if backends is None:
            return False
        return self.backend is None or self.backend in backends

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


def _torch_importable() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


@functools.lru_cache(maxsize=1)
def compile_modes() -> tuple[str, ...]:
    """torch.compile's modes for the inductor backend: ``torch._inductor.list_mode_options()``.

    Asks the installed torch (imported here, not when this module is); falls back to the modes
    of torch 2.14 (``default``, ``lite``, ``reduce-overhead``, ``max-autotune-no-cudagraphs``,
    ``max-autotune``) when torch cannot be imported or has no such function.
    """
    if not _torch_importable():
        return _COMPILE_MODES
    try:
        import torch._inductor

        return tuple(torch._inductor.list_mode_options())
    except Exception:  # an old or broken torch: the static list is the best guess
        return _COMPILE_MODES


@functools.lru_cache(maxsize=1)
def _torch_backends() -> frozenset[str] | None:
    """The installed torch's compile backends (debug and experimental ones included), or None."""
    if not _torch_importable():
        return None
    try:
        import torch._dynamo

        return frozenset(torch._dynamo.list_backends(exclude_tags=()))
    except Exception:
        return None


def _flow(value: Any) -> str:
    """A value as one line of flow-style YAML, for messages."""
    import yaml  # lazily: keeps `import handlerkit` fast

    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10_000).strip()


def _unknown_keys(
    mapping: Mapping[Any, Any], known: tuple[str, ...], path: str, consequence: str, found: Findings
) -> list[str]:
    """Note each key of ``mapping`` outside ``known`` (with a did-you-mean); return them."""
    unknown = [k for k in mapping if k not in known]
    for key in unknown:
        hint = suggestion(key, known, prefix=True) if isinstance(key, str) else ""
        found.note(f"unknown key {path}.{key}{hint}; {consequence}")
    return [str(k) for k in unknown]


def _parse_pt2(value: Any, found: Findings) -> Pt2Config:
    """Mirror ``BaseHandler.initialize``'s reading of ``pt2`` (TorchServe 0.12)."""
    if isinstance(value, str):
        return _parse_legacy_str(value, found)
    if not isinstance(value, Mapping):
        crash = (
            "fails with ValueError 'pt2 should be str or dict'"
            if isinstance(value, list)
            else "fails with TypeError (it tests 'compile' in pt2)"
        )
        found.problem(
            "pt2",
            f"pt2 must be a backend name (string) or a mapping, got {describe(value)}; TorchServe 0.12 {crash}",
            fix=f"write {_EXAMPLE}",
        )
        return Pt2Config()

    aot_compile = False
    if "export" in value:
        export = value["export"]
        if found.check(export, "mapping", "pt2.export"):
            _unknown_keys(
                export, tuple(_EXPORT_KEYS), "pt2.export", "TorchServe 0.12 reads only pt2.export.aot_compile", found
            )
            if "aot_compile" in export and found.check(export["aot_compile"], "bool", "pt2.export.aot_compile"):
                aot_compile = export["aot_compile"]

    if "compile" in value:
        _unknown_keys(value, ("compile", "export"), "pt2", "TorchServe 0.12 ignores it next to pt2.compile", found)
        return _parse_compile_section(value["compile"], aot_compile, found)

    if "export" in value:
        _unknown_keys(value, ("compile", "export"), "pt2", "TorchServe 0.12 ignores it next to pt2.export", found)
        reason = "pt2.export without pt2.compile: TorchServe 0.12 does not call torch.compile"
        if aot_compile:
            reason += "; " + _AOT_REASON
        return Pt2Config(schema="export", aot_compile=aot_compile, reason=reason)

    # Legacy: the mapping itself is torch.compile's keyword arguments.
    options = dict(value)
    if "enable" in options:
        found.note(
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
    found.note(
        f"pt2: {_flow(options)} is the legacy schema (TorchServe 0.12 still compiles it but logs a "
        f"deprecation warning); write pt2: {_flow({'compile': {'enable': True, **options}})}"
    )
    return _compile_config("legacy-dict", options, found, deprecated=True, path="pt2")


def _parse_legacy_str(value: str, found: Findings) -> Pt2Config:
    # TorchServe tests `"compile" in pt2` and `"export" in pt2` before checking the type, so a
    # string is searched for those words as substrings.
    if "compile" in value:
        found.problem(
            "pt2",
            f"pt2 is the string {value!r}: TorchServe 0.12 looks for 'compile' in it, finds the "
            f"substring and fails with TypeError (string indices must be integers)",
            fix=f"write {_EXAMPLE}",
        )
        return Pt2Config()
    if "export" in value:
        found.note(
            f"pt2: {value!r} contains 'export', so TorchServe 0.12 takes it for the export "
            f"schema and does not compile; write pt2: {{export: {{aot_compile: true}}}} or "
            f"pt2: {{compile: {{enable: true, backend: ...}}}}"
        )
        return Pt2Config(
            schema="legacy-str", deprecated=True, reason=f"pt2: {value!r} is read as the export schema: not compiled"
        )
    found.note(
        f"pt2: {value!r} is the legacy schema (TorchServe 0.12 still compiles it but logs a "
        f"deprecation warning); write pt2: {{compile: {{enable: true, backend: {value}}}}}"
    )
    return _compile_config("legacy-str", {"backend": value}, found, deprecated=True, path="pt2")


def _parse_compile_section(section: Any, aot_compile: bool, found: Findings) -> Pt2Config:
    """``pt2.compile``: ``enable`` is required (TorchServe indexes it), the rest is torch.compile's."""
    if not found.check(section, "mapping", "pt2.compile"):
        return Pt2Config(schema="compile")
    if "enable" not in section:
        found.problem(
            "pt2.compile",
            "pt2.compile has no 'enable' key: TorchServe 0.12 fails with KeyError 'enable'",
            fix=(
                "add enable: true (or enable: false to switch compilation off), e.g. "
                f"pt2: {_flow({'compile': {'enable': True, **dict(section)}})}"
            ),
        )
        return Pt2Config(schema="compile")
    enable = section["enable"]
    options = {k: v for k, v in section.items() if k != "enable"}
    if not found.check(enable, "bool", "pt2.compile.enable"):
        return Pt2Config(schema="compile")
    if enable:
        return _compile_config("compile", options, found, deprecated=False, path="pt2.compile", aot_compile=aot_compile)
    # Type errors still count when compilation is off; warnings about unused options do not.
    _compile_config("compile", options, Findings(problems=found.problems), deprecated=False, path="pt2.compile")
    backend = options.get("backend")
    return Pt2Config(
        schema="compile",
        compile_options=copy.deepcopy(options),
        backend=backend if isinstance(backend, str) else None,
        aot_compile=aot_compile,
        reason="pt2.compile.enable is false: the model is not compiled",
    )


def _compile_config(
    schema: Pt2Schema,
    options: dict[str, Any],
    found: Findings,
    *,
    deprecated: bool,
    path: str,
    aot_compile: bool = False,
) -> Pt2Config:
    """A Pt2Config for a compile request with these torch.compile options."""
    for key, value in options.items():
        kind = _COMPILE_KWARGS.get(key) if isinstance(key, str) else None
        if kind is not None:
            found.check(value, kind, f"{path}.{key}")
    unknown = _unknown_keys(
        options,
        tuple(_COMPILE_KWARGS),
        path,
        "torch.compile has no such argument: it raises TypeError and TorchServe 0.12 serves the model uncompiled",
        found,
    )
    backend = options.get("backend")
    backend = backend if isinstance(backend, str) else None
    known = backend is None or backend in TORCHSERVE_PT2_BACKENDS
    blocked = _blocked(options, unknown, backend, path, found)
    if not known:
        found.note(
            f"{path}.backend: {backend!r} is not in TorchServe 0.12's backend list "
            f"(ts.utils.util.PT2Backend), so TorchServe skips compilation with only a log line "
            f"'{backend} is not a supported backend'; handlerkit compiles it if torch knows it"
        )

    origin = {
        "compile": "pt2.compile.enable is true",
        "legacy-str": f"pt2: {backend!r} (legacy schema)",
        "legacy-dict": "pt2 mapping without compile/export (legacy schema)",
    }.get(schema, path)
    if blocked:
        reason = f"{origin}, but {blocked}: torch.compile raises, so the model is not compiled"
    else:
        call = ", ".join(["model", *(f"{k}={v!r}" for k, v in options.items())])
        reason = f"{origin}: torch.compile({call})"
        if backend is None:
            reason += " with torch's default backend"
        if not known:
            reason += (
                f"; TorchServe 0.12 skips it because {backend!r} is not in its backend list, "
                f"handlerkit applies it if torch._dynamo.list_backends() has it"
            )
    if aot_compile:
        reason += "; " + _AOT_REASON
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


def _blocked(options: Mapping[str, Any], unknown: list[str], backend: str | None, path: str, found: Findings) -> str:
    """Why torch.compile would refuse these options ("" when it would not), noting it."""
    mode = options.get("mode")
    if unknown:
        return f"torch.compile has no argument {', '.join(map(repr, unknown))}"
    # torch.compile checks the mode only for inductor (its default backend); another backend
    # gets it as a keyword argument, unchecked.
    inductor = backend is None or backend == "inductor"
    modes = compile_modes() if inductor and isinstance(mode, str) else ()
    if inductor and isinstance(mode, str) and mode not in modes:
        hint = suggestion(mode, modes, cutoff=0.6, prefix=True)
        found.note(
            f"{path}.mode: {mode!r} is not one of {', '.join(modes)}{hint}; torch.compile (inductor) "
            f"raises and TorchServe 0.12 serves the model uncompiled"
        )
        return f"torch.compile does not know mode {mode!r}"
    if mode is not None and options.get("options") is not None:
        found.note(
            f"{path}: mode and options are both set; torch.compile refuses that and TorchServe 0.12 "
            f"serves the model uncompiled. Keep one of them"
        )
        return "torch.compile refuses mode and options together"
    return ""
