"""Repeated timing of a handler's stages (``Harness.time``) and batch-size sweeps (``Harness.sweep``).

Each pass is a real run (:meth:`Harness.run`, through the handler's own ``handle``, so a
handler that splits the batch is timed as TorchServe runs it) inside
:func:`~handlerkit.diagnostics.runs.diagnostic_runs` (memory tracking off, the harness put back
after); the stages' times come from the harness's device-synchronised timer
(:class:`handlerkit.worker.timer.Timer`), device time where there is one.
:func:`time_callable_stages` repeats any pass and collects the per-stage milliseconds it
returns; :class:`TimingReport` and :class:`SweepReport` render themselves, each with the
:class:`~handlerkit.diagnostics.noise.Conditions` it was timed under.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from handlerkit._progress import Bar
from handlerkit._render import Rendered, Table
from handlerkit._text import format_number
from handlerkit.diagnostics._view import HarnessView
from handlerkit.diagnostics.noise import Conditions
from handlerkit.diagnostics.runs import diagnostic_runs
from handlerkit.worker.timer import percentile

__all__ = [
    "END_TO_END",
    "SweepReport",
    "TimingReport",
    "TimingStats",
    "batch_sizes",
    "resize_batch",
    "summarize",
    "sweep_stages",
    "time_callable_stages",
    "time_stages",
]

END_TO_END = "end_to_end"
"""The key under which end-to-end samples travel next to the per-stage samples."""

# --- statistics --------------------------------------------------------------------------


@dataclass(frozen=True)
class TimingStats:
    """Summary of a list of timings in milliseconds.

    ``median`` and ``p90`` use linear interpolation between closest ranks (numpy's default
    ``percentile`` method), so ``p90`` of ``[1, …, 10]`` is 9.1; ``p25`` to ``p75`` is the
    run's noise around the median (:func:`handlerkit.diagnostics.noise.fastest`). ``std`` is
    the sample standard deviation (n − 1 in the denominator), 0.0 for a single sample.
    """

    n: int
    min: float
    p25: float
    median: float
    p75: float
    p90: float
    mean: float
    std: float
    total: float

    def to_dict(self) -> dict[str, float]:
        """The fields as a plain dict, each key with its unit: ``n``, ``min_ms`` … ``total_ms``."""
        return {key if key == "n" else f"{key}_ms": value for key, value in asdict(self).items()}


def summarize(samples: Iterable[float]) -> TimingStats:
    """Summarise timings in milliseconds.

    Raises:
        ValueError: no samples, or a sample that is not a finite number.
    """
    values = [float(s) for s in samples]
    if not values:
        raise ValueError("summarize needs at least one timing sample: got none")
    bad = [v for v in values if not math.isfinite(v)]
    if bad:
        raise ValueError(f"timing samples must be finite numbers of milliseconds: got {bad[:3]!r}")
    ordered = sorted(values)
    total = math.fsum(values)
    return TimingStats(
        n=len(values),
        min=ordered[0],
        p25=percentile(ordered, 25),
        median=percentile(ordered, 50),
        p75=percentile(ordered, 75),
        p90=percentile(ordered, 90),
        mean=total / len(values),
        std=statistics.stdev(values) if len(values) > 1 else 0.0,
        total=total,
    )


# --- runner ------------------------------------------------------------------------------


def time_callable_stages(
    run_once: Callable[[], Mapping[str, float]], warmup: int, repeat: int, progress: Bar | None = None
) -> dict[str, list[float]]:
    """Call ``run_once`` ``warmup`` times, then ``repeat`` times, collecting its timings.

    ``run_once`` performs one pass and returns ``{stage: milliseconds}``. Warm-up passes are
    discarded. Unless ``run_once`` reports :data:`END_TO_END` itself, its wall time per
    call is recorded under that key (last), so the end-to-end includes whatever the caller
    does between stages. ``progress`` advances once per pass, warm-up included.

    Returns:
        ``{stage: [ms per pass]}`` in the order stages first appear.

    Raises:
        ValueError: ``warmup < 0`` or ``repeat < 1``.
        TypeError: ``run_once`` does not return a mapping of numbers.
    """
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0: got {warmup}")
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1: got {repeat}")
    for _ in range(warmup):
        run_once()
        if progress is not None:
            progress.update()
    samples: dict[str, list[float]] = {}
    end_to_end: list[float] = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        result = run_once()
        elapsed = (time.perf_counter_ns() - t0) / 1e6
        if not isinstance(result, Mapping):
            raise TypeError(f"run_once must return a dict of stage -> milliseconds: got {type(result).__name__}")
        for stage, ms in result.items():
            if isinstance(ms, bool) or not isinstance(ms, (int, float)):
                raise TypeError(f"run_once returned {ms!r} for stage {stage!r}: expected milliseconds as a number")
            samples.setdefault(stage, []).append(float(ms))
        if END_TO_END not in result:
            end_to_end.append(elapsed)
        if progress is not None:
            progress.update()
    if end_to_end and END_TO_END not in samples:
        samples[END_TO_END] = end_to_end
    return samples


def batch_sizes(max_batch_size: int) -> list[int]:
    """Powers of two up to ``max_batch_size``, plus it if it is not one: 6 → [1, 2, 4, 6]."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1: got {max_batch_size}")
    sizes = [1 << i for i in range(max_batch_size.bit_length()) if 1 << i <= max_batch_size]
    if sizes[-1] != max_batch_size:
        sizes.append(max_batch_size)
    return sizes


