"""Repeated, device-synchronised timing of a handler's stages (``Harness.time`` / ``sweep``).

Timing passes call the handler's stage methods directly, without the per-stage capture
of logs, warnings and memory that a single harness step does, so what is measured is the
handler, not handlerkit.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from handlerkit.diagnostics.timing import SweepReport, Timer, TimingReport, time_callable_stages

__all__ = ["time_stages", "sweep_stages", "resize_batch"]


def _ms(timer: Timer) -> float:
    """Device time where the stage ran on an accelerator, else wall time."""
    return timer.device_ms if timer.device_ms is not None else timer.wall_ms


def _one_pass(harness: Any, batch: Any) -> Any:
    """A function doing one full pass and returning ``{stage: ms}``."""
    context = harness.context
    device = getattr(harness.handler, "device", None)

    if harness.single_stage:
        entry = harness.function if harness.is_function else harness.handler.handle

        def run_handle() -> dict[str, float]:
            batch.bind(context)
            with harness._imports(), Timer(device) as t:
                entry(batch.data, context)
            return {"handle": _ms(t)}

        return run_handle

    handler = harness.handler

    def run_stages() -> dict[str, float]:
        batch.bind(context)
        handler.context = context
        data = batch.data
        with harness._imports():
            with Timer(device) as t_pre:
                x = handler.preprocess(data)
            with Timer(device) as t_inf:
                y = handler.inference(x)
            with Timer(device) as t_post:
                handler.postprocess(y)
        return {"preprocess": _ms(t_pre), "inference": _ms(t_inf), "postprocess": _ms(t_post)}

    return run_stages


def _ensure_initialized(harness: Any) -> None:
    if "initialize" not in harness.results or not harness.results["initialize"].ok:
        harness.initialize()


def time_stages(harness: Any, batch: Any, warmup: int = 3, repeat: int = 20) -> TimingReport:
    """Per-stage statistics over ``repeat`` passes after ``warmup`` passes."""
    _ensure_initialized(harness)
    device = getattr(harness.handler, "device", None) or "cpu"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        samples = time_callable_stages(_one_pass(harness, batch), warmup=warmup, repeat=repeat)
    notes = []
    if getattr(getattr(harness.handler, "decisions", None), "compile", None) and harness.handler.decisions.compile.applied and warmup < 1:
        notes.append("the model is compiled and warmup is 0: the first pass includes compilation")
    if harness.batch is not None:  # put back the harness's own batch on the context
        harness.batch.bind(harness.context)
    return TimingReport.from_samples(samples, batch_size=len(batch), warmup=warmup, repeat=repeat, device=device, notes=notes)


def resize_batch(batch: Any, size: int) -> Any:
    """A batch of ``size`` requests, cycling through the given ones (``with_headers()`` copies them with fresh ids)."""
    from handlerkit.requests import batch as make_batch

    requests = list(batch.requests)
    if not requests:
        raise ValueError("cannot sweep an empty batch")
    return make_batch(*(requests[i % len(requests)].with_headers() for i in range(size)))


def sweep_stages(
    harness: Any, batch: Any, batch_sizes: Sequence[int] = (1, 2, 4, 8), warmup: int = 2, repeat: int = 10
) -> SweepReport:
    """Latency and throughput per stage at each batch size."""
    if not batch_sizes or any(not isinstance(n, int) or n < 1 for n in batch_sizes):
        raise ValueError(f"batch_sizes must be positive integers, got {list(batch_sizes)}")
    reports = [time_stages(harness, resize_batch(batch, n), warmup=warmup, repeat=repeat) for n in batch_sizes]
    return SweepReport(reports)
