"""A timing's noise, as every timed report reads it (``h.time``, ``h.sweep``, ``compare_formats``,
``compile_report``, ``profile``, and the CLI's ``time``, ``compile``, ``formats``):

- :class:`Conditions`: what the timing was taken under (torch's CPU threads, the usable cores,
  the 1-minute load), measured before the timed calls, and the warning when they spoil the
  numbers, said once: in the report's notes (and its JSON), beside the numbers it qualifies;
- :func:`fastest`: which of several timings is fastest, declared only when its lead is beyond
  the run's own spread (p25-p75), so two runs a minute apart do not name different winners
  from the same noise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from handlerkit.worker import devices

__all__ = ["MIN_SAMPLES", "Conditions", "Fastest", "Spread", "fastest", "spread"]


class Spread(Protocol):
    """What the rule reads of a timing's statistics (:class:`~handlerkit.diagnostics.timing.TimingStats` has it)."""

    @property
    def n(self) -> int: ...
    @property
    def p25(self) -> float: ...
    @property
    def median(self) -> float: ...
    @property
    def p75(self) -> float: ...


def spread(s: Spread) -> str:
    """``"1.23 ms (p25-p75 1.10-1.40)"``: a median with the run's noise around it."""
    return f"{s.median:.3g} ms (p25-p75 {s.p25:.3g}-{s.p75:.3g})"


MIN_SAMPLES = 3
"""Timed calls each side needs before :func:`fastest` tells a lead from noise (two calls have no middle half)."""


@dataclass(frozen=True)
class Fastest:
    """Which of several timings is fastest, declared only beyond the run's own noise.

    Attributes:
        best: the clear winner, or None (none timed, too few calls, or a lead inside the noise).
        fastest: the lowest median, winner or not (None when nothing was timed).
        within_noise: the names whose timings cannot be told from the fastest's, it first.
        reason: one line saying why (``"no clear winner (within noise: ...)"`` when there is none).
    """

    best: str | None
    fastest: str | None
    within_noise: tuple[str, ...]
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fastest(timings: Mapping[str, Spread]) -> Fastest:
    """The fastest of ``timings`` (name → statistics of the same work, in ms), when it is clear.

    The lowest median wins only when its lead over every other exceeds the noise of both
    sides: the lead (the other's median minus its own) must be larger than its own upper spread
    (p75 − median) plus the other's lower spread (median − p25), that is, its p75 lies below
    every other's p25. Each side needs :data:`MIN_SAMPLES` calls; a single timing wins alone.
    """
    if not timings:
        return Fastest(None, None, (), "nothing was timed")
    ranked = sorted(timings, key=lambda name: timings[name].median)
    first = ranked[0]
    if len(ranked) == 1:
        return Fastest(first, first, (first,), f"{first} is the only one timed")
    lead = timings[first]
    few = [name for name in ranked if timings[name].n < MIN_SAMPLES]
    if few:
        counts = ", ".join(f"{name} {timings[name].n}" for name in few)
        return Fastest(
            None,
            first,
            tuple(ranked),
            f"no clear winner (within noise: too few timed calls to measure it, {counts}; "
            f"time at least {MIN_SAMPLES} calls each)",
        )

    def tied(name: str) -> bool:
        other = timings[name]
        return other.median - lead.median <= (lead.p75 - lead.median) + (other.median - other.p25)

    close = [first, *(name for name in ranked[1:] if tied(name))]
    if len(close) > 1:
        shown = ", ".join(f"{name} {spread(timings[name])}" for name in close)
        return Fastest(None, first, tuple(close), f"no clear winner (within noise: {shown})")
    runner = timings[ranked[1]]
    return Fastest(
        first,
        first,
        (first,),
        f"{first} is fastest: {spread(lead)} against {ranked[1]} {spread(runner)}, a lead beyond both spreads",
    )


@dataclass(frozen=True)
class Conditions:
    """What a timing was taken under: torch's CPU threads, the usable cores and the 1-minute
    load (:class:`handlerkit.worker.devices.CpuThreads`), measured before the timed runs (the load the
    machine had without them), and the warning when they make the numbers unreliable."""

    threads: devices.CpuThreads

    @classmethod
    def measure(cls) -> Conditions:
        """The conditions now (:func:`handlerkit.worker.devices.cpu_threads`)."""
        return cls(devices.cpu_threads())

    @property
    def warning(self) -> str | None:
        return self.threads.warning

    @property
    def busy(self) -> str | None:
        """``"at load 4.2 on 2 cores"`` when the 1-minute load was at least the usable cores
        (other work shared them, so a lead between timings may be the load's), else None."""
        load, cores = self.threads.load, self.threads.cores
        return f"at load {load:.1f} on {cores} core(s)" if load is not None and load >= cores else None

    def notes(self) -> list[str]:
        """The report's notes: the threads, and the warning when there is one."""
        return [f"torch: {self.threads}", *([self.warning] if self.warning else [])]

    def report(self, notes: list[str]) -> None:
        """Add :meth:`notes` to a timed report's ``notes``, the warning among them.

        Not a ``HandlerkitWarning`` as well: the report is what shows the numbers, so the one
        place the warning is read is beside them. Given both, a notebook showed it twice (the
        stderr line, then the report's note: issue 28, notebook 01's ``h.time``), and a
        terminal too (stderr, then the report on stdout).
        """
        notes.extend(self.notes())

    def to_dict(self) -> dict[str, Any]:
        return self.threads.to_dict()
