"""The reports a :class:`~handlerkit.harness.Harness` offers, as thin calls into :mod:`handlerkit.diagnostics`.

Each report reads the harness through :class:`handlerkit.diagnostics._view.HarnessView` and
imports its diagnostics module only when called, so ``import handlerkit`` stays light.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from handlerkit.worker.batches import Batch

if TYPE_CHECKING:
    from handlerkit.diagnostics._view import HarnessView

__all__ = ["Reports"]


class Reports:
    """Mixed into the Harness: ``time``, ``sweep``, ``device_report``, ``check``,
    ``compile_report``, ``profile``, ``compare_formats``."""

    def time(self, batch_or_data: Any, warmup: int = 3, repeat: int = 20, *, progress: bool | None = None) -> Any:
        """Per-stage min / median / p90 / mean over ``repeat`` runs (device-synchronised)."""
        from handlerkit.diagnostics.timing import time_stages

        return time_stages(self._view, Batch.coerce(batch_or_data), warmup=warmup, repeat=repeat, progress=progress)

    def sweep(
        self,
        batch_or_data: Any,
        batch_sizes: Sequence[int] = (1, 2, 4, 8),
        warmup: int = 2,
        repeat: int = 10,
        *,
        progress: bool | None = None,
    ) -> Any:
        """Latency and throughput per stage for each batch size (requests repeated to size)."""
        from handlerkit.diagnostics.timing import sweep_stages

        return sweep_stages(
            self._view,
            Batch.coerce(batch_or_data),
            batch_sizes=batch_sizes,
            warmup=warmup,
            repeat=repeat,
            progress=progress,
        )

    def device_report(self) -> Any:
        """Device chosen and why, accelerators, TF32, where parameters and stage tensors live."""
        from handlerkit.diagnostics.device import build_device_report

        return build_device_report(self._view)

    def check(self, batch_or_data: Any, *, atol: float = 1e-4, rtol: float = 1e-4, progress: bool | None = None) -> Any:
        """Contract checks: output shape/type, statuses, batch parity, request encodings, and for
        a compiled model the recompile gate."""
        from handlerkit.diagnostics.checks import run_checks

        return run_checks(self._view, Batch.coerce(batch_or_data), atol=atol, rtol=rtol, progress=progress)

    def compile_report(
        self,
        batch_or_data: Any,
        *,
        batch_sizes: Sequence[int] | None = None,
        repeat: int = 10,
        warmup: int = 1,
        progress: bool | None = None,
    ) -> Any:
        """Did ``torch.compile`` apply, what it cost (the first call, split into Dynamo and
        backend), graph breaks, recompiles, compiled against eager over ``repeat`` steady calls;
        with ``batch_sizes`` the deploy-time gate: will traffic of those sizes recompile?"""
        from handlerkit.diagnostics.compile import compile_report

        return compile_report(
            self._view,
            Batch.coerce(batch_or_data),
            batch_sizes=batch_sizes,
            repeat=repeat,
            warmup=warmup,
            progress=progress,
        )

    def profile(
        self,
        batch_or_data: Any,
        *,
        top: int = 10,
        record_shapes: bool = False,
        trace: str | os.PathLike[str] | None = None,
        progress: bool | None = None,
    ) -> Any:
        """One run under ``torch.profiler``: the top operators of each stage; ``trace`` writes a
        Chrome/Perfetto trace."""
        from handlerkit.diagnostics.profile import profile_stages

        return profile_stages(
            self._view,
            Batch.coerce(batch_or_data),
            top=top,
            record_shapes=record_shapes,
            trace=trace,
            progress=progress,
        )

    def compare_formats(
        self,
        batch_or_data: Any,
        *,
        formats: Sequence[str] | None = None,
        repeat: int = 20,
        warmup: int = 2,
        atol: float = 1e-4,
        rtol: float = 1e-4,
        directory: str | os.PathLike[str] | None = None,
        save: str | None = None,
        replace: bool = False,
        dynamic_shapes: Mapping[str | int, Sequence[int]] | None = None,
        progress: bool | None = None,
    ) -> Any:
        """The model exported to each format (eager, torchscript, onnx, export; aoti, compile on
        request) inside the handler's own pre- and postprocessing: do the answers agree, and what
        does each cost (export, first call, steady state, memory, size, batch sizes, the input
        dimensions it takes)? ``save=FORMAT`` saves that format into the model dir when it agrees
        and the saved dir serves the batch's sizes (``replace``: earlier saves deleted);
        ``dynamic_shapes={"item_ids": [1]}`` declares input dimensions that vary besides the batch."""
        from handlerkit.diagnostics.format_lab import compare_formats

        return compare_formats(
            self._view,
            Batch.coerce(batch_or_data),
            formats=formats,
            repeat=repeat,
            warmup=warmup,
            atol=atol,
            rtol=rtol,
            directory=directory,
            save=save,
            replace=replace,
            dynamic_shapes=dynamic_shapes,
            progress=progress,
        )

    @property
    def _view(self) -> HarnessView:
        """This object as the diagnostics read it (the Harness that mixes this class in is one)."""
        return cast("HarnessView", self)
