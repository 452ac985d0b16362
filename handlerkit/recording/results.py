"""What the harness keeps: one :class:`StageResult` per stage, one :class:`Run` per batch.

Both render themselves (``repr`` one line, ``str`` a table, HTML in Jupyter) through
:class:`handlerkit._render.Rendered`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from handlerkit._render import Rendered, Table
from handlerkit._text import format_bytes, format_number
from handlerkit.errors import StageError
from handlerkit.summaries import TensorInfo, describe, iter_tensors, tensor_infos, tensor_summary
from handlerkit.worker.contract import HANDLER_STAGES, check_output
from handlerkit.worker.streaming import collect

if TYPE_CHECKING:
    from handlerkit.worker.streaming import Chunk, ChunkSocket, RequestStream

__all__ = ["LogEntry", "Run", "StageResult", "TensorInfo", "run_mode"]


@dataclass(slots=True)
class LogEntry:
    """One log record emitted during a stage."""

    level: str
    logger: str
    message: str


@dataclass(slots=True, repr=False)
class StageResult(Rendered):
    """What one stage took and gave.

    Attributes:
        stage: the stage's name.
        input / output: what the stage received and returned (``output`` is None on error).
            When ``handle`` called the stage more than once in one run (micro-batching),
            both are lists holding each call's value, in call order.
        calls: how many times the stage ran in this result (1 for a single step).
        wall_ms: wall-clock time (summed over calls); ``device_ms``: device-synchronised time
            on an accelerator.
        cpu_peak_bytes / cpu_peak_delta_bytes / cuda_peak_bytes: peak memory during the stage.
        tensors: devices, dtypes and shapes of the output's tensors (``input_tensors`` likewise).
        logs, warnings: records emitted during the stage.
        metrics: metric records the handler added during the stage.
        error: the :class:`~handlerkit.errors.StageError`, when the stage raised.
        problems: contract problems (:class:`~handlerkit.worker.contract.Problem`) found in the output.
        source: the handler that produced it (pictures read its transforms and label mapping).
    """

    stage: str
    input: Any = None
    output: Any = None
    wall_ms: float = 0.0
    device_ms: float | None = None
    cpu_peak_bytes: int | None = None
    cpu_peak_delta_bytes: int | None = None
    cuda_peak_bytes: int | None = None
    logs: list[LogEntry] = field(default_factory=list)
    warnings: list[warnings.WarningMessage] = field(default_factory=list)
    metrics: list[Any] = field(default_factory=list)
    error: StageError | None = None
    problems: list[Any] = field(default_factory=list)
    calls: int = 1
    source: Any = field(default=None, repr=False, compare=False)

    _tensors: list[TensorInfo] | None = field(default=None, repr=False)
    _input_tensors: list[TensorInfo] | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def device_or_wall_ms(self) -> float:
        """The stage's time as the reports compare it: ``device_ms`` on an accelerator, else ``wall_ms``."""
        return self.device_ms if self.device_ms is not None else self.wall_ms

    @property
    def tensors(self) -> list[TensorInfo]:
        """Devices, dtypes and shapes of the output's tensors (found on first access)."""
        if self._tensors is None:
            self._tensors = tensor_infos(self.output)
        return self._tensors

    @property
    def input_tensors(self) -> list[TensorInfo]:
        if self._input_tensors is None:
            self._input_tensors = tensor_infos(self.input)
        return self._input_tensors

    @property
    def devices(self) -> list[str]:
        return sorted({t.device for t in self.tensors + self.input_tensors})

    def _summary(self) -> str:
        if self.ok:
            status = "ok"
        else:
            original = self.error.original if self.error is not None else None
            status = f"error={type(original).__name__ if original is not None else 'StageError'}"
        calls = f" {self.calls} calls" if self.calls != 1 else ""
        return f"{self.stage} {status}{calls} {self.wall_ms:.2f} ms output={describe(self.output)}"

    def _tables(self) -> list[Table]:
        rows: list[tuple[str, Any]] = [("status", "ok" if self.ok else f"error: {self.error}")]
        if self.calls != 1:
            rows.append(("calls", self.calls))
        rows.append(("wall", f"{format_number(self.wall_ms)} ms"))
        if self.device_ms is not None:
            rows.append(("device time", f"{format_number(self.device_ms)} ms"))
        if self.cpu_peak_delta_bytes is not None:  # 0: the stage grew nothing the RSS could see
            peak = format_bytes(self.cpu_peak_delta_bytes) if self.cpu_peak_delta_bytes else "— (no growth measured)"
            rows.append(("peak memory (CPU, above start)", peak))
        if self.cuda_peak_bytes is not None:
            rows.append(("peak memory (CUDA)", format_bytes(self.cuda_peak_bytes)))
        rows += _value_rows("output", self.output, limit=8)
        rows += _value_rows("input", self.input, limit=4, only_tensors=True)
        for w in self.warnings[:5]:
            rows.append(("warning", f"{w.category.__name__}: {w.message}"))
        for entry in self.logs[:5]:
            rows.append(("log", f"{entry.level} {entry.logger}: {entry.message}"))
        for m in self.metrics[:5]:
            rows.append(("metric", f"{m.name} = {m.value} {m.unit}"))
        for p in self.problems[:5]:
            rows.append(("problem", str(p)))
        return [Table(("", ""), rows)]


