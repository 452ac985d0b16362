"""Stateful sequences and continuous batching, stepped as TorchServe 0.12's frontend and worker run them.

A model with ``sequenceBatching: true`` in model-config.yaml serves *sequences*: requests that
share a sequence id, answered in order by one worker whose handler keeps their state (in
``context.cache``, an LRU, anything). With ``continuousBatching: true`` a request the handler
leaves unfinished stays in the running batch and is called again in the next step, while new
requests join. :class:`Sequences` plays the frontend's part around a
:class:`~handlerkit.harness.Harness`, one worker call per :meth:`Sequences.step`:

- **Headers** (``InferenceRequestHandler``): a request sent without a sequence id opens a new
  sequence: the frontend names it ``ts-seq-<uuid4>`` and adds ``ts_request_sequence_start:
  "true"``; every request of a sequence carries ``ts_request_sequence_id`` (names from
  ``context.header_key_sequence_*``, which TorchServe takes from ``TS_REQUEST_SEQUENCE_*``).
  So ``context.get_sequence_id(idx)`` and ``get_request_header`` answer as in the server.
- **Batches** (``SequenceBatching``): each step takes at most one new request per sequence, in
  the order the sequences opened, up to ``batchSize`` requests; under continuous batching
  (``SequenceContinuousBatching``) the running batch holds up to ``2 * batchSize`` (TorchServe
  0.12 hard-codes the factor), the requests still running first, then those joining (the
  rule, shared with the Ray replica's loop: :mod:`handlerkit.worker.sequence_batches`).
- **Unfinished requests**: the worker's ``create_predict_response`` sets each final answer's
  ``ts_stream_next`` header: from ``context.stopping_criteria[idx](answer)`` when the handler
  set them (False → ``"true"``, True → ``"false"``, None → left as it is), else a ``"true"``
  left by the handler becomes ``"false"``. Under continuous batching a request whose answer
  says ``"true"`` stays, and the frontend sends it again with the same request id and headers
  but no parameters (its data row is ``{}``: ``setCachedInBackend``); no header or ``"false"``
  ends it. Its intermediate chunks (``send_intermediate_predict_response``) and each step's
  answer are kept on its :class:`Job`, in order: what its client receives.
- **Ends**: a response header ``ts_request_sequence_end`` (sequence ids joined by ``;``) closes
  those sequences: requests still queued in them are never answered (``dropped``), and a later
  request with the same id opens a new sequence without the start header.
- **Limits**: ``maxSequenceJobQueueSize`` (default 1) queued requests per sequence and
  ``maxNumSequence`` open sequences (no limit when unset); the frontend answers a request
  beyond them 503, here a :class:`~handlerkit.errors.HandlerkitError`. A batch the worker
  fails (the handler raised, or answered no list of one item per request) ends every request
  in it, as the frontend's ``cleanJobs``: here the step is recorded and the StageError raised.

``sequenceMaxIdleMSec`` (a sequence left idle expires) is not simulated: steps are yours to
call, so no time passes between them.

Example::

    h = hk.Harness.open("stateful_model")
    seqs = hk.Sequences(h)                      # batchSize, continuousBatching ... from its config
    s = seqs.start(hk.Request.text("1"))        # opens ts-seq-<uuid>
    s.send(hk.Request.text("3"))
    steps = seqs.run()                          # steps until nothing is queued or running
    [step.request_ids for step in steps]        # who was in each worker call
    seqs.cache                                  # the handler's context.cache now
"""

from __future__ import annotations

import uuid
import warnings
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from handlerkit._render import Rendered, Table
from handlerkit.errors import HandlerkitError
from handlerkit.recording.results import Run
from handlerkit.worker.batches import Batch
from handlerkit.worker.requests import Request
from handlerkit.worker.sequence_batches import capacity, next_batch, resent
from handlerkit.worker.streaming import Chunk, final_stream_next

__all__ = ["Job", "Sequence", "Sequences", "Step"]

JobState = Literal["queued", "running", "done", "cancelled", "failed", "dropped"]
#: What became of a request in one step (:meth:`Step.state_of`), as the step pictures colour it.
StepState = Literal["joined", "running", "finished", "cancelled", "failed"]


