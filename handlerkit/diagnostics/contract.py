"""The worker's contract, checked before TorchServe turns a mistake into "worker died".

TorchServe 0.12 (``ts/service.py``, ``ts/protocol/otf_message_handler.py``) answers 503
"Invalid model predict output" when ``handle`` returns anything but a list, 503 "number of
batch response mismatched" when the list's length differs from the batch, and 503
"Unsupported model output data type." when an item is neither ``str``/``bytes`` nor
JSON-serialisable (``torch.Tensor`` items are sent as ``torch.save`` bytes). NaN is written
as ``NaN``, which strict JSON clients reject. The checks here say so, per request, with a fix.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from handlerkit._text import render_html, render_text

__all__ = ["Problem", "CheckReport", "check_output", "suggest_fix", "run_checks", "same_output"]


@dataclass
class Problem:
    """One broken rule: where, what, and how to fix it."""

    check: str
    message: str
    fix: str = ""
    stage: str | None = None
    request_index: int | None = None
    severity: str = "error"  # "error": TorchServe fails or clients break; "warning": surprising

    def __str__(self) -> str:
        where = f"{self.stage}: " if self.stage else ""
        req = f"request {self.request_index}: " if self.request_index is not None else ""
        fix = f" Fix: {self.fix}" if self.fix else ""
        return f"{where}{req}{self.message}.{fix}"


def _type_name(value: Any) -> str:
    from handlerkit.harness import describe

    return describe(value)


def check_output(output: Any, batch_size: int | None, stage: str = "handle") -> list[Problem]:
    """The rules ``Service.predict`` and ``create_predict_response`` apply to ``handle``'s return."""
    problems: list[Problem] = []
    if not isinstance(output, list):
        problems.append(
            Problem(
                "output-type",
                f"must return a list with one item per request, got {_type_name(output)} "
                "(TorchServe answers 503 'Invalid model predict output')",
                "return one item per request, e.g. output.tolist() for a tensor or [result] for a single dict",
                stage,
            )
        )
        return problems
    if batch_size is not None and len(output) != batch_size:
        problems.append(
            Problem(
                "output-count",
                f"must return one item per request: got {len(output)} item(s) for a batch of {batch_size} "
                "(TorchServe answers 503 'number of batch response mismatched')",
                "build the output list from the batch, one entry for every request in data",
                stage,
            )
        )
    for index, item in enumerate(output):
        if type(item) is dict and _json_trouble(item) is None:
            continue  # the usual item (a label → score dict) needs no more questions
        problems.extend(_check_item(item, index, stage))
    return problems


_JSON_LEAVES = frozenset({str, int, bool, type(None)})


