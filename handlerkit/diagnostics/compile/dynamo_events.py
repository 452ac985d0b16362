"""torch.compile's own records of what it did, captured in-process while a report runs.

Dynamo writes structured records to the logger ``torch.__trace`` (what ``TORCH_TRACE`` and
tlparse read): a ``compilation_metrics`` record per compiled frame (times, graph size, the
recompile reason, a failure), a ``dynamo_graph_break_reason`` artifact per graph break, a
``create_symbol`` record per dimension made dynamic and a ``symbolic_shape_specialization``
record per dimension pinned to one size (read by :mod:`._specialisations`). The graph-break
artifact is written while Dynamo handles its ``Unsupported`` exception, so that exception
(graph-break type, message, the user's stack) is at hand in the handler and is read instead of
the formatted text.

:class:`DynamoEvents` adds a handler to that logger while open and removes it after; the logger
never propagates and torch keeps its own handler there, so nothing else changes (its level is
raised to DEBUG only when something lowered it, and put back). Every private name is looked up
guarded: a torch without one gives fewer facts, never an error. Where no record arrives,
``torch._dynamo.utils.get_compilation_metrics()`` (the newest 64 frames) is read instead.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import linecache
import logging
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CompiledFrame",
    "CountersKept",
    "DynamoEvents",
    "GraphBreak",
    "Recompile",
    "dynamic_dims",
    "graph_breaks",
    "recompiles",
    "user_frame",
    "where",
]

_METRIC_KEYS = (
    "compile_id",
    "co_name",
    "co_filename",
    "co_firstlineno",
    "graph_op_count",
    "entire_frame_compile_time_s",
    "backend_compile_time_s",
    "inductor_compile_time_s",
    "recompile_reason",
    "fail_type",
    "fail_reason",
    "fail_user_frame_filename",
    "fail_user_frame_lineno",
    "inductor_fx_local_cache_hit_count",
    "inductor_fx_local_cache_miss_count",
    "restart_reasons",
)
_RESUME = re.compile(r"^torch_dynamo_resume_in_(.+)_at_(\d+)$")
_DOC_URL = re.compile(r"https?://\S+?/gb(\d{4})\.html")
_PAYLOAD_AT = re.compile(r"^Graph break in user code at (.+):(\d+)\s*$", re.MULTILINE)
_CACHE_ARTIFACT = re.compile(r"^(fx_graph|aotautograd)_cache_(hit|miss|bypass)$")
_SIZE_SOURCE = re.compile(r"^L\['([^']+)'\]\.size\(\)\[(\d+)\]$")


def where(file: str | None, line: int | None) -> str:
    """``file:line`` (``file`` without a line; ``""`` without a file), as reports show a place."""
    if file is None:
        return ""
    return f"{file}:{line}" if line is not None else file


@dataclass(frozen=True)
class CompiledFrame:
    """One frame Dynamo compiled (a graph, or the code around it).

    Attributes:
        compile_id: ``"frame/compile"``: ``"0/0"`` is frame 0's first compile, ``"0/1"`` its
            first recompile.
        function: the compiled function; code resumed after a graph break reads
            ``"forward (resumed at line 13)"``.
        file / line: where the function is defined.
        graph_ops: operators in its FX graph (None: no graph was captured).
        compile_s / backend_s / inductor_s: the whole compile, the backend's share of it, and
            Inductor's share of the backend's (None where torch did not say).
        recompile_reason: why an existing compile could not be reused (recompiles only).
        failure: ``"Type: message"`` when compiling it failed.
        cache_hits / cache_misses: Inductor FX graph cache lookups.
        fx_graph_cache / aot_autograd_cache: what Inductor's FX graph cache and the AOTAutograd
            cache did for this frame's graph: ``"hit"``, ``"miss"`` or ``"bypass: <reason>"``
            (None: the cache was not consulted, e.g. another backend).
    """

    compile_id: str
    function: str
    file: str | None = None
    line: int | None = None
    graph_ops: int | None = None
    compile_s: float | None = None
    backend_s: float | None = None
    inductor_s: float | None = None
    recompile_reason: str | None = None
    failure: str | None = None
    cache_hits: int | None = None
    cache_misses: int | None = None
    fx_graph_cache: str | None = None
    aot_autograd_cache: str | None = None

    @property
    def cache_hit(self) -> bool:
        """The compiled graph was loaded from Inductor's FX graph cache, not compiled cold (from the
        cache artifact, else from the metrics' hit count)."""
        if self.fx_graph_cache is not None:
            return self.fx_graph_cache == "hit"
        return bool(self.cache_hits) and not self.cache_misses

    @property
    def is_recompile(self) -> bool:
        return not self.compile_id.endswith("/0")


