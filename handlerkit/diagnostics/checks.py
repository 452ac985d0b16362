"""``Harness.check``: the contract on a real batch, batch parity, and other encodings of each request.

The batch runs through ``handle``; its output and statuses are checked against the worker's
rules (:mod:`handlerkit.worker.contract`); each request then runs alone and must give what it gave in
the batch (batch parity, by :mod:`handlerkit._compare`'s rule, the one golden files use too);
and each request is re-sent the other ways TorchServe clients send the same payload (another
field name, ``bytes``, base64, raw JSON bytes).

Parity is only judged where it can be: every run starts from the same RNG seed (and the RNG
states are put back after), and the batch is run twice more first — with the same seed, to see
whether the handler keeps state across calls (a stateful handler, ``examples/stateful``), and
with another seed, to see whether its outputs depend on random numbers it draws per batch
(``examples/dcgan_fashiongen``). Either way the report says "cannot judge" and why, instead of
blaming the handler for a difference it means to make.
"""

from __future__ import annotations

import base64
import contextlib
import json
import random
import re
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from handlerkit._compare import same_output, shown
from handlerkit._progress import Bar
from handlerkit._render import Rendered, Table
from handlerkit.diagnostics._view import HarnessView
from handlerkit.diagnostics.runs import diagnostic_runs, ensure_initialized
from handlerkit.errors import StageError
from handlerkit.worker.contract import Problem, check_output, check_statuses, response_statuses

__all__ = ["CheckReport", "run_checks", "same_output"]  # same_output: handlerkit._compare's, kept importable here

_SEED = 20_240_917


# ---------------------------------------------------------------------------- messages
def _rounded(value: Any) -> Any:
    """Floats to 4 significant digits, so messages read well and stay stable across CPUs."""
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_rounded(v) for v in value)
    return value


def _short(value: Any) -> str:
    return shown(_rounded(value), 80)