@dataclass(eq=False)
class Job:
    """One request of a sequence, as the frontend keeps it.

    Attributes:
        request: the request as the worker first receives it (sequence headers included).
        sequence_id: its sequence.
        state: ``queued``, ``running`` (answered unfinished: called again next step), ``done``,
            ``cancelled`` (it left in the step that ran its sequence's cancel request),
            ``failed`` (its batch failed) or ``dropped`` (its sequence ended before it ran).
        cancels: it is its sequence's cancel request (sent with :meth:`Sequence.cancel`).
        steps: the steps it was in.
        answers: its answer of each of those steps (what ``handle`` returned for it).
        chunks: the intermediate chunks sent for it, in all its steps.
        headers: the response headers of its last step.
    """

    request: Request
    sequence_id: str
    state: JobState = "queued"
    steps: list[int] = field(default_factory=list)
    answers: list[Any] = field(default_factory=list)
    chunks: list[Chunk] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    cancels: bool = False

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def answer(self) -> Any:
        """Its last answer (None before it ran)."""
        return self.answers[-1] if self.answers else None

    def resent(self) -> Request:
        """The request as the frontend sends it again: same id and headers, no parameters."""
        return resent(self.request)

    def __repr__(self) -> str:
        return f"<Job {self.request_id[:8]} of {self.sequence_id}: {self.state}, answers={self.answers!r}>"


class Sequence:
    """A sequence: requests sharing one sequence id, answered in the order sent."""

    def __init__(self, owner: Sequences, sequence_id: str) -> None:
        self.id = sequence_id
        self.jobs: list[Job] = []
        self.queue: deque[Job] = deque()
        #: True once the handler ended it (``ts_request_sequence_end``).
        self.finished = False
        self._owner = owner

    def send(self, request: Request) -> Job:
        """Queue ``request`` in this sequence (it runs in a later step)."""
        return self._owner.send(request, sequence_id=self.id)

    def cancel(self, request: Request) -> Job:
        """Queue ``request`` as this sequence's cancel. TorchServe has no cancel of its own: the
        handler reads a request as one (its example takes ``-1``) and its stopping criteria end
        the sequence's running streams; those leaving in that step are marked ``cancelled``."""
        job = self.send(request)
        job.cancels = True
        return job

    @property
    def answers(self) -> list[Any]:
        """Each request's last answer, in the order sent (None for one not answered)."""
        return [job.answer for job in self.jobs]

    def __repr__(self) -> str:
        state = "ended" if self.finished else "open"
        return f"<Sequence {self.id}: {len(self.jobs)} requests, {len(self.queue)} queued, {state}>"