@dataclass
class GraphBreak:
    """A graph break, once per place and reason.

    Attributes:
        reason: the graph-break type (``"Unsupported Tensor.item() call with
            capture_scalar_outputs=False"``), else the first line of Dynamo's message.
        file / line / source: the innermost frame outside torch where it happened, and that
            line's text.
        explanation / hint: Dynamo's words for it (the registry's when the message has none).
        code: the graph-break code (``"GB0124"``) when this torch has the registry.
        doc_url: its documentation page.
        count: how many times Dynamo met it (once per compile of the frame).
    """

    reason: str
    file: str | None = None
    line: int | None = None
    source: str | None = None
    explanation: str | None = None
    hint: str | None = None
    code: str | None = None
    doc_url: str | None = None
    count: int = 1

    @property
    def where(self) -> str:
        return where(self.file, self.line)


@dataclass(frozen=True)
class Recompile:
    """A frame compiled again because the guards of its earlier compiles failed."""

    compile_id: str
    function: str
    reason: str
    file: str | None = None
    line: int | None = None


# ---------------------------------------------------------------------------- capture
class _Collector(logging.Handler):
    """Keeps the few records a report reads; anything it cannot read is skipped, never raised."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.metrics: list[dict[str, Any]] = []
        self.breaks: list[dict[str, Any]] = []
        self.symbols: list[str] = []
        self.specialised: list[dict[str, Any]] = []  # symbolic_shape_specialization (see _specialisations)
        self.caches: dict[str, dict[str, str]] = {}  # compile id -> {"fx_graph": "hit", ...}

    def emit(self, record: logging.LogRecord) -> None:
        try:
            meta = getattr(record, "metadata", None)
            if not isinstance(meta, dict):
                return
            if "compilation_metrics" in meta:
                found = meta["compilation_metrics"]
                self.metrics.append({k: found.get(k) for k in _METRIC_KEYS})
            elif "artifact" in meta:
                name = (meta["artifact"] or {}).get("name")
                if name == "dynamo_graph_break_reason":
                    self.breaks.append(_raw_break(getattr(record, "payload", None), sys.exc_info()[1]))
                elif isinstance(name, str) and _CACHE_ARTIFACT.match(name):
                    self._cache_event(meta, name, getattr(record, "payload", None))
            elif isinstance(meta.get("symbolic_shape_specialization"), dict):
                self.specialised.append(meta["symbolic_shape_specialization"])
            elif "create_symbol" in meta:
                source = (meta["create_symbol"] or {}).get("source")
                if isinstance(source, str):
                    self.symbols.append(source)
        except Exception:  # a record we cannot read must never break the model's compile
            pass

    def _cache_event(self, meta: dict[str, Any], name: str, payload: Any) -> None:
        """``fx_graph_cache_hit`` / ``aotautograd_cache_bypass`` ...: the state, and a bypass's reason."""
        cache, state = _CACHE_ARTIFACT.match(name).groups()  # type: ignore[union-attr]  # matched by the caller
        if state == "bypass":
            info = json.loads(payload) if isinstance(payload, str) else {}
            state = f"bypass: {info.get('cache_bypass_reason') or 'torch gave no reason'}"
        compile_id = f"{meta.get('frame_id')}/{meta.get('frame_compile_id')}"
        self.caches.setdefault(compile_id, {})[cache] = state


def _raw_break(payload: Any, exc: BaseException | None) -> dict[str, Any]:
    """What a graph break says: from the ``Unsupported`` being handled, else from the payload."""
    raw: dict[str, Any] = {"gb_type": None, "message": None, "stack": [], "at": None}
    if exc is not None and hasattr(exc, "gb_type"):
        raw["gb_type"] = getattr(exc, "gb_type", None) or None
        raw["message"] = getattr(exc, "msg", None) or str(exc)
        raw["stack"] = [
            (f.filename, f.lineno, getattr(f, "line", None)) for f in (getattr(exc, "real_stack", None) or [])
        ]
    if isinstance(payload, str):
        match = _PAYLOAD_AT.search(payload)
        if match:
            raw["at"] = (match.group(1), int(match.group(2)))
        if raw["message"] is None:
            head, _, rest = payload.partition("Graph Break Reason:")
            raw["message"] = rest.split("\nUser code traceback:")[0].strip() if rest else head.strip()
    return raw


def _trace_logger() -> logging.Logger:
    internal = sys.modules.get("torch._logging._internal")
    logger = getattr(internal, "trace_log", None)
    return logger if isinstance(logger, logging.Logger) else logging.getLogger("torch.__trace")


def _metrics_now() -> list[Any]:
    try:
        from torch._dynamo.utils import get_compilation_metrics

        return list(get_compilation_metrics())
    except Exception:
        return []