@dataclass(slots=True, repr=False)
class Run(Rendered):
    """All stages of one batch: ``output`` is what ``handle`` returned.

    A run whose handler raised still has a Run (``h.last_run``; the StageError is raised by
    ``h.run``): its ``error`` is that StageError, its ``output`` None, its stages those that ran
    (the failed one holds the error and the input it failed on), its ``chunks`` what a
    streaming handler sent before it failed; it shows the error first.

    Attributes:
        output: ``handle``'s return value (None when it raised).
        stages: ``initialize`` and then each stage ``handle`` ran, in the order it first ran
            them; then a ``handle`` stage when it ran none of them, or when it raised outside
            them (that stage carries the error).
        batch_size: requests in the batch.
        mode: ``"stages"`` (preprocess → inference → postprocess), ``"explain"``,
            ``"describe"``, or ``"handle"`` (handle ran no stage method).
        handle_ms: the whole ``handle`` call, stages and what ``handle`` did around them.
        source: the handler that produced it.
        chunks: what a streaming handler sent before ``handle`` returned, one
            :class:`~handlerkit.worker.streaming.Chunk` per request per send, in send order (each
            with its request id, payload, status, headers and time).
        streams: per request of the batch that got chunks, a
            :class:`~handlerkit.worker.streaming.RequestStream`: its chunks, time to first chunk,
            inter-chunk p50/p99.
        error: the :class:`~handlerkit.errors.StageError` ``handle`` raised; None when it returned.
        initialized: whether ``initialize`` ran in this run (``h.run`` initializes first when
            it has not succeeded); when not, ``stages["initialize"]`` is the earlier one the run
            used, and the run's tables leave it out (:attr:`ran`).
    """

    output: Any
    stages: dict[str, StageResult]
    batch_size: int
    mode: str = "stages"
    handle_ms: float | None = None
    source: Any = field(default=None, repr=False, compare=False)
    chunks: list[Chunk] = field(default_factory=list)
    streams: list[RequestStream] = field(default_factory=list)
    error: StageError | None = None
    initialized: bool = True

    @classmethod
    def failed(
        cls,
        stages: dict[str, StageResult],
        batch_size: int,
        handle_ms: float | None,
        error: StageError,
        source: Any = None,
        socket: ChunkSocket | None = None,
        context: Any = None,
    ) -> Run:
        """The Run of a batch whose handler raised ``error``: the stages that ran, no output, and
        the chunks a streaming handler sent before it failed (``socket``, a
        :class:`~handlerkit.worker.streaming.ChunkSocket` of ``context``)."""
        run = cls(None, stages, batch_size, run_mode(stages), handle_ms, source=source, error=error)
        if socket is not None and socket.sent and handle_ms is not None:
            # No final answer ends these streams: the worker answers the batch with the error, as
            # it does for a non-list output (which is what check_output(None) reports).
            sent = collect(socket, context, handle_ms, None, check_output(None, batch_size))
            run.chunks, run.streams = sent.chunks, sent.streams
        return run

    @property
    def timings(self) -> dict[str, float]:
        return {name: r.wall_ms for name, r in self.stages.items()}

    @property
    def ran(self) -> dict[str, StageResult]:
        """The stages that ran in this run: :attr:`stages`, less an ``initialize`` from before it."""
        if self.initialized:
            return self.stages
        return {name: r for name, r in self.stages.items() if name != "initialize"}

    @property
    def total_ms(self) -> float:
        """``handle``'s time when measured, else the stages' sum (``initialize`` excluded)."""
        if self.handle_ms is not None:
            return self.handle_ms
        return sum(r.wall_ms for name, r in self.stages.items() if name != "initialize")

    @property
    def problems(self) -> list[Any]:
        return [p for r in self.stages.values() for p in r.problems]

    @property
    def ok(self) -> bool:
        """The handler returned and no error is among the problems: TorchServe would send this output."""
        return self.error is None and not any(p.severity == "error" for p in self.problems)

    def _summary(self) -> str:
        problems = self.problems
        verdict = f", {len(problems)} problem(s)" if problems else ""
        streamed = ""
        if self.chunks:
            first = min((s.first_chunk_ms for s in self.streams), default=None)
            after = f", first after {first:.2f} ms" if first is not None else ""
            streamed = f", {len(self.chunks)} chunk(s){after}"
        took = f", {self.total_ms:.2f} ms" if self.handle_ms is not None or self.error is None else ""
        head = f"Run of {self.batch_size} request(s){took}{streamed}{verdict}"
        if self.error is not None:
            return f"{head}, FAILED: {self.error.message.splitlines()[0]}"
        return head

    def _tables(self) -> list[Table]:
        rows, inner = [], []
        for name, r in self.ran.items():
            tensors = list(iter_tensors(r.output, limit=9))
            bare = len(tensors) == 1 and tensors[0][0] == "<value>"
            shown = tensor_summary(r.output) if bare else describe(r.output)
            if r.error is not None:
                original = r.error.original
                shown = f"raised {type(original).__name__ if original is not None else 'StageError'}"
            rows.append([name, r.calls, r.wall_ms, shown])
            if not bare:
                inner += [[name, f"output{path}", tensor_summary(t)] for path, t in tensors[:8]]
        tables = [Table(("stage", "calls", "wall ms", "output"), rows)]
        if self.error is not None:  # what a person looks at first
            tables.insert(0, _error_table(self.error))
        if inner:
            tables.append(Table(("stage", "tensor", "summary"), inner, "tensors in the outputs"))
        if self.streams:
            tables.append(_streams_table(self.streams))
        problems = self.problems
        if problems:
            problem_rows = [
                [p.severity, p.stage or "", "" if p.request_index is None else p.request_index, p.message, p.fix]
                for p in problems
            ]
            tables.append(Table(("severity", "stage", "request", "problem", "fix"), problem_rows, "contract problems"))
        return tables


