"""Running the requests of a failed batch one at a time, to find the one at fault.

A batch of several fails in a stage, and TorchServe answers each of its requests with the one
error. Run alone, through the same code, a request that fails where another passes is the one
at fault (what it sent); when each passes alone, it is their combination. The requests are run
through the handler's stages from ``preprocess`` up to the one that failed, when that stage got
its input from them that way (TorchServe's ``BaseHandler.handle``), or through the handler's
own ``handle`` whole (a function handler, an override): a batch of one, as a worker with
``batchSize: 1`` runs it.

Running a handler again must leave it as the failure left it, and reach no client:

- the handler's attributes are put back (those a stage set or replaced, and the contents of its
  lists, dicts and sets; state nested deeper that a stage changes in place is not); for a
  function handler, its module's names and the handler objects it keeps there;
- the context is bound back to the whole batch, the metrics recorded meanwhile are dropped, and
  what a streaming handler sends goes to a socket of its own, never to the batch's clients;
- warnings are silenced; nothing is recorded (the harness's recorder is not running);
- a model left in training mode is not run again (its batch-norm statistics would move), nor
  is an async stage (a coroutine is closed, not awaited).

Requests run until one that fails and one that passes are known, so a batch of 64 whose first
request is at fault costs two runs, not 64; and when the first few each fail (the code fails
them all), no more are tried.
"""

from __future__ import annotations

import inspect
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from handlerkit.recording.spy import takes_context
from handlerkit.worker.streaming import ChunkSocket

__all__ = ["Alone", "run_alone"]


@dataclass(frozen=True)
class Alone:
    """What running the requests alone found.

    Attributes:
        failing: the first request that fails alone, or None.
        passing: a request that passes alone, or None.
        tried: how many requests were run alone (0: none was).
        why_not: why none was (a sentence for the message), when that is worth saying.
    """

    failing: int | None = None
    passing: int | None = None
    tried: int = 0
    why_not: str | None = None

    @property
    def ran(self) -> bool:
        return self.tried > 0

    @property
    def one_at_fault(self) -> bool:
        """One request fails alone where another passes: what it sent is at fault."""
        return self.failing is not None and self.passing is not None

    @property
    def all_fail(self) -> bool:
        """Each request tried fails alone (and none passes): the code fails them, not one input."""
        return self.failing is not None and self.passing is None


#: How many requests that each fail alone, with none passing, show that the code fails them all.
ENOUGH_FAILING = 3


def run_alone(
    batch: Any,
    context: Any,
    imports: Callable[[], Any],
    handler: Any,
    *,
    stages: Sequence[Callable[..., Any]] = (),
    handle: Callable[[Any, Any], Any] | None = None,
) -> Alone:
    """Run each request of ``batch`` alone through ``stages`` (each given the previous one's
    output, the first the request's data) or through ``handle(data, context)``, until one that
    fails and one that passes are known, or :data:`ENOUGH_FAILING` fail and none passes; the
    context is bound to each request in turn, then back to the whole batch."""
    training = _training_model(handler) if handle is not None or len(stages) > 1 else None  # a model runs
    if training is not None:
        return Alone(
            why_not=f"{training} is in training mode (call .eval() in initialize), so running it again would change it"
        )
    failing = passing = None
    tried = 0
    with _kept(handler, context):
        try:
            for i, single in enumerate(batch.split()):
                tried += 1
                single.bind(context)
                try:
                    with imports(), warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        if handle is not None:
                            _done(handle(single.data, context), "handle")
                        else:
                            value = single.data
                            for stage in stages:
                                value = _done(stage(value, *((context,) if takes_context(stage) else ())), stage)
                except _Async as awaited:
                    return Alone(why_not=f"its {awaited.args[0]} is async (a coroutine), which is not run again here")
                except Exception:
                    failing = i if failing is None else failing
                else:
                    passing = i if passing is None else passing
                if (passing is not None and failing is not None) or (passing is None and tried >= ENOUGH_FAILING):
                    break
        finally:
            batch.bind(context)
    return Alone(failing, passing, tried)


class _Async(Exception):
    """A stage gave a coroutine: the requests cannot be told apart here."""


def _done(value: Any, stage: Any) -> Any:
    if inspect.iscoroutine(value):
        value.close()  # not awaited here: an async stage runs on its worker loop, not in a failure report
        raise _Async(getattr(stage, "__name__", str(stage)))
    return value


def _training_model(handler: Any) -> str | None:
    """``self.<name>`` of a torch module of the handler in training mode with buffers (batch-norm
    statistics, which a forward pass updates), or None."""
    torch = sys.modules.get("torch")
    own = getattr(handler, "__dict__", None)
    if torch is None or not own:
        return None
    for name, value in own.items():
        if isinstance(value, torch.nn.Module) and value.training and next(value.buffers(), None) is not None:
            return f"self.{name}"
    return None


@contextmanager
def _kept(handler: Any, context: Any) -> Iterator[None]:
    """Put back, on leaving, the handler's state (:func:`_states`) and the context's socket and metrics."""
    states = _states(handler)
    socket_kept = hasattr(context, "cl_socket")
    socket = getattr(context, "cl_socket", None)
    records = getattr(getattr(context, "metrics", None), "records", None)
    if not isinstance(records, list):  # a store of another make: nothing to drop from
        records = []
    recorded = len(records)
    if socket_kept:
        context.cl_socket = ChunkSocket()  # what a streaming handler sends alone reaches no client
    try:
        yield
    finally:
        for state in states:
            state.restore()
        if socket_kept:
            context.cl_socket = socket
        del records[recorded:]


_STAGES = ("handle", "preprocess", "inference", "postprocess")


def _states(handler: Any) -> list[_State]:
    """Where a handler keeps its state: an instance's attributes; a function handler's module
    names, and the attributes of the objects there of its module's classes or with a handler's
    methods (TorchServe's examples keep ``_service = MyHandler()`` beside ``handle``)."""
    if not inspect.isfunction(handler):
        own = getattr(handler, "__dict__", None)
        return [_State(own)] if isinstance(own, dict) else []
    names = handler.__globals__
    states = [_State(names)]
    for name, value in names.items():
        kind = type(value)
        if name.startswith("__") or isinstance(value, type) or not isinstance(getattr(value, "__dict__", None), dict):
            continue
        if kind.__module__ == handler.__module__ or any(callable(getattr(kind, stage, None)) for stage in _STAGES):
            states.append(_State(vars(value)))
    return states


class _State:
    """A namespace as it is now (an object's ``__dict__``, a module's names): which value each
    name is bound to, and what the lists, dicts and sets among them hold (a stage that appends
    to ``self.seen`` is undone too). Dunder names are left alone."""

    _CONTAINERS = (list, dict, set, bytearray)

    def __init__(self, own: dict[str, Any]) -> None:
        self.own = own
        self.saved = dict(own)
        self.contents = {
            k: v.copy() for k, v in self.saved.items() if type(v) in self._CONTAINERS and not k.startswith("__")
        }

    def restore(self) -> None:
        own = self.own
        for name in [name for name in own if name not in self.saved and not name.startswith("__")]:
            del own[name]
        own.update(self.saved)
        for name, content in self.contents.items():
            value = self.saved[name]
            if isinstance(value, (list, bytearray)):
                value[:] = content
            else:
                value.clear()
                value.update(content)
