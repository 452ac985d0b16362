"""The format lab's report: one row per format, rendered as tables (notebook and terminal) and JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from handlerkit._render import Rendered, Table
from handlerkit._text import format_bytes
from handlerkit.diagnostics.format_lab.export import ExportFailure
from handlerkit.diagnostics.format_lab.saving import Refusal
from handlerkit.diagnostics.format_lab.shapes import Dims, shown
from handlerkit.diagnostics.noise import Conditions, Fastest, fastest
from handlerkit.diagnostics.timing import TimingStats

__all__ = ["FormatReport", "FormatRow"]


@dataclass
class FormatRow:
    """One format's row of a :class:`FormatReport`.

    Attributes:
        format: one of :data:`LAB_FORMATS`.
        exported: the model was exported (or compiled) and loaded back.
        how: how it was made, e.g. ``"torch.jit.script"``, ``"torch.jit.trace (script failed: ...)"``.
        dynamic_batch: the artifact was exported with a dynamic batch dimension (None: the
            format has no such setting).
        dynamic_dims: the other dimensions exported dynamic, e.g. ``["item_ids dim 1"]`` (None:
            the format has no such setting).
        dims: input name -> what each dimension took: ``"batch"``, ``"*"`` (other sizes gave
            eager's outputs), ``"=7"`` (only the batch's size), ``"7"`` (the batch's, not varied).
        fixed_dims: one sentence per dimension it did not take, with the sizes refused.
        failure: why it did not export: the error, the model's line that stopped it, the fix.
        max_abs_diff: the largest absolute difference of the model's output from eager's.
        answers_agree: the handler's final answers are eager's, within the tolerance.
        difference: the first place where the answers differ.
        export_s / load_s: seconds to export (or wrap in ``torch.compile``) and to load back.
        first_call_ms: the first inference call (a compile happens here for ``compile``).
        peak_bytes: peak memory of the first call above its start (CPU RSS, or CUDA allocated).
        steady: the inference stage's steady-state timing.
        artifact_bytes: the exported file's size.
        batch_sizes: batch size → ``"ok"``, ``"wrong output"`` or ``"error: ..."``.
        error: a failure after exporting (loading or running), as ``Type: message``.
        log: what the exporter and the format's first calls printed, logged or warned (the lab
            keeps it here rather than let it reach the notebook cell or terminal).
    """

    format: str
    exported: bool = False
    how: str = ""
    dynamic_batch: bool | None = None
    dynamic_dims: list[str] | None = None
    dims: dict[str, list[str]] = field(default_factory=dict)
    fixed_dims: list[str] = field(default_factory=list)
    failure: ExportFailure | None = None
    max_abs_diff: float | None = None
    answers_agree: bool | None = None
    difference: str | None = None
    export_s: float | None = None
    load_s: float | None = None
    first_call_ms: float | None = None
    peak_bytes: int | None = None
    steady: TimingStats | None = None
    artifact_bytes: int | None = None
    batch_sizes: dict[int, str] = field(default_factory=dict)
    error: str | None = None
    log: str = ""

    @property
    def agrees(self) -> bool:
        """Exported, ran, and gave eager's answers."""
        return self.exported and self.error is None and self.answers_agree is True

    @property
    def accepted_sizes(self) -> list[int]:
        """The batch sizes it ran with eager's outputs."""
        return [n for n, outcome in self.batch_sizes.items() if outcome == "ok"]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["steady"] = None if self.steady is None else self.steady.to_dict()
        data["batch_sizes"] = {str(n): outcome for n, outcome in self.batch_sizes.items()}
        data["agrees"] = self.agrees
        return data


