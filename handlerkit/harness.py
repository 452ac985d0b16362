"""The Harness: run a handler's stages one at a time and keep everything they produce.

A notebook session with a handler looks like this::

    import handlerkit as hk
    ctx = hk.MockContext.from_model_dir("fixtures/models/image_classifier")
    h = hk.Harness("image_classifier", ctx)
    h.initialize()                      # StageResult: time, memory, logs, decisions
    h.preprocess(hk.batch(hk.Request.from_file("fixtures/images/circle.png")))
    h.inference()                       # takes the preprocess output
    h.postprocess().output              # [{"circle": 0.99, ...}]

Each stage returns a :class:`~handlerkit.recording.results.StageResult` and is kept in
``h.results[stage]``. Re-running a stage drops the results after it; ``h.inference(x)`` runs
from a tensor of your own. An exception inside a stage becomes a
:class:`~handlerkit.errors.StageError` naming the stage, the handler, the request, the line of
the handler that raised, and the fix; the harness stays usable: fix the code, ``h.reload()``,
and run the stage again.

``h.run(batch)`` does what TorchServe's worker does: it calls the handler's ``handle`` —
TorchServe's, an override, or one set on the instance (micro-batching) — and reports a
result for each stage ``handle`` called (:mod:`handlerkit.recording` watches them).
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

from handlerkit._stack import user_stacklevel
from handlerkit.diagnostics.reports import Reports
from handlerkit.errors import HandlerkitError, HandlerkitWarning, StageError
from handlerkit.recording import failures, spy
from handlerkit.recording import reload as reloading
from handlerkit.recording.capture import Capture, ListHandler, enable_info_logs
from handlerkit.recording.recorder import Recorder
from handlerkit.recording.results import Run, StageResult, run_mode
from handlerkit.service import Service, WorkingDir
from handlerkit.worker.batches import Batch
from handlerkit.worker.contract import STAGES, HeaderReads, Problem, check_output, skipped_stages
from handlerkit.worker.devices import needs_sync
from handlerkit.worker.streaming import Chunk, ChunkSocket, collect, streamed
from handlerkit.worker.timer import Timer

__all__ = ["Harness"]

_ORDER = {name: i for i, name in enumerate(STAGES)}


class Harness(Reports):
    """Step through a handler's stages, keep every intermediate, time and check them.

    Args:
        handler: a handler instance, a handler class (built with no arguments), a TorchServe
            spec string (``"image_classifier"``, ``"handler.py"``, ``"handler.py:handle"``)
            resolved by :mod:`handlerkit.worker.loading` in the context's model dir, a module-level
            function ``handle(data, context)``, a :class:`~handlerkit.service.Service`, or None
            for the manifest's handler. :meth:`open` takes a model dir or a ``.mar``.
        context: the context handed to the handler; a :class:`~handlerkit.MockContext` of the
            current directory when omitted.
        track_memory: measure peak memory per stage (costs a little per stage).
        capture_logs: keep the log records emitted in each stage. Like TorchServe's worker,
            this sets the root logger's level to INFO (once) so handlers' ``logger.info``
            records exist; it adds no handler, so nothing more is printed.
        envelope: a TorchServe service envelope (``"json"``, ``"kserve"``, ``"kservev2"``)
            wrapped around ``handle`` as the worker does for a model served with one.
        working_dir: ``"call"`` (the model dir is the working directory during each call, the
            notebook's comes back after it, as TorchServe's worker runs in the model dir) or
            None (leave it alone: a handler's relative paths then look in the notebook's
            directory; saves two ``getcwd`` and two ``fchdir`` per call). See
            :class:`~handlerkit.service.Service`.

    The handler is loaded and run by a :class:`~handlerkit.service.Service` (``h.service``), as
    TorchServe's worker loads and runs it: in the model dir's imports, with the model dir as
    the working directory during each call.

    To see which stages ``handle`` calls, the harness gives the handler a subclass of its class
    (same name, module and layout) whose stage methods pass every call on and, during a run,
    record it; copies and pickles of the handler are of its own class.
    """

    def __init__(
        self,
        handler: Any = None,
        context: Any = None,
        *,
        track_memory: bool = True,
        capture_logs: bool = True,
        envelope: str | None = None,
        working_dir: WorkingDir = "call",
    ):
        if isinstance(handler, Service):
            if context is not None and context is not handler.context:
                raise ValueError("a Service brings its own context: pass Harness(service), without a context")
            if envelope is not None and envelope != handler.envelope_name:
                raise ValueError("a Service brings its own envelope: open it with envelope=..., not the Harness")
            self.service = handler
        else:
            self.service = Service(handler, context, envelope=envelope, build=spy.build_spied, working_dir=working_dir)
        # Spied when built (a class, a spec) or now (an instance, a Service): stage calls reach the recorder.
        self._spied = self.handler is not None and spy.spy_on(self.handler)
        self.track_memory = track_memory
        if capture_logs:
            enable_info_logs()
        self.results: dict[str, StageResult] = {}
        self.batch: Any = None
        #: The last :meth:`run`'s (or :meth:`stream`'s) Run, a failed one too (``.error``); None before.
        self.last_run: Run | None = None
        # What a run or step catches: warnings, logs; the model dir's imports and working
        # directory meanwhile; and, first, a look whether the handler's files changed since
        # loaded (a stat per file; not inside preserved(): a diagnostic's loop looked once before).
        self._capture = Capture(
            self.service.running,
            ListHandler() if capture_logs else None,
            {},
            look=lambda: reloading.warn_if_changed(self.service),
        )
        self._device_sync: tuple[Any, bool] = (None, False)  # the handler's device, and whether timing it syncs
        self._metrics_marks = hasattr(getattr(self.context, "metrics", None), "mark")  # handlerkit's store
        self._handler_files = failures.handler_files(self.function or self.handler)
        failures.refresh_sources(self._handler_files)  # errors show the lines of the code loaded now
        #: What errors call a request, by id (``handlerkit run``: its file); else "request <index>".
        self.request_names: dict[str, str] = {}
        #: What a fix pointing at the raising line says to do next (None: h.reload() and run the stage again).
        self.fix_then: str | None = None

    @classmethod
    def open(
        cls,
        model: str | os.PathLike[str],
        handler: Any = None,
        *,
        track_memory: bool = True,
        capture_logs: bool = True,
        **options: Any,
    ) -> Harness:
        """A harness for a model dir or an archive (``.mar``, ``.tar.gz``): :meth:`Service.open
        <handlerkit.service.Service.open>` with the manifest's handler unless ``handler``.

        ``options`` are ``Service.open``'s (``config``, ``gpu_id``, ``batch_size``,
        ``model_name``, ``envelope`` …). An archive's temporary dir lives until
        ``h.service.close()``.
        """
        service = Service.open(model, handler=handler, build=spy.build_spied, **options)
        return cls(service, track_memory=track_memory, capture_logs=capture_logs)

    # -- what the service holds ----------------------------------------------------------
    @property
    def capture_logs(self) -> bool:
        """Whether runs and steps keep the log records emitted in each stage."""
        return self._capture.log_handler is not None

    @capture_logs.setter
    def capture_logs(self, value: bool) -> None:
        if value:
            enable_info_logs()
        self._capture.log_handler = (self._capture.log_handler or ListHandler()) if value else None

    @property
    def context(self) -> Any:
        return self.service.context

    @property
    def handler(self) -> Any:
        """The handler instance (None for a function handler)."""
        return self.service.handler

    @property
    def function(self) -> Callable[..., Any] | None:
        """The function handler (None for a class handler)."""
        return self.service.function

    @property
    def spec(self) -> str | None:
        return self.service.spec

    @property
    def model_dir(self) -> str | None:
        return self.service.model_dir

    @property
    def envelope(self) -> str | None:
        return self.service.envelope_name

    @property
    def name(self) -> str:
        return self.service.name

    @property
    def is_function(self) -> bool:
        return self.service.is_function

    @property
    def single_stage(self) -> bool:
        """True when ``handle`` is not TorchServe's (a function handler, an override, or one set
        on the instance): then only a run through ``handle`` shows what the server does."""
        return self.service.single_stage

    @property
    def entry(self) -> Callable[[Any, Any], Any]:
        """What TorchServe's worker calls for a batch (taken before initialize, in the envelope)."""
        return self.service.entry

    # -- plumbing ------------------------------------------------------------------------
    def imports(self, max_age: float = 1.0) -> Any:
        """A context manager under which the handler runs as in its worker: the model dir's
        imports and working directory (:meth:`Service.running <handlerkit.service.Service.running>`).
        Re-entering costs almost nothing; the dir's listing is trusted for ``max_age`` seconds,
        so a loop of runs makes no syscall for it."""
        return self.service.running(max_age=max_age)

    @contextlib.contextmanager
    def preserved(self) -> Iterator[None]:
        """Run extra batches (checks, timing) and put the results and the bound batch back after."""
        results, batch, last_run = dict(self.results), self.batch, self.last_run
        reloading.warn_if_changed(self.service)  # once for all the extra batches, which do not look
        capture = self._capture
        looking, capture.looking = capture.looking, False
        try:
            yield
        finally:
            capture.looking = looking
            self.results.clear()
            self.results.update(results)
            self.batch, self.last_run = batch, last_run
            if batch is not None:
                batch.bind(self.context)

    def _invalidate_from(self, stage: str) -> None:
        """Drop the results of ``stage`` and every later one (``handle``, ``explain`` and
        ``describe`` count as later); ``initialize`` is only replaced by initialize itself."""
        start = _ORDER[stage]
        results = self.results
        if len(results) > 1 or "initialize" not in results:
            for name in [n for n in results if n != "initialize" and _ORDER.get(n, len(STAGES)) >= start]:
                del results[name]

    def discard(self, stage: str = "preprocess") -> None:
        """Drop the results of ``stage`` and of every later one (what a new batch does)."""
        if stage not in _ORDER:
            raise ValueError(f"no stage {stage!r}; the stages are {', '.join(STAGES)}")
        self._invalidate_from(stage)

    def _bind(self, batch_or_data: Any) -> Batch:
        """Make ``batch_or_data`` the current batch, as TorchServe's worker does before ``handle``
        (read once, by :meth:`Service.bind <handlerkit.service.Service.bind>`); returns it."""
        self._invalidate_from("preprocess")
        self.batch = batch = self.service.bind(batch_or_data)
        if self.handler is not None:
            try:  # BaseHandler.handle sets it before preprocess; a step needs it set already
                self.handler.context = self.context
            except (AttributeError, TypeError):  # a handler with no such slot sets nothing
                pass
        return batch

    def _recorder(self) -> Recorder:
        metrics = self.context.metrics if self._metrics_marks else None
        handler = self.handler
        device = getattr(handler, "device", None)
        if device is not self._device_sync[0]:  # asked once per device the handler moves to, not per run
            self._device_sync = (device, device is not None and needs_sync(device))
        return Recorder(self._capture, metrics, device, self.track_memory, handler, sync=self._device_sync[1])

    def _step(
        self, stage: str, func: Callable[[Any], Any], value: Any, request_count: int | None, on_batch_data: bool = False
    ) -> StageResult:
        """Run ``func(value)`` as ``stage``: time it, capture logs/warnings/metrics, wrap errors."""
        with self._capture:
            recorder = self._recorder()
            error = None
            try:
                recorder.step(stage, func, value, self.service)  # an async stage: awaited on the service's loop
            except Exception as exc:  # every stage failure becomes a StageError
                error = exc
            result = recorder.build(self.results)[-1]
            if error is not None:
                result.error = self._stage_error(
                    stage, error, request_count, on_batch_data=on_batch_data, stepped=self.results
                )
                raise result.error from error
            return result

    def _stage_error(self, stage: str, exc: BaseException, request_count: int | None, **how: Any) -> StageError:
        """``how``: how the stage got its input, to run the requests alone through it
        (:func:`~handlerkit.recording.failures.batch_error`'s ``on_batch_data``, ``stepped``, ``alone``)."""
        batch = self.batch if request_count is not None else None  # initialize is about no request
        return failures.batch_error(
            stage,
            exc,
            handler=self.handler,
            handler_name=self.name,
            batch=batch,
            context=self.context,
            imports=self.imports,
            handler_files=self._handler_files,
            request_names=self.request_names,
            enveloped=self.envelope is not None,
            then=self.fix_then,
            service=self.service,
            **how,
        )

    def _warn_problems(self, problems: Sequence[Problem]) -> None:
        for problem in problems:
            warnings.warn(f"handlerkit: {problem}", HandlerkitWarning, stacklevel=user_stacklevel())

    # -- the stages ----------------------------------------------------------------------
    def initialize(self) -> StageResult:
        """Run the handler's ``initialize(context)`` (``handle(None, context)`` for functions)."""
        self.results.clear()
        service = self.service
        with service.running("initialize", max_age=0), HeaderReads(self.context) as reads:  # a fresh look at the dir
            try:
                result = self._step("initialize", lambda _: service.initialize(), None, None)
            finally:  # a header read fails TorchServe's model load (no request yet): a problem, warned
                self._warn_problems(reads.add_to(self.results.get("initialize")))
            decisions = getattr(self.handler, "decisions", None)
            if decisions is not None and result.output is None:
                result.output = decisions
        return result

    def preprocess(self, batch_or_data: Any) -> StageResult:
        """Bind the batch to the context and run ``preprocess(data)``.

        ``batch_or_data`` is a :class:`~handlerkit.worker.batches.Batch`, a Request, or any list
        ``handle`` accepts (request dicts, or raw items such as ``[[1.0, 2.0]]``).
        """
        self._need_stage_methods("preprocess")
        batch = self._bind(batch_or_data)
        data = batch.data
        envelope = self.service.envelope
        if envelope is not None:  # what the worker's envelope hands handle()
            data = envelope.parse_input(data)
        return self._step("preprocess", self.handler.preprocess, data, len(batch), on_batch_data=self.envelope is None)

    def inference(self, x: Any = None) -> StageResult:
        """Run ``inference`` on ``x``, or on the last preprocess output."""
        self._need_stage_methods("inference")
        if x is None:
            x = self._last_output("preprocess", "inference")
        self._invalidate_from("inference")
        return self._step("inference", self.handler.inference, x, self._count(), on_batch_data=not self.single_stage)

    def postprocess(self, y: Any = None) -> StageResult:
        """Run ``postprocess`` on ``y``, or on the last inference output, and check the contract.

        Under an envelope the output is what the worker sends back: the handler's items wrapped
        by the envelope (one answer per request, as ``h.run(batch).output``), as ``preprocess``
        got the envelope's unwrapped view of the batch."""
        self._need_stage_methods("postprocess")
        if y is None:
            y = self._last_output("inference", "postprocess")
        self._invalidate_from("postprocess")
        count = self._count()
        stage = self.handler.postprocess
        envelope = self.service.envelope
        if envelope is not None:
            stage = lambda value: _wrapped(envelope, self.handler.postprocess(value))
        result = self._step("postprocess", stage, y, count, on_batch_data=not self.single_stage)
        result.problems = check_output(result.output, count, stage="postprocess")
        self._warn_problems(result.problems)
        return result

    def _count(self) -> int | None:
        return len(self.batch) if self.batch is not None else None

    def _last_output(self, stage: str, wanted_by: str) -> Any:
        result = self.results.get(stage)
        if result is None or not result.ok:
            raise HandlerkitError(
                f"{wanted_by} needs the output of {stage}, which has not run successfully",
                fix=f"run h.{stage}(...) first, or pass the input: h.{wanted_by}(value)",
            )
        if result.calls > 1:
            raise HandlerkitError(
                f"{stage} ran {result.calls} times in the last run (handle split the batch), so "
                f"there is no single output for {wanted_by} to take",
                fix=f"pass the input: h.{wanted_by}(h.results[{stage!r}].output[i])",
            )
        return result.output

    def _need_stage_methods(self, stage: str) -> None:
        if self.is_function or not callable(getattr(self.handler, stage, None)):
            what = "a function handler" if self.is_function else f"a handler without a {stage} method"
            raise HandlerkitError(
                f"{self.name} is {what}: there is no {stage} stage to step through",
                fix="use h.run(batch) (it runs handle, as the worker does) or h.handle(batch)",
            )

    # -- whole batches -------------------------------------------------------------------
    def run(self, batch_or_data: Any) -> Run:
        """One batch through ``handle``, as TorchServe's worker runs it (initialized first if need be).

        The handler's own ``handle`` decides what runs (describe and explain requests go where
        TorchServe's BaseHandler sends them; ``ENABLE_TORCH_PROFILER`` is honoured by it); the run
        keeps a result for every stage it called, and ``Run.output`` is what it returned. When it
        raises, so does ``run``, and ``h.last_run`` is the failed Run (:meth:`Run.failed`)."""
        initialized, self.last_run = self.results.get("initialize"), None  # never the previous run's
        if initializes := initialized is None or initialized.error is not None:  # then it is part of this run
            self.initialize()
        batch = self._bind(batch_or_data)
        count = len(batch)
        handler, context = self.handler, self.context
        with self._capture:
            recorder = self._recorder()
            marks = recorder.mark()
            data, entry, error, output = batch.data, self.entry, None, None
            spied = self._spied
            if spied:
                spy.start(handler, recorder)
            timer = Timer(recorder.device).start() if recorder.sync else None  # accelerators only
            t0 = time.perf_counter_ns()
            socket = ChunkSocket.begin_run(context, t0)  # a streaming handler's chunks, timed from here
            try:
                output = entry(data, context)
            except Exception as exc:
                error = exc
            finally:
                if spied:
                    spy.stop(handler)
            handle_ms = timer.stop(failed=error is not None) if timer else (time.perf_counter_ns() - t0) / 1e6
            built = recorder.build(self.results)
            lap = recorder.failed(error) if error is not None else None
            if not built or (error is not None and lap is None):  # handle ran no stage, or failed outside them
                self.results["handle"] = recorder.whole(data, output, handle_ms, marks)
                built.append(self.results["handle"])
            stages = {"initialize": self.results["initialize"], **{r.stage: r for r in built}}
            if error is not None:
                failed = self.results[stage := lap.stage if lap is not None else "handle"]
                fed = failures.fed_by(self.results, stage, data)  # handle gave the stage its input from data
                failed.error = self._stage_error(stage, error, count, on_batch_data=fed)
                self.last_run = Run.failed(stages, count, handle_ms, failed.error, handler, socket, context)
                self.last_run.initialized = initializes
                raise failed.error from error
            for call in recorder.laps:  # a stage that raised inside handle, which caught it
                if isinstance(call.error, Exception) and self.results[call.stage].error is None:
                    self.results[call.stage].error = self._stage_error(call.stage, call.error, count, alone=False)
        last = built[-1]
        last.problems = check_output(output, count, stage=last.stage)
        if last.stage == "handle" and handler is not None and self._spied:  # else unobservable
            last.problems.extend(skipped_stages(handler))
        sent = collect(socket, context, handle_ms, output, last.problems) if socket and socket.sent else None
        last.problems.extend(sent.problems if sent else ())  # the frontend's rules for chunks
        if last.problems:
            self._warn_problems(last.problems)
        run = Run(output, stages, count, run_mode(stages), handle_ms, source=handler, initialized=initializes)
        if sent is not None:
            run.chunks, run.streams = sent.chunks, sent.streams
        self.last_run = run
        return run

    def stream(self, batch_or_data: Any) -> Generator[Chunk, None, Run]:
        """:meth:`run` in a worker thread, yielding each chunk a streaming handler sends as it
        sends it (:class:`~handlerkit.worker.streaming.Chunk`: request, payload, status, headers, time):
        ``for chunk in h.stream(batch): print(chunk.index, chunk.text)``. It returns the Run (``h.last_run`` too); a failing handler raises its StageError from it
        and the harness stays usable. Breaking out early waits for ``handle`` to finish."""
        reloading.warn_if_changed(self.service)  # here: run() warns from a worker thread
        return streamed(lambda: self.run(batch_or_data), self.context)

    def handle(self, batch_or_data: Any) -> Any:
        """Exactly what the worker does: ``handle(batch.data, context)`` after binding the batch."""
        return self.service.handle(batch_or_data)

    # -- reload ----------------------------------------------------------------------------
    def reload(self) -> None:
        """Execute the handler's file again as it is now (changed or not) and rebind its methods;
        the model dir's other modules load as when it is opened. The loaded model stays unless a
        file besides the handler's changed since it was loaded (``model.py``): then initialize
        runs again. The handler keeps its code when the new one fails; later results are dropped."""
        service = self.service
        service.refresh()
        target = self.function if self.is_function else spy.own_class(self.handler)
        with service.running("reload", max_age=0):  # a fresh look: the model dir's modules as on disk
            replacement, module, rebuild = reloading.reexecuted(target, self.name, service)
        previous = type(self.handler)  # what stage methods taken before (MicroBatching's) run
        service.replace(replacement, module)
        if not self.is_function:
            self._spied = spy.spy_on(self.handler, previous)
        self._handler_files = failures.handler_files(self.function or self.handler)
        self._invalidate_from("preprocess")
        if rebuild and getattr(self.results.get("initialize"), "ok", False):
            self.initialize()  # what it built came from code that changed

    def __repr__(self) -> str:
        done = ", ".join(f"{k}{'' if v.ok else '!'}" for k, v in self.results.items()) or "nothing run yet"
        return f"<Harness {self.name}: {done}>"


def _wrapped(envelope: Any, output: Any) -> Any:
    """What the worker's envelope answers for ``output``: formatted, unless it is empty (then
    it goes back as it is, for the worker to reject), as :meth:`Envelope.handle
    <handlerkit.worker.envelopes.Envelope.handle>` does after calling ``handle``."""
    if output is None or (isinstance(output, (list, tuple, dict, str)) and not output):
        return output
    return envelope.format_output(output)