def _said_by_the_report(record: logging.LogRecord) -> bool:
    """Drops Dynamo's stderr warning of a graph break the report records (said once, there)."""
    return not (record.levelno == logging.WARNING and "Graph break" in record.getMessage())


class DynamoEvents:
    """Collects the compiles, graph breaks and dynamic dimensions of the code run while open
    (it may be opened again: what it saw adds up)."""

    def __init__(self) -> None:
        self._collector = _Collector()
        self._logger: logging.Logger | None = None
        self._level: int | None = None
        self._before: list[Any] = []
        self._after: list[Any] | None = None
        self._quieted: list[logging.Handler] = []

    def __enter__(self) -> DynamoEvents:
        self._before = _metrics_now()
        logger = self._logger = _trace_logger()
        logger.addHandler(self._collector)
        if not logger.isEnabledFor(logging.DEBUG):
            self._level = logger.level
            logger.setLevel(logging.DEBUG)
        self._quieted = list(logging.getLogger("torch._dynamo").handlers)
        for handler in self._quieted:
            handler.addFilter(_said_by_the_report)
        return self

    def __exit__(self, *exc: object) -> None:
        for handler in self._quieted:
            handler.removeFilter(_said_by_the_report)
        self._quieted = []
        if self._logger is not None:
            self._logger.removeHandler(self._collector)
            if self._level is not None:
                self._logger.setLevel(self._level)
        if not self._collector.metrics:  # no record came: read the metrics torch keeps instead
            seen = {id(m) for m in self._before}
            self._after = (self._after or []) + [m for m in _metrics_now() if id(m) not in seen]
        self._before = []

    @property
    def frames(self) -> list[CompiledFrame]:
        """The frames compiled while open, in order."""
        found = self._collector.metrics or self._after or []
        caches = self._collector.caches
        frames = [_frame(m) for m in found]
        return [
            dataclasses.replace(
                f,
                fx_graph_cache=caches.get(f.compile_id, {}).get("fx_graph"),
                aot_autograd_cache=caches.get(f.compile_id, {}).get("aotautograd"),
            )
            if f.compile_id in caches
            else f
            for f in frames
        ]

    @property
    def breaks(self) -> list[dict[str, Any]]:
        """Graph breaks as met (see :func:`graph_breaks` to deduplicate them)."""
        if self._collector.breaks:
            return list(self._collector.breaks)
        # No artifact records: the metrics' restart reasons still say why (without a place).
        return [
            {"gb_type": None, "message": str(reason), "stack": [], "at": None}
            for m in (self._after or [])
            for reason in (_get(m, "restart_reasons") or ())
        ]

    @property
    def symbols(self) -> list[str]:
        return list(self._collector.symbols)

    @property
    def specialised(self) -> list[dict[str, Any]]:
        return list(self._collector.specialised)


def _get(metrics: Any, key: str) -> Any:
    return metrics.get(key) if isinstance(metrics, dict) else getattr(metrics, key, None)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _frame(m: Any) -> CompiledFrame:
    name = str(_get(m, "co_name") or "?")
    resumed = _RESUME.match(name)
    if resumed:
        name = f"{resumed.group(1)} (resumed at line {resumed.group(2)})"
    fail_type, fail_reason = _get(m, "fail_type"), _get(m, "fail_reason")
    failure = f"{fail_type}: {fail_reason}" if fail_type else None
    hits, misses = _get(m, "inductor_fx_local_cache_hit_count"), _get(m, "inductor_fx_local_cache_miss_count")
    ops = _get(m, "graph_op_count")
    line = _get(m, "co_firstlineno")
    return CompiledFrame(
        compile_id=str(_get(m, "compile_id") or "?"),
        function=name,
        file=_get(m, "co_filename"),
        line=line if isinstance(line, int) else None,
        graph_ops=ops if isinstance(ops, int) else None,
        compile_s=_number(_get(m, "entire_frame_compile_time_s")),
        backend_s=_number(_get(m, "backend_compile_time_s")),
        inductor_s=_number(_get(m, "inductor_compile_time_s")),
        recompile_reason=_get(m, "recompile_reason") or None,
        failure=failure,
        cache_hits=hits if isinstance(hits, int) else None,
        cache_misses=misses if isinstance(misses, int) else None,
    )


def recompiles(frames: list[CompiledFrame]) -> list[Recompile]:
    """The frames that were recompiles, with their reasons."""
    return [
        Recompile(f.compile_id, f.function, f.recompile_reason or "(torch gave no reason)", f.file, f.line)
        for f in frames
        if f.is_recompile
    ]