# --- reports -----------------------------------------------------------------------------


@dataclass(repr=False)
class TimingReport(Rendered):
    """Per-stage timing of repeated passes, as ``Harness.time`` returns it.

    Renders as a table (stage, n, min, median, p90, mean in ms, share %) in a terminal and
    in Jupyter. ``share`` is the stage's total time over the end-to-end total (over the sum
    of the stages when there is no end-to-end), so stage shares that add up to less than
    100 % leave the rest to harness overhead between stages.

    Attributes:
        stages: stage name → statistics, in stage order.
        end_to_end: statistics of whole passes, when measured.
        batch_size: requests per pass.
        warmup: discarded passes before measuring.
        repeat: measured passes.
        device: where the model ran, e.g. ``"cpu"`` or ``"cuda:0"``.
        notes: facts worth reading next to the numbers (the conditions' among them).
        conditions: what the timing was taken under (threads, cores, load), when measured.
    """

    stages: dict[str, TimingStats]
    end_to_end: TimingStats | None = None
    batch_size: int = 1
    warmup: int = 0
    repeat: int = 1
    device: str = "cpu"
    notes: list[str] = field(default_factory=list)
    conditions: Conditions | None = None

    @classmethod
    def from_samples(
        cls,
        samples: Mapping[str, Sequence[float]],
        *,
        batch_size: int = 1,
        warmup: int = 0,
        repeat: int | None = None,
        device: Any = "cpu",
        notes: Iterable[str] = (),
        conditions: Conditions | None = None,
    ) -> TimingReport:
        """Build a report from ``{stage: [ms]}`` (what :func:`time_callable_stages` returns).

        The :data:`END_TO_END` key, when present, becomes ``end_to_end``. ``repeat``
        defaults to the largest sample count.
        """
        stages = {name: summarize(values) for name, values in samples.items() if name != END_TO_END}
        e2e = summarize(samples[END_TO_END]) if END_TO_END in samples else None
        if repeat is None:
            repeat = max((len(v) for v in samples.values()), default=0)
        return cls(stages, e2e, batch_size, warmup, repeat, str(device), list(notes), conditions)

    @property
    def throughput(self) -> float | None:
        """Requests per second: ``batch_size`` over the end-to-end median (None without one)."""
        if self.end_to_end is None or self.end_to_end.median <= 0:
            return None
        return self.batch_size / (self.end_to_end.median / 1000.0)

    @property
    def title(self) -> str:
        return f"timing: batch_size={self.batch_size}, warmup={self.warmup}, repeat={self.repeat}, device={self.device}"

    headers = ("stage", "n", "min ms", "median ms", "p90 ms", "mean ms", "share %")

    @property
    def rows(self) -> list[list[Any]]:
        """The table's rows: one per stage, then ``end_to_end`` when measured."""
        denom = self.end_to_end.total if self.end_to_end is not None else sum(s.total for s in self.stages.values())

        def row(name: str, s: TimingStats) -> list[Any]:
            share = 100.0 * s.total / denom if denom > 0 else None
            return [name, s.n, s.min, s.median, s.p90, s.mean, share]

        out = [row(name, s) for name, s in self.stages.items()]
        if self.end_to_end is not None:
            out.append(row(END_TO_END, self.end_to_end))
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-serialisable data."""
        return {
            "batch_size": self.batch_size,
            "warmup": self.warmup,
            "repeat": self.repeat,
            "device": self.device,
            "stages": {name: s.to_dict() for name, s in self.stages.items()},
            "end_to_end": None if self.end_to_end is None else self.end_to_end.to_dict(),
            "throughput_rps": self.throughput,
            "notes": list(self.notes),
            "conditions": None if self.conditions is None else self.conditions.to_dict(),
        }

    def _summary(self) -> str:
        text = self.title
        if self.throughput is not None:
            text += f"; throughput {format_number(self.throughput)} requests/s"
        return text

    def _tables(self) -> list[Table]:
        return [Table(self.headers, self.rows)]

    def _notes(self) -> list[str]:
        return list(self.notes)


@dataclass(repr=False)
class SweepReport(Rendered):
    """Latency and throughput across batch sizes, one :class:`TimingReport` per size.

    Each row holds the batch size, every stage's median (ms), the end-to-end median (ms; the
    sum of the stage medians when a report has no end-to-end), the median per request
    (ms) and the throughput (requests/s = batch size / end-to-end median in seconds).

    Attributes:
        reports: one report per batch size, in the order given.
        notes: facts worth reading next to the numbers (the conditions' among them).
        conditions: what the sweep was timed under, measured once before it.
    """

    reports: list[TimingReport]
    notes: list[str] = field(default_factory=list)
    conditions: Conditions | None = None

    @property
    def device(self) -> str:
        devices = sorted({r.device for r in self.reports})
        return ", ".join(devices)

    @property
    def stage_names(self) -> list[str]:
        """Every stage seen, in first-seen order."""
        names: dict[str, None] = {}
        for r in self.reports:
            names.update(dict.fromkeys(r.stages))
        return list(names)

    @property
    def rows(self) -> list[dict[str, Any]]:
        """One dict per batch size: ``batch_size``, each stage's median (``<stage>_ms``),
        ``end_to_end_ms``, ``per_request_ms`` and ``throughput_rps``."""
        out = []
        for r in self.reports:
            e2e = r.end_to_end.median if r.end_to_end is not None else sum(s.median for s in r.stages.values())
            row: dict[str, Any] = {"batch_size": r.batch_size}
            for name in self.stage_names:
                row[f"{name}_ms"] = r.stages[name].median if name in r.stages else None
            row["end_to_end_ms"] = e2e
            row["per_request_ms"] = e2e / r.batch_size if r.batch_size else None
            row["throughput_rps"] = r.batch_size / (e2e / 1000.0) if e2e > 0 else None
            out.append(row)
        return out

    @property
    def headers(self) -> list[str]:
        return ["batch", *(f"{n} ms" for n in self.stage_names), "end-to-end ms", "ms/request", "requests/s"]

    def _table_rows(self) -> list[list[Any]]:
        return [list(row.values()) for row in self.rows]

    @property
    def title(self) -> str:
        return f"batch-size sweep (median latency), device={self.device}"

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-serialisable data: the rows and every underlying report."""
        return {
            "device": self.device,
            "rows": self.rows,
            "reports": [r.to_dict() for r in self.reports],
            "notes": list(self.notes),
            "conditions": None if self.conditions is None else self.conditions.to_dict(),
        }

    def _summary(self) -> str:
        return self.title

    def _tables(self) -> list[Table]:
        return [Table(self.headers, self._table_rows())]

    def _notes(self) -> list[str]:
        return list(self.notes)


# --- repeated runs of a harness --------------------------------------------------------------


def _stage_ms(run: Any) -> dict[str, float]:
    """``{stage: ms}`` of one run: device time where a stage ran on an accelerator."""
    return {name: r.device_or_wall_ms for name, r in run.stages.items() if name != "initialize"}


def time_stages(
    harness: HarnessView,
    batch: Any,
    warmup: int = 3,
    repeat: int = 20,
    progress: bool | Bar | None = None,
    conditions: Conditions | None = None,
) -> TimingReport:
    """Per-stage statistics over ``repeat`` runs after ``warmup`` runs.

    ``progress``: a bar (see :mod:`handlerkit._progress`; None lets the environment decide),
    or an open :class:`~handlerkit._progress.Bar` to advance (a sweep's). ``conditions``:
    measured already (a sweep's, reported once there); else measured here and reported.
    """
    measured = conditions or Conditions.measure()  # before the runs: the load the machine had without them
    with diagnostic_runs(harness), warnings.catch_warnings(), contextlib.ExitStack() as stack:
        warnings.simplefilter("ignore")
        shown = (
            progress
            if isinstance(progress, Bar)
            else stack.enter_context(Bar(warmup + repeat, f"timing {harness.name}", progress))
        )
        samples = time_callable_stages(
            lambda: _stage_ms(harness.run(batch)), warmup=warmup, repeat=repeat, progress=shown
        )
    handler = harness.handler
    device = getattr(handler, "device", None) or "cpu"
    notes: list[str] = []
    if conditions is None:
        measured.report(notes)
    compiled = getattr(getattr(getattr(handler, "decisions", None), "compile", None), "applied", False)
    if compiled and warmup < 1:
        notes.append("the model is compiled and warmup is 0: the first pass includes compilation")
    return TimingReport.from_samples(
        samples, batch_size=len(batch), warmup=warmup, repeat=repeat, device=device, notes=notes, conditions=measured
    )


def resize_batch(batch: Any, size: int) -> Any:
    """A batch of ``size`` requests, cycling through the given ones (``with_headers()`` copies them with fresh ids)."""
    from handlerkit.worker.batches import batch as make_batch

    requests = list(batch.requests)
    if not requests:
        raise ValueError("cannot sweep an empty batch")
    return make_batch(*(requests[i % len(requests)].with_headers() for i in range(size)))


def sweep_stages(
    harness: HarnessView,
    batch: Any,
    batch_sizes: Sequence[int] = (1, 2, 4, 8),
    warmup: int = 2,
    repeat: int = 10,
    progress: bool | None = None,
) -> SweepReport:
    """Latency and throughput per stage at each batch size (one bar over every pass)."""
    if not batch_sizes or any(not isinstance(n, int) or n < 1 for n in batch_sizes):
        raise ValueError(f"batch_sizes must be positive integers, got {list(batch_sizes)}")
    conditions = Conditions.measure()
    with Bar(len(batch_sizes) * (warmup + repeat), f"sweep {harness.name}", progress) as shown:
        reports = []
        for n in batch_sizes:
            shown.set_description(f"sweep {harness.name}: batch {n}")
            sized = resize_batch(batch, n)
            reports.append(time_stages(harness, sized, warmup, repeat, progress=shown, conditions=conditions))
    report = SweepReport(reports, conditions=conditions)
    conditions.report(report.notes)
    return report