@dataclass(repr=False)
class FormatReport(Rendered):
    """The handler's model in every format asked for, side by side (``Harness.compare_formats``).

    Attributes:
        handler: the harness's name.
        batch_size: requests in the batch.
        device: where the models ran.
        rows: one :class:`FormatRow` per format, eager first.
        repeat / warmup: steady-state calls timed, and discarded before, per format.
        atol / rtol: the tolerance the answers are compared with.
        notes: facts worth reading next to the numbers (the conditions' among them).
        dims: the model's inputs and which of their dimensions vary besides the batch.
        saved: the format saved into the model dir (``save=``), or None.
        refused: why ``save=`` did not save (its reason and fix), or None.
        conditions: what the steady state was timed under (threads, cores, load).
    """

    handler: str
    batch_size: int
    device: str = "cpu"
    rows: list[FormatRow] = field(default_factory=list)
    repeat: int = 0
    warmup: int = 0
    atol: float = 1e-4
    rtol: float = 1e-4
    notes: list[str] = field(default_factory=list)
    dims: Dims | None = None
    saved: Any = None
    refused: Refusal | None = None
    conditions: Conditions | None = None

    @property
    def ok(self) -> bool:
        """Every format asked for exported, ran and gave eager's answers."""
        return bool(self.rows) and all(row.agrees for row in self.rows)

    @property
    def verdict(self) -> Fastest:
        """The fastest format that agrees, and whether its lead is beyond the run's noise."""
        return fastest({row.format: row.steady for row in self.rows if row.agrees and row.steady is not None})

    @property
    def best(self) -> FormatRow | None:
        """The fastest format that agrees with eager, when its lead is beyond the noise (:attr:`verdict`)."""
        return None if (best := self.verdict.best) is None else self.row(best)

    def row(self, fmt: str) -> FormatRow:
        """The row of format ``fmt``."""
        for row in self.rows:
            if row.format == fmt:
                return row
        raise KeyError(f"no {fmt!r} row: the report has {[r.format for r in self.rows]}")

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-serialisable data (what ``--json`` prints)."""
        best = self.best
        return {
            "handler": self.handler,
            "batch_size": self.batch_size,
            "device": self.device,
            "repeat": self.repeat,
            "warmup": self.warmup,
            "atol": self.atol,
            "rtol": self.rtol,
            "ok": self.ok,
            "best": None if best is None else best.format,
            "verdict": self.verdict.reason,
            "rows": [row.to_dict() for row in self.rows],
            "notes": list(self.notes),
            "dims": None if self.dims is None else self.dims.to_dict(),
            "saved": None if self.saved is None else self.saved.to_dict(),
            "refused": None if self.refused is None else self.refused.to_dict(),
            "conditions": None if self.conditions is None else self.conditions.to_dict(),
        }

    def _summary(self) -> str:
        best = self.best
        failed = [r.format for r in self.rows if not r.exported]
        differ = [r.format for r in self.rows if r.exported and not r.agrees]
        verdict = self.verdict.reason if self.verdict.fastest else "no format agrees with eager"
        busy = self.conditions.busy if self.conditions is not None else None
        if best is not None and busy:  # a lead measured while other work shared the cores is no verdict
            verdict = f"fastest here: {best.format}, measured {busy} (time it on a quiet machine to call it best)"
        parts = [f"best: {best.format}" if best is not None and not busy else verdict]  # or "no clear winner (...)"
        if failed:
            parts.append(f"not exported: {', '.join(failed)}")
        if differ:
            parts.append(f"answers differ or fail: {', '.join(differ)}")
        if self.refused is not None:
            parts.append(f"not saved: {self.refused.reason}")
        return f"formats of {self.handler} (batch {self.batch_size}, {self.device}): " + "; ".join(parts)

    def _tables(self) -> list[Table]:
        eager = next((r for r in self.rows if r.format == "eager" and r.steady is not None), None)
        rows = []
        for r in self.rows:
            ratio = (
                eager.steady.median / r.steady.median
                if eager is not None and eager.steady is not None and r.steady is not None and r.steady.median > 0
                else None
            )
            rows.append(
                [
                    r.format,
                    "yes" if r.exported else "no",
                    _agreement(r),
                    r.max_abs_diff,
                    r.export_s,
                    r.first_call_ms,
                    None if r.steady is None else r.steady.median,
                    None if r.steady is None else f"{r.steady.p25:.3g}-{r.steady.p75:.3g}",
                    ratio,
                    _peak(r.peak_bytes),
                    format_bytes(r.artifact_bytes) if r.artifact_bytes is not None else None,
                    ", ".join(map(str, r.accepted_sizes)) if r.batch_sizes else None,
                ]
            )
        headers = ("format", "exported", "answers", "max abs diff", "export s", "first call ms", "median ms",
                   "p25-p75 ms", "speedup", "peak memory", "size", "batch sizes")  # fmt: skip
        how = [[r.format, r.how, _dynamic(r)] for r in self.rows if r.exported]
        dims = [[r.format, shown(r.dims), "; ".join(r.fixed_dims)] for r in self.rows if r.dims]
        failures = [
            [r.format, r.failure.error, r.failure.where, r.failure.source, r.failure.fix]
            for r in self.rows
            if r.failure is not None
        ]
        errors = [[r.format, r.error or r.difference] for r in self.rows if r.error or r.difference]
        return [
            Table(headers, rows),
            Table(("format", "how", "dynamic dimensions"), how, "how each was made", wrap=60),
            Table(("format", "input dimensions", "fixed"), dims, "the dimensions each takes", wrap=60),
            Table(("format", "error", "at", "source", "fix"), failures, "not exported", wrap=48),
            Table(("format", "what went wrong"), errors, "differences and errors", wrap=80),
        ]

    def _notes(self) -> list[str]:
        unmeasured = [r.format for r in self.rows if r.peak_bytes == 0]
        said = (
            [
                f"peak memory — for {', '.join(unmeasured)}: its first call took no memory beyond what the process held before it (nothing to measure)"
            ]
            if unmeasured
            else []
        )
        return list(self.notes) + said


def _peak(peak: int | None) -> str | None:
    """The first call's peak memory: none at all above its start is "—" (explained in a note), not "0 B"."""
    if peak is None:
        return None
    return "—" if peak == 0 else format_bytes(peak)


def _agreement(row: FormatRow) -> str:
    if not row.exported:
        return "-"
    if row.error is not None:
        return "error"
    return "agree" if row.answers_agree else "DIFFER"


def _dynamic(row: FormatRow) -> str:
    if row.dynamic_batch is None:
        return "no setting (sizes tried)"
    dynamic = (["batch"] if row.dynamic_batch else []) + (row.dynamic_dims or [])
    return ", ".join(dynamic) if dynamic else "none: fixed (dynamic failed)"
