"""Stage timing: a cheap device-aware :class:`Timer`, sample statistics and the reports.

A GPU runs work asynchronously: a stage that launches kernels returns before they finish,
so a bare wall clock measures the launch, not the work. :class:`Timer` therefore
synchronises the stage's device before starting and after stopping the clock (CUDA, XPU,
MPS) and, on backends with timing events, also reads the device's own clock. On CPU it is
two ``time.perf_counter_ns()`` calls.

The Harness owns the stage calls; :func:`time_callable_stages` only repeats one pass and
collects the per-stage milliseconds it returns. :class:`TimingReport` and
:class:`SweepReport` render themselves as text (terminals) and HTML (Jupyter).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from types import TracebackType
from typing import Any

from handlerkit._text import render_html, render_text
from handlerkit.diagnostics import device as _device

__all__ = [
    "END_TO_END",
    "Timer",
    "TimingStats",
    "summarize",
    "TimingReport",
    "SweepReport",
    "time_callable_stages",
    "batch_sizes",
    "device_kind",
    "needs_sync",
    "synchronize",
]

END_TO_END = "end_to_end"
"""The key under which end-to-end samples travel next to the per-stage samples."""

_SYNCED_KINDS = ("cuda", "xpu", "mps")


# --- seams -------------------------------------------------------------------------------
# Tests replace these (or the torch functions they call) to fake an accelerator.


def device_kind(device: Any) -> str:
    """The device type of ``device`` (``None``, ``"cuda:0"``, ``torch.device``, …) as a string.

    ``None`` means CPU. Does not import torch.
    """
    if device is None:
        return "cpu"
    kind = getattr(device, "type", None)
    if isinstance(kind, str):
        return kind
    return str(device).split(":", 1)[0].strip().lower()


def _kind_available(kind: str) -> bool:
    # Through the device module's attributes, so monkeypatching them there takes effect here.
    if kind == "cuda":
        return _device.cuda_available()
    if kind == "xpu":
        return _device.xpu_available()
    if kind == "mps":
        return _device.mps_available()
    return False


def needs_sync(device: Any) -> bool:
    """Whether timing work on ``device`` needs device synchronisation (an available
    CUDA, XPU or MPS device); False for CPU and None."""
    kind = device_kind(device)
    return kind in _SYNCED_KINDS and _kind_available(kind)


def synchronize(kind: str, device: Any = None) -> None:
    """Wait until all work queued on ``device`` (of type ``kind``) has finished."""
    import torch

    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "xpu":
        torch.xpu.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


def _timing_events(kind: str) -> tuple[Any, Any] | None:
    """A (start, end) pair of device timing events, or ``None`` where the backend has none."""
    import torch

    module = {"cuda": torch.cuda, "xpu": getattr(torch, "xpu", None), "mps": getattr(torch, "mps", None)}.get(kind)
    event_cls = getattr(module, "Event", None)
    if event_cls is None:
        return None
    try:
        return event_cls(enable_timing=True), event_cls(enable_timing=True)
    except (RuntimeError, TypeError):  # a backend build without timing events
        return None


# --- Timer -------------------------------------------------------------------------------


class Timer:
    """Time one block of code, synchronising its device around the clock.

    Example:
        >>> with Timer() as t:
        ...     pass
        >>> t.device_ms is None
        True

    On an available CUDA / XPU / MPS device the order is: synchronise, start the wall clock,
    record a start event, run the block, record an end event, synchronise, stop the wall
    clock. ``wall_ms`` then includes the device work, and ``device_ms`` is the events'
    elapsed time (the device's own view, without host overhead before the first launch).
    Where the backend has no timing events, ``device_ms`` is the synchronised wall time.

    A device whose backend is not available (``"cuda"`` on a machine without a GPU) is
    timed like the CPU: no synchronisation, ``synchronized`` is False.

    If the block raises, the clock stops without the closing synchronisation (it could
    raise again and hide the original error): ``wall_ms`` is set, ``device_ms`` is None and
    ``synchronized`` is False. The exception propagates.

    Args:
        device: the stage's device; ``None`` (the default) means CPU.

    Attributes:
        device: the device given.
        kind: its type: ``"cpu"``, ``"cuda"``, ``"xpu"``, ``"mps"``…
        wall_ms: host wall time of the block, in milliseconds (None until it has run).
        device_ms: device time in milliseconds; None on CPU.
        synchronized: whether the device was synchronised around the block.
    """

    __slots__ = ("device", "kind", "_sync", "_events", "_t0", "wall_ms", "device_ms", "synchronized")

    def __init__(self, device: Any = None) -> None:
        self.device = device
        self.kind = device_kind(device)
        # Decided once per Timer, so entering and leaving stay at a few calls.
        self._sync = needs_sync(device)
        self._events: tuple[Any, Any] | None = None
        self._t0 = 0
        self.wall_ms: float | None = None
        self.device_ms: float | None = None
        self.synchronized = False

    def start(self) -> Timer:
        """Start timing (what ``with`` does on entry); returns the timer."""
        self.wall_ms = self.device_ms = None
        self.synchronized = False
        if self._sync:
            synchronize(self.kind, self.device)
            self._events = _timing_events(self.kind)
            self._t0 = time.perf_counter_ns()
            if self._events is not None:
                self._events[0].record()
        else:
            self._t0 = time.perf_counter_ns()
        return self

    def stop(self, *, failed: bool = False) -> float:
        """Stop timing and return ``wall_ms``.

        Args:
            failed: the block raised; skip the closing synchronisation.
        """
        if not self._sync:
            self.wall_ms = (time.perf_counter_ns() - self._t0) / 1e6
            return self.wall_ms
        if failed:
            self.wall_ms = (time.perf_counter_ns() - self._t0) / 1e6
            self._events = None
            return self.wall_ms
        events = self._events
        if events is not None:
            events[1].record()
        synchronize(self.kind, self.device)
        self.wall_ms = (time.perf_counter_ns() - self._t0) / 1e6
        self.device_ms = float(events[0].elapsed_time(events[1])) if events is not None else self.wall_ms
        self._events = None
        self.synchronized = True
        return self.wall_ms

    def __enter__(self) -> Timer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(failed=exc_type is not None)

    def __repr__(self) -> str:
        wall = "n/a" if self.wall_ms is None else f"{self.wall_ms:.3f} ms"
        dev = "" if self.device_ms is None else f", device={self.device_ms:.3f} ms"
        return f"Timer({self.kind}: wall={wall}{dev}, synchronized={self.synchronized})"


# --- statistics --------------------------------------------------------------------------


def _percentile(ordered: Sequence[float], q: float) -> float:
    # Linear interpolation between closest ranks (numpy's default "linear" method).
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class TimingStats:
    """Summary of a list of timings in milliseconds.

    ``median`` and ``p90`` use linear interpolation between closest ranks (numpy's default
    ``percentile`` method), so ``p90`` of ``[1, …, 10]`` is 9.1. ``std`` is the sample
    standard deviation (n − 1 in the denominator), 0.0 for a single sample.
    """

    n: int
    min: float
    median: float
    p90: float
    mean: float
    std: float
    total: float

    def to_dict(self) -> dict[str, float]:
        """The fields as a plain dict."""
        return asdict(self)


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
        median=_percentile(ordered, 50),
        p90=_percentile(ordered, 90),
        mean=total / len(values),
        std=statistics.stdev(values) if len(values) > 1 else 0.0,
        total=total,
    )


# --- runner ------------------------------------------------------------------------------


def time_callable_stages(
    run_once: Callable[[], Mapping[str, float]], warmup: int, repeat: int
) -> dict[str, list[float]]:
    """Call ``run_once`` ``warmup`` times, then ``repeat`` times, collecting its timings.

    ``run_once`` performs one pass and returns ``{stage: milliseconds}``. Warm-up passes are
    discarded. Unless ``run_once`` reports :data:`END_TO_END` itself, its wall time per
    call is recorded under that key (last), so the end-to-end includes whatever the caller
    does between stages.

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


def _notes_text(notes: Sequence[str]) -> str:
    return "".join(f"\nnote: {n}" for n in notes)


def _notes_html(notes: Sequence[str]) -> str:
    import html

    if not notes:
        return ""
    return "<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>"


@dataclass
class TimingReport:
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
        notes: facts worth reading next to the numbers.
    """

    stages: dict[str, TimingStats]
    end_to_end: TimingStats | None = None
    batch_size: int = 1
    warmup: int = 0
    repeat: int = 1
    device: str = "cpu"
    notes: list[str] = field(default_factory=list)

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
    ) -> TimingReport:
        """Build a report from ``{stage: [ms]}`` (what :func:`time_callable_stages` returns).

        The :data:`END_TO_END` key, when present, becomes ``end_to_end``. ``repeat``
        defaults to the largest sample count.
        """
        stages = {name: summarize(values) for name, values in samples.items() if name != END_TO_END}
        e2e = summarize(samples[END_TO_END]) if END_TO_END in samples else None
        if repeat is None:
            repeat = max((len(v) for v in samples.values()), default=0)
        return cls(stages, e2e, batch_size, warmup, repeat, str(device), list(notes))

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
        }

    def __str__(self) -> str:
        text = render_text(self.headers, self.rows, self.title)
        if self.throughput is not None:
            text += f"\nthroughput: {self.throughput:.1f} requests/s"
        return text + _notes_text(self.notes)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        html = render_html(self.headers, self.rows, self.title)
        if self.throughput is not None:
            html += f"<p>throughput: {self.throughput:.1f} requests/s</p>"
        return html + _notes_html(self.notes)


@dataclass
class SweepReport:
    """Latency and throughput across batch sizes, one :class:`TimingReport` per size.

    Each row holds the batch size, every stage's median (ms), the end-to-end median (ms; the
    sum of the stage medians when a report has no end-to-end), the median per request
    (ms) and the throughput (requests/s = batch size / end-to-end median in seconds).

    Attributes:
        reports: one report per batch size, in the order given.
        notes: facts worth reading next to the numbers.
    """

    reports: list[TimingReport]
    notes: list[str] = field(default_factory=list)

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
        """One dict per batch size: ``batch_size``, each stage's median ms, ``end_to_end_ms``,
        ``per_request_ms`` and ``throughput_rps``."""
        out = []
        for r in self.reports:
            e2e = r.end_to_end.median if r.end_to_end is not None else sum(s.median for s in r.stages.values())
            row: dict[str, Any] = {"batch_size": r.batch_size}
            for name in self.stage_names:
                row[name] = r.stages[name].median if name in r.stages else None
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
        }

    def __str__(self) -> str:
        return render_text(self.headers, self._table_rows(), self.title) + _notes_text(self.notes)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return render_html(self.headers, self._table_rows(), self.title) + _notes_html(self.notes)