@dataclass(repr=False)
class Step(Rendered):
    """One worker call: the running batch and what became of each request.

    Attributes:
        index: its position (0 for the first).
        request_ids: the batch's request ids, in batch order; ``sequence_ids`` their sequences.
        joined: those sent for the first time; ``continued`` those called again.
        answers: each request's answer, in batch order (empty when the batch failed).
        headers: each request's response headers, as the frontend reads them (``ts_stream_next``
            as the worker sets it; empty when the batch failed).
        left: those finished after it (``cancelled``: those of them its sequence's cancel
            request ended); ``ended``: sequences it closed.
        run: the Harness's :class:`~handlerkit.recording.results.Run` (None when the batch failed).
        cache: a copy of ``context.cache`` after it (dicts and lists copied, other values shared).
        error: the failure that ended the whole batch, else None.
    """

    index: int
    request_ids: list[str]
    sequence_ids: list[str]
    joined: list[str]
    continued: list[str]
    answers: list[Any] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    run: Run | None = None
    cache: Any = None
    error: BaseException | None = None

    def _summary(self) -> str:
        how = f"{len(self.joined)} joined, {len(self.continued)} continued, {len(self.left)} left"
        failed = f", failed: {str(self.error).splitlines()[0]}" if self.error is not None else ""
        return f"step {self.index}: {len(self.request_ids)} requests ({how}){failed}"

    def state_of(self, request_id: str) -> StepState:
        """What became of ``request_id`` in this step: ``failed`` (the batch failed),
        ``cancelled``, ``finished`` (it left), ``joined`` (sent for the first time, it stays) or
        ``running`` (called again, it stays)."""
        if request_id not in self.request_ids:
            raise KeyError(f"request {request_id} was not in step {self.index} (its requests: {self.request_ids})")
        if self.error is not None:
            return "failed"
        if request_id in self.cancelled:
            return "cancelled"
        if request_id in self.left:
            return "finished"
        return "joined" if request_id in self.joined else "running"

    def chunks_of(self, request_id: str) -> list[Chunk]:
        """The chunks sent for ``request_id`` in this step."""
        index = self.request_ids.index(request_id)
        return [c for c in self.run.chunks if c.index == index] if self.run is not None else []

    def _tables(self) -> list[Table]:
        answers = self.answers or [None] * len(self.request_ids)
        then = {"joined": "runs on", "running": "runs on", "finished": "left"}
        rows = [
            (
                rid[:8],
                seq,
                "joined" if rid in self.joined else "continued",
                _short(answer),
                _short("".join(c.text for c in sent)) if (sent := self.chunks_of(rid)) else "",
                then.get(state := self.state_of(rid), state),
            )
            for rid, seq, answer in zip(self.request_ids, self.sequence_ids, answers, strict=True)
        ]
        return [Table(("request", "sequence", "came", "answer", "chunks", "then"), rows)]

    def _notes(self) -> list[str]:
        return [f"ended sequence {s}" for s in self.ended]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class Sequences:
    """TorchServe's frontend for stateful sequences, in front of a Harness: see the module docs.

    Args:
        harness: the Harness whose handler answers (initialized on the first step if needed).
        batch_size / continuous / max_sequence_job_queue_size / max_num_sequence: the model
            config's ``batchSize``, ``continuousBatching``, ``maxSequenceJobQueueSize`` and
            ``maxNumSequence``; None takes them from ``harness.context.model_yaml_config``.
    """

    def __init__(
        self,
        harness: Any,
        *,
        batch_size: int | None = None,
        continuous: bool | None = None,
        max_sequence_job_queue_size: int | None = None,
        max_num_sequence: int | None = None,
    ) -> None:
        config = getattr(harness.context, "model_yaml_config", None) or {}
        self.harness = harness
        self.batch_size = max(1, int(batch_size or config.get("batchSize") or 1))
        self.continuous = bool(config.get("continuousBatching", False) if continuous is None else continuous)
        self.max_queue = int(max_sequence_job_queue_size or config.get("maxSequenceJobQueueSize") or 1)
        limit = max_num_sequence or config.get("maxNumSequence")
        self.max_num_sequence = int(limit) if limit else None
        context = harness.context
        self.key_id = getattr(context, "header_key_sequence_id", "ts_request_sequence_id")
        self.key_start = getattr(context, "header_key_sequence_start", "ts_request_sequence_start")
        self.key_end = getattr(context, "header_key_sequence_end", "ts_request_sequence_end")
        self.sequences: dict[str, Sequence] = {}  # the open ones, in the order they opened
        self.jobs: list[Job] = []
        self.steps: list[Step] = []
        self._running: list[Job] = []
        self._warned: set[str] = set()  # the warnings shown already (see _run_warning_once)

    # -- sending ---------------------------------------------------------------------------
    def start(self, request: Request, sequence_id: str | None = None) -> Sequence:
        """Open a sequence with ``request``: without ``sequence_id`` as the frontend opens one
        (a fresh ``ts-seq-<uuid4>`` and the start header); with it, the client's own id."""
        job = self.send(request, sequence_id=sequence_id)
        return self.sequences[job.sequence_id]

    def send(self, request: Request, sequence_id: str | None = None) -> Job:
        """Queue ``request`` in sequence ``sequence_id`` (a new one when None, or when no open
        sequence has that id), with the headers the frontend adds."""
        if not isinstance(request, Request) or request.item:
            raise TypeError(
                f"a sequence request comes through the frontend, with headers: expected an hk.Request "
                f"(Request.text/json/from_file/form), got {request!r}"
            )
        headers = {self.key_id: sequence_id} if sequence_id else {}
        if not sequence_id:
            sequence_id = f"ts-seq-{uuid.uuid4()}"
            headers = {self.key_start: "true", self.key_id: sequence_id}
        sequence = self.sequences.get(sequence_id)
        if sequence is None:
            if self.max_num_sequence is not None and len(self.sequences) >= self.max_num_sequence:
                raise HandlerkitError(
                    f"{len(self.sequences)} sequences are open, the most maxNumSequence allows "
                    f"({self.max_num_sequence}): TorchServe answers this request 503",
                    fix="let a sequence end first (the handler sets ts_request_sequence_end), or raise "
                    "maxNumSequence in model-config.yaml",
                )
            sequence = self.sequences[sequence_id] = Sequence(self, sequence_id)
        if len(sequence.queue) >= self.max_queue:
            raise HandlerkitError(
                f"sequence {sequence_id} already has {len(sequence.queue)} requests queued, the most "
                f"maxSequenceJobQueueSize allows ({self.max_queue}): TorchServe answers this request 503",
                fix="run a step first (seqs.step()), or raise maxSequenceJobQueueSize in model-config.yaml",
            )
        job = Job(request.with_headers(headers), sequence_id)
        sequence.jobs.append(job)
        sequence.queue.append(job)
        self.jobs.append(job)
        return job

    # -- stepping --------------------------------------------------------------------------
    @property
    def running(self) -> list[Job]:
        """The requests answered unfinished, called again in the next step."""
        return list(self._running)

    @property
    def pending(self) -> bool:
        """Whether a step has work: a request queued or running."""
        return bool(self._running) or any(s.queue for s in self.sequences.values())

    @property
    def cache(self) -> Any:
        """The handler's ``context.cache`` as it is now (None when it set none)."""
        return getattr(self.harness.context, "cache", None)

    def step(self) -> Step | None:
        """One worker call on the batch the frontend forms now (None when there is no work)."""
        size = capacity(self.batch_size, self.continuous)
        continued, joining = next_batch(self._running, (s.queue for s in self.sequences.values()), size)
        jobs = continued + joining
        if not jobs:
            return None
        step = Step(
            len(self.steps),
            [j.request_id for j in jobs],
            [j.sequence_id for j in jobs],
            [j.request_id for j in joining],
            [j.request_id for j in continued],
        )
        self.steps.append(step)
        batch = Batch([j.resent() if j in continued else j.request for j in jobs])
        for job in jobs:
            job.state = "running"
            job.steps.append(step.index)
        try:
            run = self._run_warning_once(batch)
            output = run.output
            if not isinstance(output, list) or len(output) != len(jobs):
                raise HandlerkitError(
                    f"handle answered {type(output).__name__} for a batch of {len(jobs)}: TorchServe's "
                    "worker fails the whole batch (503) and every request in it ends",
                    fix="return a list with one answer per request",
                )
        except Exception as exc:
            self._fail(step, jobs, exc)
            raise
        step.run, step.answers = run, list(output)
        self._answered(step, jobs, run)
        step.cache = _copied(self.cache)
        return step

    def run(self, max_steps: int = 1000) -> list[Step]:
        """Step until no request is queued or running; the steps taken."""
        taken: list[Step] = []
        while self.pending:
            if len(taken) >= max_steps:
                raise HandlerkitError(
                    f"{max_steps} steps ran and {len(self._running)} requests are still unfinished "
                    f"({', '.join(j.request_id[:8] for j in self._running)})",
                    fix="check that the handler ends each stream (its stopping criteria return True, "
                    "or it leaves ts_stream_next unset), or pass a larger max_steps",
                )
            step = self.step()
            if step is not None:
                taken.append(step)
        return taken

    def _run_warning_once(self, batch: Batch) -> Run:
        """``harness.run(batch)``, its warnings shown the first time each is said: a sequence's
        steps are many runs of one handler, whose contract problems would repeat at every step
        (they stay in each step's ``run.problems``)."""
        caught: list[warnings.WarningMessage] = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                return self.harness.run(batch)
        finally:
            for said in caught:
                if str(said.message) not in self._warned:
                    self._warned.add(str(said.message))
                    warnings.warn_explicit(said.message, said.category, said.filename, said.lineno)

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def _answered(self, step: Step, jobs: list[Job], run: Run) -> None:
        context = self.harness.context
        # The Harness set the final marks when chunks were sent (streaming.collect); else they are set here, once.
        stream_next = (
            [context.get_response_headers(i).get("ts_stream_next") for i in range(len(run.output))]
            if run.chunks
            else final_stream_next(context, run.output)
        )
        responses = context.responses()
        still: list[Job] = []
        for idx, job in enumerate(jobs):
            job.answers.append(run.output[idx])
            job.chunks.extend(c for c in run.chunks if c.index == idx)
            job.headers = dict(responses[idx].headers)
            step.headers.append(job.headers)
            for ended in filter(None, (s.strip() for s in job.headers.get(self.key_end, "").split(";"))):
                if ended not in step.ended:
                    step.ended.append(ended)
            if self.continuous and stream_next[idx] == "true":
                still.append(job)
            else:
                job.state = "done"
                step.left.append(job.request_id)
        cancelling = {j.sequence_id for j in jobs if j.cancels}
        for job in jobs:
            if job.sequence_id in cancelling and not job.cancels and job.state == "done":
                job.state = "cancelled"
                step.cancelled.append(job.request_id)
        self._running = still
        for sequence_id in step.ended:
            sequence = self.sequences.pop(sequence_id, None)
            if sequence is not None:
                sequence.finished = True
                for job in sequence.queue:
                    job.state = "dropped"
                sequence.queue.clear()

    def _fail(self, step: Step, jobs: list[Job], exc: BaseException) -> None:
        step.error = exc
        for job in jobs:
            job.state = "failed"
            step.left.append(job.request_id)
        self._running = []

    def __repr__(self) -> str:
        mode = "continuous" if self.continuous else "sequence"
        return (
            f"<Sequences ({mode} batching, batchSize {self.batch_size}): {len(self.sequences)} open, "
            f"{len(self._running)} running, {len(self.steps)} steps>"
        )


def _copied(value: Any) -> Any:
    """``value`` with its dicts and lists copied (other objects, such as closures, shared)."""
    if isinstance(value, Mapping):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copied(v) for v in value]
    return value
