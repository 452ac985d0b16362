"""TorchServe's async worker: the event loop an async handler runs on, and what it requires.

TorchServe 0.12's worker with ``asyncCommunication: true`` (``ts/async_service.py``) loads the
model, runs ``initialize`` in its main thread while no loop runs there, then runs the main
thread's event loop for good and awaits ``handle`` on it, one task per batch, many at once. A
handler may rely on both halves: TorchServe's ``vllm_handler.py`` calls
``asyncio.get_event_loop().run_until_complete(...)`` in ``initialize`` and then awaits the engine
it made on that same loop in ``handle``.

:class:`WorkerLoop` gives a handler that loop wherever handlerkit runs it: in a script, under
pytest, in a Ray replica, and in a notebook, whose own event loop is already running in the
caller's thread (``asyncio.run`` refuses to run there). The loop lives in a daemon thread:

- :meth:`WorkerLoop.call` runs a plain function in that thread with the loop set as the
  thread's event loop but not running (the worker's ``initialize``);
- :meth:`WorkerLoop.submit` schedules a coroutine on the running loop and returns a
  :class:`concurrent.futures.Future`: block on ``.result()`` from synchronous code, or await
  ``asyncio.wrap_future(...)`` from another event loop. Coroutines run concurrently, as the
  worker runs batches.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import queue
import threading
import warnings
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from handlerkit._stack import user_stacklevel
from handlerkit.errors import HandlerkitError, HandlerkitWarning

__all__ = ["WorkerLoop", "awaiting", "is_async_config", "refusing_coroutines", "unawaited"]

T = TypeVar("T")
_Job = tuple[Callable[[], Any], "concurrent.futures.Future[Any]"]


class WorkerLoop:
    """An event loop running in its own daemon thread (started on first use).

    Args:
        name: the thread's name (shows in stack dumps and ``threading.enumerate()``).
        setup: called once in the loop's thread before anything else runs there (a Ray
            replica enters the model dir's imports for the life of the loop, as a worker
            process lives in them).
    """

    def __init__(self, name: str = "handlerkit-worker-loop", setup: Callable[[], Any] | None = None) -> None:
        self.name = name
        self._setup = setup
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False

    # -- the thread ------------------------------------------------------------------------
    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop (the thread is started on first use)."""
        return self._start()

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name} is closed")
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                ready: concurrent.futures.Future[None] = concurrent.futures.Future()
                self._thread = threading.Thread(target=self._main, args=(ready,), name=self.name, daemon=True)
                self._thread.start()
                ready.result()  # the setup's error, if any, comes out here
            return self._loop

    def _main(self, ready: concurrent.futures.Future[None]) -> None:
        loop = self._loop
        assert loop is not None  # set before the thread starts
        asyncio.set_event_loop(loop)
        try:
            if self._setup is not None:
                self._setup()
        except BaseException as exc:
            loop.close()
            self._closed = True  # no thread to run anything: later calls are refused
            ready.set_exception(exc)
            return
        ready.set_result(None)
        while True:
            # Plain calls first, with the loop set but not running (the worker's initialize);
            # then the loop runs until the next call or close stops it. Tasks in flight are kept
            # across a stop and carry on when it runs again.
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    self._shut_down(loop)
                    return
                func, future = job
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(func())
                    except BaseException as exc:
                        future.set_exception(exc)
            loop.run_forever()

    @staticmethod
    def _shut_down(loop: asyncio.AbstractEventLoop) -> None:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    @property
    def in_loop_thread(self) -> bool:
        """True when called from the loop's own thread (where blocking on it would deadlock)."""
        return self._thread is not None and threading.get_ident() == self._thread.ident

    # -- work ------------------------------------------------------------------------------
    def call(self, func: Callable[[], T]) -> T:
        """``func()`` in the loop's thread, the loop set as its event loop and not running;
        blocks until it returns, and raises what it raised."""
        if self.in_loop_thread:
            raise RuntimeError(f"{self.name}.call from inside its own loop would wait for itself")
        loop = self._start()
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((func, future))
        loop.call_soon_threadsafe(loop.stop)
        return future.result()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coroutine`` on the loop; its future holds the result or the exception."""
        try:
            loop = self._start()
        except BaseException:
            coroutine.close()  # never to run: no "coroutine was never awaited" warning for it
            raise
        return asyncio.run_coroutine_threadsafe(coroutine, loop)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """:meth:`submit` and wait: usable with or without an event loop running in the caller's
        thread (a notebook's), but not from inside this loop's own thread."""
        if self.in_loop_thread:
            coroutine.close()
            raise RuntimeError(
                f"{self.name}.run from inside its own loop would wait for itself: await the coroutine there"
            )
        return self.submit(coroutine).result()

    def close(self) -> None:
        """Cancel what still runs, close the loop and let its thread end (waits up to 5 s)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self._jobs.put(None)
        loop.call_soon_threadsafe(loop.stop)
        if not self.in_loop_thread:
            thread.join(timeout=5)

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("running" if self._loop is not None else "not started")
        return f"<WorkerLoop {self.name!r} {state}>"


# -- what the worker requires of an async handler ------------------------------------------


def is_async_config(model_yaml_config: Any) -> bool:
    """True when model-config.yaml says ``asyncCommunication: true``: the frontend then starts
    the worker with ``--async_comm`` and it serves through ``ts/async_service.py``."""
    return isinstance(model_yaml_config, dict) and model_yaml_config.get("asyncCommunication") is True


def awaiting(entry: Callable[[Any, Any], Any], name: str) -> Callable[[Any, Any], Coroutine[Any, Any, Any]]:
    """The entry point as the async worker calls it: ``await entry(data, context)``.

    A ``handle`` that returns no awaitable (a synchronous handler under ``asyncCommunication:
    true``) fails there with a TypeError, which the worker answers 503 "Prediction failed"
    for every request; an answer that is itself a coroutine (a stage or helper called without
    ``await``) cannot be encoded, and the worker's task dies with the request unanswered until
    the frontend's ``responseTimeout``. Both raise a :class:`HandlerkitError` with the fix here.
    """

    async def handle(data: Any, context: Any) -> Any:
        result = entry(data, context)
        if not inspect.isawaitable(result):
            raise HandlerkitError(
                f"{name}.handle returned {type(result).__name__}, not an awaitable: with asyncCommunication: true "
                "TorchServe's worker awaits what handle returns (ts/async_service.py), so the server answers "
                "every request 503 'Prediction failed'",
                fix="make it `async def handle(self, data, context)`, or remove asyncCommunication: true from "
                "model-config.yaml to serve it as a synchronous handler",
            )
        output = await result
        _refuse_unawaited_items(output, name)
        return output

    return handle


def _refuse_unawaited_items(output: Any, name: str) -> None:
    if not isinstance(output, list):
        return  # the contract checks say what is wrong with it
    for idx, item in enumerate(output):
        if inspect.iscoroutine(item):
            for other in output:
                if inspect.iscoroutine(other):
                    other.close()  # never to be awaited: no second warning about it
            raise HandlerkitError(
                f"{name}.handle answered request {idx} with a coroutine ({item.__qualname__}) that was never "
                "awaited: TorchServe's worker cannot encode it, and the request is never answered (the client "
                "waits until responseTimeout)",
                fix=f"await it: `await {item.__qualname__}(...)` inside the async handle",
            )


def refusing_coroutines(entry: Callable[[Any, Any], Any], name: str) -> Callable[[Any, Any], Any]:
    """The entry point of an ``async def handle`` under a worker *without*
    ``asyncCommunication: true``: TorchServe's synchronous worker calls it, gets a coroutine
    that is no list, answers 503 "Invalid model predict output" and never awaits it. Raises a
    :class:`HandlerkitError` saying so (the coroutine is closed: it never runs there either)."""

    def handle(data: Any, context: Any) -> Any:
        result = entry(data, context)
        if inspect.iscoroutine(result):
            result.close()
            raise HandlerkitError(
                f"{name}.handle is a coroutine function but the model config does not say asyncCommunication: "
                "true: TorchServe's worker calls it without awaiting it and answers every request 503 "
                "'Invalid model predict output'",
                fix="add `asyncCommunication: true` to model-config.yaml (or to the MockContext's "
                "model_yaml_config), or make handle a plain `def`",
            )
        return result

    return handle


def unawaited(result: Any, what: str, name: str) -> None:
    """Warn about a coroutine the worker's load creates and never awaits: ``initialize`` (or a
    function handler's ``handle(None, context)``) being ``async def``. TorchServe calls it as a
    plain function, in both kinds of worker, so its body never runs in the server: handlerkit
    does not run it either (the coroutine is closed)."""
    if not inspect.iscoroutine(result):
        return
    result.close()
    warnings.warn(
        f"handlerkit: {name}'s {what} is a coroutine function, and TorchServe's worker calls it at load without "
        "awaiting it, so its body never runs in the server (nor here); make it a plain def (run async set-up "
        "with asyncio.get_event_loop().run_until_complete(...), as TorchServe's vllm_handler does), or set up "
        "lazily on the first batch",
        HandlerkitWarning,
        stacklevel=user_stacklevel(),
    )