# ---------------------------------------------------------------------------- the report
@dataclass(repr=False)
class CheckReport(Rendered):
    """What :meth:`Harness.check` found: ``.ok`` is False when any error-level problem exists.

    Attributes:
        handler / batch_size: what was checked.
        problems: every broken rule, as :class:`~handlerkit.worker.contract.Problem` (with its fix).
        statuses: per request, the ``(code, phrase)`` the handler set.
        encodings: ``(request, variant, outcome)`` for each other encoding tried.
        parity: ``(request, verdict)``: same alone and in the batch, different, or
            "cannot judge: <why>".
        notes: facts about how the checks ran (state or randomness found).
    """

    handler: str
    batch_size: int
    problems: list[Problem] = field(default_factory=list)
    statuses: list[tuple[int, Any]] = field(default_factory=list)
    encodings: list[tuple[int, str, str]] = field(default_factory=list)
    parity: list[tuple[int, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(p.severity == "error" for p in self.problems)

    def _summary(self) -> str:
        errors = sum(p.severity == "error" for p in self.problems)
        warned = len(self.problems) - errors
        verdict = "ok" if self.ok else f"{errors} problem(s)"
        also = f", {warned} warning(s)" if warned else ""
        return f"check of {self.handler} on {self.batch_size} request(s): {verdict}{also}"

    def _tables(self) -> list[Table]:
        # A problem is said once, in the problems table; what passed is one line per check.
        merged: dict[tuple[str, str, str, str], list[int]] = {}
        for p in self.problems:  # the same problem of several requests: one row naming them all
            ids = merged.setdefault((p.severity, p.check, p.message, p.fix), [])
            if p.request_index is not None:
                ids.append(p.request_index)
        problems = [
            [sev, check, ", ".join(map(str, ids)), message, fix] for (sev, check, message, fix), ids in merged.items()
        ]
        return [
            Table(("severity", "check", "request", "problem", "fix"), problems, "problems"),
            Table(("", ""), self._passed(), "passed"),
        ]

    def _passed(self) -> list[tuple[str, str]]:
        """One row per check that passed, saying for which requests."""
        rows = []
        same = [i for i, verdict in self.parity if verdict == "same alone and in the batch"]
        if same:
            rows.append(("batch parity", f"{_which(same, self.batch_size)}: same alone and in the batch"))
        by_variant: dict[tuple[str, str], list[int]] = {}
        for i, variant, outcome in self.encodings:
            if outcome == "same output" or outcome.startswith("refused clearly"):
                kind = "same output" if outcome == "same output" else "refused clearly"
                by_variant.setdefault((kind, variant), []).append(i)
        for kind in ("same output", "refused clearly"):
            shown = [
                f"{variant} ({_which(ids, self.batch_size)})" for (k, variant), ids in by_variant.items() if k == kind
            ]
            if shown:
                rows.append((f"encodings: {kind}", "; ".join(shown)))
        return rows

    def _notes(self) -> list[str]:
        return list(self.notes)


def _which(indices: list[int], batch_size: int) -> str:
    """``every request`` or ``request(s) 0, 2``."""
    if len(indices) == batch_size:
        return "every request" if batch_size > 1 else "the request"
    return f"request(s) {', '.join(map(str, indices))}"


# ---------------------------------------------------------------------------- running
@contextlib.contextmanager
def _rng_states() -> Iterator[None]:
    """Put the Python, NumPy and torch random states back after the checks' seeded runs."""
    python_state = random.getstate()
    numpy: Any = sys.modules.get("numpy")
    numpy_state = numpy.random.get_state() if numpy is not None else None
    torch: Any = sys.modules.get("torch")
    torch_state = torch.random.get_rng_state() if torch is not None else None
    cuda_states = torch.cuda.get_rng_state_all() if torch is not None and torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        random.setstate(python_state)
        if numpy_state is not None:
            numpy.random.set_state(numpy_state)
        if torch_state is not None:
            torch.random.set_rng_state(torch_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)


def _seed(seed: int) -> None:
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)  # every device's generator


def _run_output(harness: HarnessView, batch: Any, seed: int = _SEED) -> tuple[Any, StageError | None]:
    _seed(seed)
    try:
        return harness.run(batch).output, None
    except StageError as exc:
        return None, exc


def _first_line(error: StageError) -> str:
    return error.message.splitlines()[0]


_REQUEST_0 = re.compile(r"\brequest 0\b")


def _alone(text: str, index: int) -> str:
    """A message from request ``index`` run alone, a batch of one where it is request 0 (the
    handler's ``f"request {i}: ..."`` and the harness's ``for request 0``), naming it as the
    batch does: ``request 0`` is ``request <index>``."""
    return _REQUEST_0.sub(f"request {index}", text) if index else text


def _runs_problem(error: StageError) -> Problem:
    """The batch cannot run (or the handler cannot initialize): nothing else can be checked."""
    return Problem("runs", _first_line(error), error.fix or "", error.stage, error.request_index)


def run_checks(
    harness: HarnessView, batch: Any, atol: float = 1e-4, rtol: float = 1e-4, progress: bool | None = None
) -> CheckReport:
    """Run the batch, then each request alone and in other encodings, and compare.

    ``progress``: one bar over the phases (the batch, the gate, parity, encodings)."""
    with Bar(4, f"check {harness.name}: the batch", progress) as shown:
        return _run_checks(harness, batch, atol, rtol, shown)


def _run_checks(harness: HarnessView, batch: Any, atol: float, rtol: float, shown: Bar) -> CheckReport:
    from handlerkit.worker.batches import Batch

    report = CheckReport(handler=harness.name, batch_size=len(batch))
    try:
        ensure_initialized(harness)
    except StageError as failed:
        report.problems.append(_runs_problem(failed))
        return report
    with diagnostic_runs(harness), _rng_states(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full, error = _run_output(harness, batch)
        shown.update()
        if error is not None:
            report.problems.append(_runs_problem(error))
            return report
        report.problems.extend(check_output(full, len(batch), stage="handle"))
        report.statuses = response_statuses(harness.context, len(batch))
        report.problems.extend(check_statuses(report.statuses))
        shown.set_description(f"check {harness.name}: recompile gate")
        _recompile_gate(harness, batch, report)
        shown.update()
        if not isinstance(full, list) or len(full) != len(batch):
            return report  # parity and encodings compare per-request items
        reason = _why_parity_cannot_be_judged(harness, batch, full, atol, rtol)
        parts = batch.split()
        if reason is not None:
            report.notes.append(f"batch parity and encodings not judged: {reason}")
            report.parity = [(i, f"cannot judge: {reason}") for i in range(len(parts))]
            return report
        shown.set_description(f"check {harness.name}: each request alone")
        singles = _parity(harness, parts, full, report, atol, rtol)
        shown.update()
        shown.set_description(f"check {harness.name}: other encodings")
        for i, part in enumerate(parts):
            baseline = singles[i]
            if baseline is None:
                continue
            for variant, data in _encodings(part.data[0]):
                out, err = _run_output(harness, Batch.coerce([data], decode=batch.decode))
                outcome, message, fix = _judge(out, err, baseline, atol, rtol, i)
                report.encodings.append((i, variant, outcome))
                if message is not None:
                    report.problems.append(
                        Problem("encoding", f"as {variant}: {message}", fix, "handle", i, severity="warning")
                    )
        shown.update()
    return report


def _recompile_gate(harness: HarnessView, batch: Any, report: CheckReport) -> None:
    """For a compiled model only (nothing runs otherwise): would the batch sizes production can
    send recompile? (:mod:`handlerkit.diagnostics.compile.gate`)"""
    from handlerkit.diagnostics.compile.gate import check_sizes, eager_model, gate_problems, run_gate

    if eager_model(getattr(harness.handler, "model", None)) is None:
        return
    sizes = check_sizes(harness, batch)
    results, _ = run_gate(harness, batch, sizes)
    report.problems.extend(gate_problems(results))
    report.notes.append(f"recompile gate: batch sizes {', '.join(map(str, sizes))} replayed under fail_on_recompile")


def _why_parity_cannot_be_judged(harness: HarnessView, batch: Any, full: Any, atol: float, rtol: float) -> str | None:
    """Why comparing requests alone with the batch would prove nothing, or None."""
    again, error = _run_output(harness, batch)
    if error is not None or not same_output(again, full, atol, rtol):
        return "the same batch gives different outputs twice in a row from the same seed: the handler keeps state across calls"
    reseeded, error = _run_output(harness, batch, seed=_SEED + 1)
    if error is not None or not same_output(reseeded, full, atol, rtol):
        return "the outputs change with the random seed: the handler draws random numbers per batch"
    return None


def _parity(
    harness: HarnessView, parts: list[Any], full: list[Any], report: CheckReport, atol: float, rtol: float
) -> list[Any]:
    """Each request alone against its place in the batch; the alone outputs, None where it failed."""
    singles = []
    for i, part in enumerate(parts):
        alone, err = _run_output(harness, part)
        singles.append(alone[0] if err is None and isinstance(alone, list) and alone else None)
        if err is not None:
            first = _alone(_first_line(err), i)
            report.parity.append((i, f"fails alone: {first}"))
            report.problems.append(
                Problem(
                    "batch-parity", f"fails alone but not in the batch: {first}", _alone(err.fix or "", i), err.stage, i
                )
            )
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
    return singles


def _encodings(row: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """The same payload as TorchServe clients send it in other ways: the request's first field
    renamed or re-encoded, its other fields kept. A raw item (not a request dict) has none."""
    if not isinstance(row, dict) or not row:
        return
    name, value = next(iter(row.items()))
    rest = {k: v for k, v in row.items() if k != name}
    other = "data" if name == "body" else "body"
    if other not in rest:
        yield f"field '{other}' instead of '{name}'", {other: value, **rest}
    if isinstance(value, bytearray):
        yield "bytes instead of bytearray", {name: bytes(value), **rest}
        yield "base64 str (JSON clients)", {name: base64.b64encode(bytes(value)).decode("ascii"), **rest}
    elif isinstance(value, (dict, list)):
        yield "raw JSON bytes (no content-type)", {name: bytearray(json.dumps(value).encode("utf-8")), **rest}
    elif isinstance(value, str):
        yield "raw bytes (no content-type)", {name: bytearray(value.encode("utf-8")), **rest}


def _judge(
    out: Any, err: StageError | None, baseline: Any, atol: float, rtol: float, index: int
) -> tuple[str, str | None, str]:
    """``(outcome, problem or None, fix)`` of request ``index`` in one other encoding (run alone)."""
    if err is not None:
        original = err.original
        if getattr(original, "fix", None):  # the handler refused it and said what to send
            said = _alone(getattr(original, "message", str(original)).splitlines()[0], index)
            return f"refused clearly: {said[:90]}", None, ""
        return (
            f"fails: {type(original).__name__ if original else 'error'}",
            f"the handler fails with {type(original).__name__}: {_alone(str(original), index)}",
            "accept this encoding or refuse it with an error that says what to send (RequestError(..., fix=...))",
        )
    item = out[0] if isinstance(out, list) and out else out
    if same_output(item, baseline, atol, rtol):
        return "same output", None, ""
    return (
        "different output",
        f"gives {_short(item)} instead of {_short(baseline)}",
        "decode every accepted encoding to the same input",
    )