def _json_trouble(value: Any, depth: int = 0) -> str | None:
    """Why ``json.dumps(value, allow_nan=False)`` would fail ("nan" / "type"), or None.

    A walk over the usual output shapes; far cheaper than encoding, which matters because the
    harness checks every postprocess output. Anything unusual is left to ``json.dumps``.
    """
    if value is None or isinstance(value, (str, bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else "nan"
    if depth > 50:
        return "type"  # json.dumps would recurse too deep as well
    if isinstance(value, dict):
        for key in value:
            if not (key is None or isinstance(key, (str, int, float, bool))):
                return "type"
        items: Any = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        items = None
    if items is not None:
        for item in items:
            kind = type(item)  # leaves (a label's score...) without a call
            if kind is float:
                if not math.isfinite(item):
                    return "nan"
            elif kind not in _JSON_LEAVES:
                trouble = _json_trouble(item, depth + 1)
                if trouble:
                    return trouble
        return None
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return "nan"
    except (TypeError, RecursionError):
        return "type"
    return None


def _check_item(item: Any, index: int, stage: str) -> list[Problem]:
    if isinstance(item, (str, bytes, bytearray)):
        return []
    if type(item).__module__.startswith("torch") and type(item).__name__ == "Tensor":
        return [
            Problem(
                "item-type",
                "the item is a Tensor, which TorchServe sends as torch.save bytes that an HTTP client cannot read as JSON",
                "convert it with .tolist() (or .item() for a scalar)",
                stage,
                index,
                severity="warning",
            )
        ]
    trouble = _json_trouble(item)
    if trouble == "nan":
        return [
            Problem(
                "item-nan",
                "the item contains NaN or Infinity, which TorchServe writes as NaN/Infinity: not valid JSON",
                "look for a division by zero or an empty softmax upstream; replace non-finite values before returning",
                stage,
                index,
            )
        ]
    if trouble == "type":
        try:
            json.dumps(item)
            detail = "a value or key json cannot encode"
        except (TypeError, ValueError, RecursionError) as exc:
            detail = str(exc)
        return [
            Problem(
                "item-serialisable",
                f"the item is not JSON-serialisable ({detail}); TorchServe answers 503 'Unsupported model output data type.' "
                "for the whole batch",
                "return lists, dicts with str keys, numbers and strings (tensor.tolist(), float(x))",
                stage,
                index,
            )
        ]
    return []


# (substrings of "ExceptionType: message", fix, the stages it applies to or None for all)
_FIXES: list[tuple[tuple[str, ...], str, tuple[str, ...] | None]] = [
    (("DecompressionBombError",), "send a smaller image, or MockContext(limit_max_image_pixels=False) for trusted sources", None),
    (("UnidentifiedImageError", "cannot identify image file"), "the request body is not an image: send PNG/JPEG bytes as the body or the 'data' field", None),
    (("image file is truncated", "broken data stream", "Truncated"), "the image is truncated or corrupt: re-send the complete file", None),
    (("UnicodeDecodeError",), "the body is not UTF-8: send text with content-type text/plain; charset=utf-8, or decode with errors='replace'", None),
    (("Expected all tensors to be on the same device", "device type"), "move the input to self.device in preprocess (or the model in initialize)", None),
    (("mat1 and mat2 shapes cannot be multiplied", "size mismatch", "shape", "Given groups", "expected input"), "the preprocessed tensor's shape does not fit the model: compare h.results['preprocess'].tensors with the model's expected input", None),
    (("NoneType' object is not callable", "'NoneType' object has no attribute"), "the model or a field is None: did initialize run and succeed? run h.initialize() first", None),
    (("KeyError",), "a request lacks the field the handler reads: TorchServe puts a raw body under 'body' and form fields under their names ('data')", ("preprocess", "handle")),
    (("stack expects each tensor to be equal size",), "preprocess must give every request the same shape: resize or pad in image_processing", None),
    (("out of memory", "MemoryError"), "lower the batch size or the input size (TorchServe answers 507)", None),
]


def suggest_fix(stage: str, exc: BaseException) -> str:
    """A short fix for the usual ways a stage fails; '' when nothing fits."""
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__ or exc.__context__
    if cause is not None:
        text += f" {type(cause).__name__}: {cause}"
    if "fix:" in str(exc):
        return ""  # handlerkit's own errors already carry their fix
    for needles, fix, stages in _FIXES:
        if (stages is None or stage in stages) and any(n in text for n in needles):
            return fix
    if stage == "initialize":
        return "check the model dir, manifest and model-config.yaml the context points at"
    return ""


# ---------------------------------------------------------------------------- comparison
def same_output(a: Any, b: Any, atol: float = 1e-4, rtol: float = 1e-4) -> bool:
    """Structural equality with a numeric tolerance (dict key order ignored)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
            return True
        return abs(a - b) <= atol + rtol * abs(b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_output(a[k], b[k], atol, rtol) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_output(x, y, atol, rtol) for x, y in zip(a, b))
    if hasattr(a, "shape") and hasattr(b, "shape"):
        import torch

        return bool(a.shape == b.shape and torch.allclose(a.float().cpu(), b.float().cpu(), atol=atol, rtol=rtol))
    return a == b


def _rounded(value: Any) -> Any:
    """Floats to 4 significant digits, so messages read well and stay stable across CPUs."""
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_rounded(v) for v in value)
    return value


def _short(value: Any, n: int = 80) -> str:
    text = repr(_rounded(value))
    return text if len(text) <= n else text[: n - 3] + "..."


# ---------------------------------------------------------------------------- the report
@dataclass
class CheckReport:
    """What :meth:`Harness.check` found: ``.ok`` is False when any error-level problem exists."""

    handler: str
    batch_size: int
    problems: list[Problem] = field(default_factory=list)
    statuses: list[tuple[int, Any]] = field(default_factory=list)
    encodings: list[tuple[int, str, str]] = field(default_factory=list)  # (request, variant, outcome)
    parity: list[tuple[int, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(p.severity == "error" for p in self.problems)

    def _rows(self) -> list[list[Any]]:
        rows: list[list[Any]] = []
        for p in self.problems:
            rows.append([p.severity, p.check, "" if p.request_index is None else p.request_index, p.message, p.fix])
        return rows

    def _summary(self) -> str:
        verdict = "ok" if self.ok else f"{sum(p.severity == 'error' for p in self.problems)} problem(s)"
        return f"check of {self.handler} on {self.batch_size} request(s): {verdict}"

    def __repr__(self) -> str:
        lines = [self._summary()]
        for p in self.problems:
            where = f"request {p.request_index}" if p.request_index is not None else "batch"
            lines.append(f"- {p.severity} [{p.check}] {where}: {p.message}")
            if p.fix:
                lines.append(f"    fix: {p.fix}")
        tables = []
        if self.encodings:
            tables.append(render_text(["request", "encoding", "outcome"], [list(e) for e in self.encodings]))
        if self.parity:
            tables.append(render_text(["request", "batch parity"], [list(p) for p in self.parity]))
        return "\n\n".join(["\n".join(lines), *tables])

    def _repr_html_(self) -> str:
        parts = [f"<p><b>{self._summary()}</b></p>"]
        if self.problems:
            parts.append(render_html(["severity", "check", "request", "problem", "fix"], self._rows()))
        if self.encodings:
            parts.append(render_html(["request", "encoding", "outcome"], [list(e) for e in self.encodings]))
        if self.parity:
            parts.append(render_html(["request", "batch parity"], [list(p) for p in self.parity]))
        return "".join(parts)


@contextlib.contextmanager
def _preserved(harness: Any) -> Iterator[None]:
    """Checks run extra batches; the harness's results and batch are put back after."""
    results, batch = dict(harness.results), harness.batch
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        harness.results.clear()
        harness.results.update(results)
        harness.batch = batch
        if batch is not None:
            batch.bind(harness.context)


def _run_output(harness: Any, batch: Any) -> tuple[Any, BaseException | None]:
    from handlerkit.errors import StageError

    try:
        return harness.run(batch).output, None
    except StageError as exc:
        return None, exc


def run_checks(harness: Any, batch: Any, atol: float = 1e-4, rtol: float = 1e-4) -> CheckReport:
    """Run the batch, then each request alone and in other encodings, and compare."""
    from handlerkit.requests import Batch

    report = CheckReport(handler=harness.name, batch_size=len(batch))
    with _preserved(harness):
        full, error = _run_output(harness, batch)
        if error is not None:
            report.problems.append(
                Problem("runs", str(error).splitlines()[0], _fix_of(error), getattr(error, "stage", None), getattr(error, "request_index", None))
            )
            return report
        report.problems.extend(
            p if isinstance(p, Problem) else Problem("handle", str(p), stage="handle")
            for p in check_output(full, len(batch), stage="handle")
        )
        report.statuses = [harness.context.get_response_status(i) for i in range(len(batch))]
        for i, (code, _phrase) in enumerate(report.statuses):
            if not isinstance(code, int) or not 100 <= code <= 599:
                report.problems.append(
                    Problem("status", f"response status {code!r} is not an HTTP status code", "use context.set_response_status(code, phrase, idx) with 100..599", "handle", i)
                )
        if not isinstance(full, list) or len(full) != len(batch):
            return report  # parity and encodings compare per-request items
        singles = []
        parts = batch.split()
        for i, part in enumerate(parts):
            alone, err = _run_output(harness, part)
            singles.append(alone[0] if err is None and isinstance(alone, list) and alone else None)
            if err is not None:
                report.parity.append((i, f"fails alone: {str(err).splitlines()[0]}"))
                report.problems.append(Problem("batch-parity", f"fails alone but not in the batch: {err}", "", getattr(err, "stage", None), i))
        for i, alone in enumerate(singles):
            if alone is None:
                continue
            if same_output(alone, full[i], atol, rtol):
                report.parity.append((i, "same alone and in the batch"))
                continue
            moved = [j for j, item in enumerate(full) if j != i and same_output(alone, item, atol, rtol)]
            if moved:
                message = f"alone it gives the output that the batch returns at position {moved[0]}: outputs come back in the wrong order"
            else:
                message = f"alone gives {_short(alone)}, in the batch {_short(full[i])}"
            report.parity.append((i, message))
            report.problems.append(
                Problem(
                    "batch-parity",
                    message,
                    "keep requests independent: no statistics over the batch (BatchNorm in train mode, "
                    "normalising by the batch max, padding to the longest request); keep outputs in request order",
                    "handle",
                    i,
                )
            )
        for i, part in enumerate(parts):
            baseline = singles[i]
            if baseline is None:
                continue
            for variant, data in _encodings(part.data[0]):
                out, err = _run_output(harness, Batch.coerce([data], decode=batch.decode))
                outcome = _judge(out, err, baseline, atol, rtol)
                report.encodings.append((i, variant, outcome[0]))
                if outcome[1] is not None:
                    report.problems.append(Problem("encoding", f"as {variant}: {outcome[1]}", outcome[2], "handle", i, severity="warning"))
    return report


def _fix_of(error: BaseException) -> str:
    text = str(error)
    return text.split("fix:", 1)[1].strip() if "fix:" in text else ""


def _encodings(row: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The same payload as TorchServe clients send it in other ways."""
    name, value = next(iter(row.items())) if row else ("body", None)
    other = "data" if name == "body" else "body"
    yield f"field '{other}' instead of '{name}'", {other: value}
    if isinstance(value, bytearray):
        yield "bytes instead of bytearray", {name: bytes(value)}
        yield "base64 str (JSON clients)", {name: base64.b64encode(bytes(value)).decode("ascii")}
    elif isinstance(value, (dict, list)):
        yield "raw JSON bytes (no content-type)", {name: bytearray(json.dumps(value).encode("utf-8"))}
    elif isinstance(value, str):
        yield "raw bytes (no content-type)", {name: bytearray(value.encode("utf-8"))}


def _judge(out: Any, err: BaseException | None, baseline: Any, atol: float, rtol: float) -> tuple[str, str | None, str]:
    from handlerkit.errors import HandlerkitError

    if err is not None:
        original = getattr(err, "original", None)
        if isinstance(original, (HandlerkitError, ValueError, TypeError)) and "fix" in str(original).lower():
            return f"refused clearly: {str(original).splitlines()[0][:90]}", None, ""
        return (
            f"fails: {type(original).__name__ if original else 'error'}",
            f"the handler fails with {type(original).__name__}: {original}",
            "accept this encoding or refuse it with an error that says what to send",
        )
    item = out[0] if isinstance(out, list) and out else out
    if same_output(item, baseline, atol, rtol):
        return "same output", None, ""
    return "different output", f"gives {_short(item)} instead of {_short(baseline)}", "decode every accepted encoding to the same input"
