"""The deploy-time recompile gate: will production traffic of these batch sizes recompile?

After warm-up, the batch is replayed at each size under
``torch.compiler.set_stance("fail_on_recompile")``, which turns what would be a recompile into
a ``RuntimeError`` instead of compiling: the gate leaves Dynamo's caches as it found them. A
torch without the stance replays the sizes as they come and counts the compiles (those then
happen, as traffic would cause them).

Used by :func:`handlerkit.diagnostics.compile.compile_report` and, for a compiled model only,
by ``Harness.check``. Nothing here imports torch unless the model is compiled.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from handlerkit.diagnostics._view import HarnessView
from handlerkit.diagnostics.compile.dynamo_events import DynamoEvents
from handlerkit.errors import StageError
from handlerkit.worker.contract import Problem

__all__ = [
    "FIX_DYNAMIC",
    "FIX_SIZE_ONE",
    "GateResult",
    "check_sizes",
    "eager_model",
    "gate_notes",
    "gate_problems",
    "run_gate",
]

FIX_DYNAMIC = (
    "set dynamic: true in the pt2 section (pt2: {compile: {enable: true, dynamic: true, ...}}), or call "
    "torch._dynamo.mark_dynamic(tensor, 0) on the batch in preprocess"
)
FIX_SIZE_ONE = (
    "Dynamo compiles a dimension of size 1 apart, even with dynamic: true: send a batch of 1 while warming "
    "up, or call torch._dynamo.decorators.mark_unbacked(tensor, 0) on the batch in preprocess"
)
_STANCE_FAILED = "fail_on_recompile"
_GUARD_LINE = re.compile(r"^\s*-\s*(.+)$")


@dataclass(frozen=True)
class GateResult:
    """One batch size replayed by the gate.

    Attributes:
        batch_size: requests in the replayed batch.
        outcome: ``"no recompile"``, ``"recompiles"`` or ``"fails"`` (the run failed for
            another reason).
        reason: the guard that failed (``"tensor 'x' size mismatch at index 0. expected 2,
            actual 4"``) or the error; ``""`` when it did not recompile.
        fix: what makes the recompile go away.
    """

    batch_size: int
    outcome: str
    reason: str = ""
    fix: str = ""

    @property
    def recompiles(self) -> bool:
        return self.outcome == "recompiles"


def eager_model(model: Any) -> Any | None:
    """The eager model behind a ``torch.compile`` d one (``_orig_mod``), None when not compiled.

    Looks at ``sys.modules`` only: nothing can be compiled before torch._dynamo is imported."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is None or model is None:
        return None
    optimized = getattr(eval_frame, "OptimizedModule", None)
    if optimized is not None and isinstance(model, optimized):
        return getattr(model, "_orig_mod", None)
    original = getattr(model, "_torchdynamo_orig_callable", None)
    if original is None:
        return None
    # torch.compile of a callable object wraps its call in a function (functools.wraps keeps it).
    if getattr(original, "__qualname__", "").startswith("wrap_inline."):
        return getattr(original, "__wrapped__", original)
    return original


def _stance() -> Any | None:
    compiler = getattr(sys.modules.get("torch"), "compiler", None)
    set_stance = getattr(compiler, "set_stance", None)
    return set_stance if callable(set_stance) else None


def _recompile_error(error: BaseException) -> BaseException | None:
    """The stance's 'Detected recompile' error in the chain of ``error``, if that is what it is."""
    seen: set[int] = set()
    current: BaseException | None = getattr(error, "original", None) or error.__cause__ or error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _STANCE_FAILED in str(current) and "recompile" in str(current).lower():
            return current
        current = getattr(current, "original", None) or current.__cause__ or current.__context__
    return None


def _guard_failures(message: str) -> str:
    """The guard failures the stance's message lists (``- 0/0: ...`` lines), or its first line."""
    lines = message.splitlines()
    for i, line in enumerate(lines):
        if "guard failure" in line:
            found = [m.group(1).strip() for m in map(_GUARD_LINE.match, lines[i + 1 :]) if m]
            if found:
                return "; ".join(found)
    return lines[0] if lines else message


def fix_for(reason: str) -> str:
    """The fix for a recompile, by what its guard says."""
    if re.search(r"\b2 <= .*size\(\)", reason):
        return FIX_SIZE_ONE
    if "size mismatch" in reason or "size()" in reason:
        return FIX_DYNAMIC
    return "make the inputs match what the model was compiled for, or " + FIX_DYNAMIC


def _replay(view: HarnessView, batch: Any, size: int, stance: Any) -> GateResult:
    from handlerkit.diagnostics.timing import resize_batch

    resized = resize_batch(batch, size)
    guard = stance(_STANCE_FAILED) if stance is not None else contextlib.nullcontext()
    with DynamoEvents() as events:
        try:
            with guard:
                view.run(resized)
        except StageError as exc:
            found = _recompile_error(exc)
            if found is None:
                return GateResult(size, "fails", f"{type(exc.original or exc).__name__}: {exc.message.splitlines()[0]}")
            reason = _guard_failures(str(found))
            return GateResult(size, "recompiles", reason, fix_for(reason))
    compiled = events.frames  # only without the stance: the compiles happened
    if compiled:
        reason = "; ".join(f.recompile_reason or f"{f.function} compiled" for f in compiled)
        return GateResult(size, "recompiles", reason, fix_for(reason))
    return GateResult(size, "no recompile")


def run_gate(view: HarnessView, batch: Any, sizes: Sequence[int], bar: Any = None) -> tuple[list[GateResult], bool]:
    """Replay ``batch`` resized to each of ``sizes`` (the model is warm already).

    Returns:
        the results, and whether the stance was available (False: the sizes compiled as they
        came, as traffic would make them).
    """
    stance = _stance()
    results = []
    for size in sizes:
        if bar is not None:
            bar.set_description(f"recompile gate: batch {size}")
        results.append(_replay(view, batch, size, stance))
        if bar is not None:
            bar.update()
    return results, stance is not None


def gate_problems(results: Sequence[GateResult]) -> list[Problem]:
    """One warning per fix: the sizes that recompile, the guard, and what to change."""
    by_fix: dict[str, list[GateResult]] = {}
    for r in results:
        if r.recompiles:
            by_fix.setdefault(r.fix, []).append(r)
    problems = []
    for fix, found in by_fix.items():
        sizes = ", ".join(str(r.batch_size) for r in found)
        problems.append(
            Problem(
                "recompile",
                f"the compiled model recompiles for batch size {sizes} (a request waits for the compile): "
                f"{found[0].reason}",
                fix,
                "inference",
                severity="warning",
            )
        )
    for r in results:
        if r.outcome == "fails":
            problems.append(
                Problem("recompile", f"batch size {r.batch_size} fails: {r.reason}", "", "handle", severity="warning")
            )
    return problems


def check_sizes(view: HarnessView, batch: Any) -> list[int]:
    """Sizes production can send: powers of two up to the larger of the batch and ``batchSize``."""
    from handlerkit.diagnostics.timing import batch_sizes

    configured = 1
    properties = getattr(view.context, "system_properties", None) or {}
    config = getattr(view.context, "model_yaml_config", None) or {}
    for value in (properties.get("batch_size"), config.get("batchSize") if isinstance(config, dict) else None):
        if isinstance(value, int) and not isinstance(value, bool) and value > configured:
            configured = value
    return batch_sizes(max(len(batch), configured))


def gate_notes(report: Any, stance: bool) -> None:
    """What to know next to the gate's verdicts (``report``: a :class:`~.compile.CompileReport`)."""
    if not stance:
        report.notes.append(
            "this torch has no torch.compiler.set_stance: the gate let the sizes compile, as traffic would"
        )
    if report.recompiling_sizes and report.pt2_settings.get("dynamic") is None:
        report.notes.append(
            "without the gate, Dynamo recompiles at the first new batch size and then treats the batch "
            "dimension as dynamic (automatic dynamic shapes): that one compile still lands on a live request"
        )