# ---------------------------------------------------------------------------- graph breaks
@functools.lru_cache(maxsize=1)
def _registry() -> dict[str, tuple[str, dict[str, Any]]]:
    """graph-break type -> (code, entry) from ``torch/_dynamo/graph_break_registry.json``."""
    try:
        import torch._dynamo

        path = os.path.join(os.path.dirname(torch._dynamo.__file__), "graph_break_registry.json")
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except Exception:  # an older torch has no registry: no codes, the message still says a lot
        return {}
    mapping: dict[str, tuple[str, dict[str, Any]]] = {}
    for code, entries in data.items() if isinstance(data, dict) else ():
        for entry in entries if isinstance(entries, list) else ():
            if isinstance(entry, dict) and isinstance(entry.get("Gb_type"), str):
                mapping[entry["Gb_type"]] = (str(code), entry)
    return mapping


def _torch_dir() -> str:
    torch = sys.modules.get("torch")
    path = getattr(torch, "__file__", None)
    return os.path.dirname(os.path.abspath(path)) + os.sep if path else "\0"


def user_frame(stack: list[tuple[str, int, str | None]]) -> tuple[str, int, str | None] | None:
    """The innermost frame outside torch (the user's line), else the innermost one."""
    if not stack:
        return None
    inside = _torch_dir()
    for frame in reversed(stack):
        if not os.path.abspath(frame[0]).startswith(inside):
            return frame
    return stack[-1]


def _labelled(message: str, label: str) -> str | None:
    """The text after ``label:`` on the message's lines that carry it, joined."""
    lines = (line.strip() for line in message.splitlines())
    found = [line[len(label) + 1 :].strip() for line in lines if line.startswith(label + ":")]
    return " ".join(found) or None


def _squash(text: str | None) -> str | None:
    return " ".join(text.split()) if text else None


def graph_breaks(raw_breaks: list[dict[str, Any]]) -> list[GraphBreak]:
    """Graph breaks deduplicated by (reason, file, line), in the order first met."""
    out: dict[tuple[Any, ...], GraphBreak] = {}
    registry = _registry() if raw_breaks else {}
    for raw in raw_breaks:
        message = raw.get("message") or ""
        gb_type = raw.get("gb_type")
        reason = gb_type or next((line.strip() for line in message.splitlines() if line.strip()), "graph break")
        frame = user_frame(raw.get("stack") or [])
        file, line, source = frame if frame is not None else (*(raw.get("at") or (None, None)), None)
        key = (reason, file, line)
        if key in out:
            out[key].count += 1
            continue
        if source is None and file is not None and line is not None:
            source = linecache.getline(file, line).strip() or None
        code, entry = registry.get(gb_type, (None, {})) if gb_type else (None, {})
        url = _DOC_URL.search(message)
        if url is not None:
            code = code or f"GB{url.group(1)}"
        hint = _labelled(message, "Hint") or _squash(" ".join(entry.get("Hints") or ()))
        out[key] = GraphBreak(
            reason=reason,
            file=file,
            line=line,
            source=source,
            explanation=_labelled(message, "Explanation") or _squash(entry.get("Explanation")),
            hint=hint,
            code=code,
            doc_url=url.group(0) if url is not None else _doc_link(gb_type),
        )
    return list(out.values())


def _doc_link(gb_type: str | None) -> str | None:
    if not gb_type:
        return None
    try:
        from torch._dynamo.exc import get_gbid_documentation_link

        return get_gbid_documentation_link(gb_type)
    except Exception:
        return None


def dynamic_dims(symbols: list[str]) -> list[str]:
    """``L['x'].size()[0]`` -> ``x: dim 0``, once each, for the sizes Dynamo made symbolic."""
    out: dict[str, None] = {}
    for source in symbols:
        match = _SIZE_SOURCE.match(source)
        if match:
            out[f"{match.group(1)}: dim {match.group(2)}"] = None
    return list(out)


# ---------------------------------------------------------------------------- counters
class CountersKept:
    """Puts ``torch._dynamo.utils.counters`` back as they were at :meth:`keep` when closed
    (the same Counter objects, refilled), so the report's extra runs leave no trace there."""

    def __init__(self) -> None:
        self._saved: dict[str, Any] | None = None

    def keep(self) -> None:
        counters = self._counters()
        self._saved = copy.deepcopy(dict(counters)) if counters is not None else None

    def restore(self) -> None:
        counters = self._counters()
        if counters is None or self._saved is None or dict(counters) == self._saved:
            return
        for name in [n for n in counters if n not in self._saved]:
            del counters[name]
        for name, saved in self._saved.items():
            counter = counters[name]
            counter.clear()
            counter.update(saved)

    @staticmethod
    def _counters() -> Any:
        utils = sys.modules.get("torch._dynamo.utils")
        counters = getattr(utils, "counters", None)
        return counters if isinstance(counters, dict) else None