def _error_table(error: StageError) -> Table:
    """A failed run's error: what was raised, where, its fix, and where the failed stage's input is."""
    lines = error.message.splitlines()
    rows: list[tuple[str, Any]] = [("error", lines[0])]
    if error.location is not None:
        file, line, text = error.location
        rows.append(("at", f"{file}:{line}: {text}"))
    rows += [("", more.strip()) for more in lines[1:] if not more.strip().startswith("at ")]
    if error.fix:
        rows.append(("fix", error.fix))
    if error.stage not in ("initialize", "reload"):
        rows.append(("its input", f"h.last_run.stages[{error.stage!r}].input: what {error.stage} failed on"))
    return Table(("", ""), rows, "the run failed: handle raised, so there is no output", wrap=100)


def run_mode(stages: dict[str, StageResult]) -> str:
    """A Run's ``mode`` from the stages ``handle`` ran (see :class:`Run`)."""
    if "describe" in stages:
        return "describe"
    if "explain" in stages:
        return "explain"
    return "stages" if any(s in stages for s in HANDLER_STAGES) else "handle"


def _streams_table(streams: list[RequestStream]) -> Table:
    def ms(value: float | None) -> Any:
        return "" if value is None else value

    rows = [
        [s.index, s.request_id, len(s.chunks), ms(s.first_chunk_ms), ms(s.inter_chunk_p50_ms), ms(s.inter_chunk_p99_ms)]
        for s in streams
    ]
    headers = ("request", "id", "chunks", "first chunk ms", "inter-chunk p50 ms", "p99 ms")
    return Table(headers, rows, "streamed before handle returned (the final answer counts as the last chunk)")


def _value_rows(label: str, value: Any, *, limit: int, only_tensors: bool = False) -> list[tuple[str, str]]:
    """Table rows for a stage value: a tensor's one-line summary, or the value's description
    followed by a summary row per tensor inside it (``output[0]['boxes']``)."""
    tensors = list(iter_tensors(value, limit=limit))
    if len(tensors) == 1 and tensors[0][0] == "<value>":
        return [(label, tensor_summary(value))]
    rows = [] if only_tensors and not tensors else [(label, describe(value))]
    return rows + [(f"{label}{path}", tensor_summary(t)) for path, t in tensors]
