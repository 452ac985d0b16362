"""A bad request answered alone: :class:`PerRequestErrors`, and the pieces it is made of.

TorchServe's worker answers each request of a batch with the status the handler set for it
(``context.set_response_status(code, phrase, idx)``: ``create_predict_response`` in
``ts/protocol/otf_message_handler.py`` sends one code per request) and with the handler's item
at its index. So one request can be refused while the others are answered; an exception, a
:class:`~handlerkit.errors.RequestError` included, fails every request of the batch instead.

* the request's :class:`~handlerkit.errors.RequestError` (made with :func:`request_error`) is
  recorded by its index and its status is set (:func:`fail`, :func:`set_status`), before the
  request reaches the model;
* its answer is the error item ``{"code": 400, "error": what is wrong, "fix": what to send}``
  (:func:`error_item`), put back at its index among the answers of the others (:func:`put_back`).

:class:`PerRequestErrors` does all of it for a handler: handlerkit's ``BaseHandler`` (so every
built-in) has it, and a handler on TorchServe's own ``BaseHandler`` mixes it in.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Collection, Mapping, MutableMapping, Sequence
from http import HTTPStatus
from typing import Any

from handlerkit.errors import RequestError

__all__ = [
    "STATUS_PHRASES",
    "PerRequestErrors",
    "error_item",
    "fail",
    "payload_kind",
    "put_back",
    "request_error",
    "set_status",
]

#: The reason phrase of the status codes the built-ins give (other codes: the standard phrase).
STATUS_PHRASES = {400: "Bad Request", 413: "Payload Too Large"}

_JSON_KINDS = {
    dict: "a JSON object",
    list: "a JSON array",
    bool: "a JSON boolean",
    int: "a JSON number",
    float: "a JSON number",
}


def request_error(index: int, what: str, fix: str | None, code: int = 400) -> RequestError:
    """The error of request ``index``: ``"request 3: <what>"``, its status code and its fix;
    ``what`` is kept as its :attr:`~handlerkit.errors.RequestError.detail` (the answer to that request)."""
    return RequestError(f"request {index}: {what}", index, code, fix=fix, detail=what)


def payload_kind(payload: Any) -> str:
    """What a request's payload is, in a client's words: ``"a JSON object"``, ``"a bytes"``..."""
    return _JSON_KINDS.get(type(payload), f"a {type(payload).__name__}")


def status_phrase(code: int) -> str:
    """The reason phrase sent with ``code``: the built-ins' (:data:`STATUS_PHRASES`), else the
    standard one (``422`` → ``"Unprocessable Entity"``)."""
    if code in STATUS_PHRASES:
        return STATUS_PHRASES[code]
    try:
        return HTTPStatus(code).phrase
    except ValueError:  # a code HTTP names no phrase for
        return "Bad Request" if code < 500 else "Internal Server Error"


def set_status(context: Any, index: int, error: RequestError) -> None:
    """Set request ``index``'s status to the error's code and phrase, when ``context`` has
    ``set_response_status`` (TorchServe's has)."""
    if context is not None and hasattr(context, "set_response_status"):
        context.set_response_status(error.error_code, status_phrase(error.error_code), index)


def fail(errors: MutableMapping[int, RequestError], index: int, error: RequestError, context: Any) -> None:
    """Record request ``index``'s error in ``errors`` and set its status (:func:`set_status`)."""
    errors[index] = error
    set_status(context, index, error)


def error_item(error: RequestError) -> dict[str, Any]:
    """A failed request's answer: ``{"code": 400, "error": what is wrong, "fix": what to send}``
    (what is wrong without naming the request: it is the answer to that request alone)."""
    return {"code": error.error_code, "error": error.detail, "fix": error.fix}


def put_back(
    answers: Any, errors: Mapping[int, RequestError], size: int, left_out: Collection[int] | None = None
) -> Any:
    """``answers`` with each failed request's error item at its index, for a batch of ``size``.

    The requests in ``left_out`` (by default every failed one) were left out of the model's
    input: when ``answers`` has one item per other request, in order, their items are put in
    between. A failed request that was not left out (refused after preprocess) has its answer
    replaced by its item. Anything else is returned as it is: a value that is not a list, a list
    of another length, and a list that already answers every request itself (its items for
    the left-out requests are the handler's own). So putting the items back twice changes nothing.
    """
    if not errors or not isinstance(answers, list):
        return answers
    missing = set(errors) if left_out is None else set(left_out) & set(errors)
    if len(answers) == size - len(missing):
        given = iter(answers)
        answers = [error_item(errors[i]) if i in missing else next(given) for i in range(size)]
    elif len(answers) != size:
        return answers
    late = {i: error_item(e) for i, e in errors.items() if i not in missing and 0 <= i < size}
    if all(_same_item(answers[i], item) for i, item in late.items()):
        return answers
    return [late.get(i, answer) for i, answer in enumerate(answers)]


def _same_item(answer: Any, item: dict[str, Any]) -> bool:
    return type(answer) is dict and answer.keys() == item.keys() and answer == item


def request_ids(context: Any) -> dict[Any, Any] | None:
    """The batch's request ids (new for every batch, in TorchServe and in handlerkit), if bound."""
    ids = getattr(context, "request_ids", None)
    return dict(ids) if isinstance(ids, dict) else None


# ---------------------------------------------------------------------------- the mixin
_MARK = "_answers_refusals"  # on the stage methods PerRequestErrors wrapped


class PerRequestErrors:
    """Answer one request of a batch with its own 4xx and message while the others are answered.

    handlerkit's :class:`~handlerkit.handlers.BaseHandler` has it; a handler on TorchServe's own
    base class mixes it in first: ``class MyHandler(hk.PerRequestErrors, BaseHandler)``. In
    ``preprocess``, call :meth:`refuse` for a request that cannot be read and leave it out of
    what preprocess returns::

        def preprocess(self, data):
            images = []
            for index, row in enumerate(data):
                try:
                    images.append(read_image(row.get("data") or row.get("body")))
                except OSError as exc:
                    self.refuse(index, f"not an image ({exc})", fix="send a PNG or JPEG file")
            return torch.stack(images) if images else None

    That request's status is set with ``context.set_response_status(code, phrase, index)``,
    which TorchServe's frontend (and handlerkit's Ray and KServe engines) send to that client
    only, and its answer is ``{"code": 400, "error": message, "fix": fix}``, put back at its
    index among what ``postprocess`` answers for the other requests: every subclass's
    ``postprocess`` and ``explain_handle`` are wrapped to do it, so they answer only the requests
    that reached the model (one item per row, as TorchServe's do). A postprocess that answers
    every request itself is left alone. A request refused after preprocess (in ``inference`` or
    ``postprocess``) was in the model's input: its answer is replaced by its error item.

    When preprocess refused every request of a batch, ``inference``, ``postprocess`` and
    ``explain_handle`` do not run (the model never sees an empty batch): the batch is answered
    with the error items. So preprocess may return anything then (``None``).

    Raising :class:`~handlerkit.errors.RequestError` instead keeps TorchServe's meaning: the
    whole batch fails, and every client in it gets that status and message.

    The refusals belong to the batch being handled: the outermost call of ``preprocess`` begins
    a new one, and refusals recorded for other request ids (a batch whose preprocess did not
    run through the wrapper) are dropped. One batch at a time per handler instance, as
    TorchServe's worker runs them (stages run on sub-batches in threads, as TorchServe's
    ``MicroBatching`` does, would mix their indices). Stage methods that are coroutines
    (``async def``) are not wrapped: put the error items back there with :func:`put_back`.
    """

    # The current batch's state, set on first use (a subclass's __init__ need not call ours).
    _refused: dict[int, RequestError]
    _refused_size: int | None
    _refused_ids: dict[Any, Any] | None
    _left_out: frozenset[int] | None
    _in_preprocess: bool

    def refuse(
        self, index: int, message: str | RequestError, *, fix: str | None = None, code: int = 400
    ) -> RequestError:
        """Answer request ``index`` of the current batch with ``code`` and ``{"code", "error":
        message, "fix": fix}``; the other requests are answered as usual.

        Args:
            index: the request's position in the batch (``data[index]``).
            message: what is wrong with what the client sent; or a :class:`RequestError` made
                already (its code and fix are used).
            fix: what the client should send instead.
            code: the status the client gets: 400 unless another 4xx (413 for too large) fits.

        Returns:
            The :class:`RequestError` recorded (``self.refused[index]``).

        Raises:
            TypeError: an index that is not an int.
            ValueError: an index outside the batch, or a code that is not a 4xx or 5xx status.
        """
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"refuse(index, ...): index must be the request's position (an int), got {index!r}")
        if isinstance(code, bool) or not isinstance(code, int) or not 400 <= code <= 599:
            raise ValueError(f"refuse(..., code={code!r}): a refused request's status is a 4xx (or 5xx) code")
        errors = self._refusals()
        size = getattr(self, "_refused_size", None)
        if index < 0 or (size is not None and index >= size):
            within = f"0..{size - 1}" if size else "none: the batch is empty"
            raise ValueError(f"refuse({index}, ...): no such request in this batch of {size} (indices {within})")
        error = message if isinstance(message, RequestError) else request_error(index, message, fix, code)
        fail(errors, index, error, getattr(self, "context", None))
        return error

    @property
    def refused(self) -> dict[int, RequestError]:
        """The requests of the current batch refused so far: index → :class:`RequestError`."""
        return self._refusals()

    def accepted(self, data: Sequence[Any]) -> list[tuple[int, Any]]:
        """``(index, row)`` for each request of ``data`` not refused, in batch order."""
        refused = self._refusals()
        return [(index, row) for index, row in enumerate(data) if index not in refused]

    # -------------------------------------------------------------- the batch's state
    def _begin_refusals(self, data: Any) -> None:
        """A new batch: no refusals yet, ``len(data)`` requests, the context's request ids."""
        self._refused = {}
        self._refused_size = len(data) if isinstance(data, (list, tuple)) else None
        self._refused_ids = request_ids(getattr(self, "context", None))
        self._left_out = None

    def _refusals(self) -> dict[int, RequestError]:
        """The current batch's refusals; those of another batch (other request ids) are dropped."""
        ids = getattr(getattr(self, "context", None), "request_ids", None)  # compared, copied only for a new batch
        if not isinstance(ids, dict):
            ids = None
        if getattr(self, "_refused", None) is None or self._refused_ids != ids:
            self._begin_refusals(list(ids.values()) if ids is not None else None)
        return self._refused

    def _every_request_refused(self) -> bool:
        refused, size = self._refusals(), self._refused_size
        return size is not None and 0 < size <= len(refused)

    def _with_refusals(self, answers: Any) -> Any:
        """``answers`` with the error items of the refused requests at their indices (:func:`put_back`)."""
        errors = self._refusals()
        size = self._refused_size
        if not errors or size is None:
            return answers
        return put_back(answers, errors, size, self._left_out)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Wrap the subclass's ``preprocess`` (the outermost call begins a batch), ``inference``
        (not run when every request was refused), ``postprocess`` and ``explain_handle`` (the
        error items put back): its own, or those it inherits from a class that is not a
        PerRequestErrors (TorchServe's BaseHandler). Putting back is idempotent, so a method
        that passes the call on to its base class answers as the base does. The wrappers keep
        the original as ``__wrapped__``, so error locations lead to the subclass's file."""
        super().__init_subclass__(**kwargs)
        for name, wrap in _WRAPPERS.items():
            method = _raw_attribute(cls, name)
            if inspect.isfunction(method) and not getattr(method, _MARK, False):
                if not inspect.iscoroutinefunction(method):
                    setattr(cls, name, wrap(method))


def _raw_attribute(cls: type, name: str) -> Any:
    """``name`` as the first class of ``cls``'s MRO defines it (a staticmethod stays one)."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return vars(klass)[name]
    return None


def _marked(wrapper: Callable[..., Any]) -> Callable[..., Any]:
    setattr(wrapper, _MARK, True)
    return wrapper


def _beginning_a_batch(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def preprocess(self: PerRequestErrors, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "_in_preprocess", False):  # a subclass's preprocess calling its base's
            return method(self, *args, **kwargs)
        self._begin_refusals(args[0] if args else next(iter(kwargs.values()), None))
        self._in_preprocess = True
        try:
            return method(self, *args, **kwargs)
        finally:
            self._in_preprocess = False
            self._left_out = frozenset(self._refused)  # refused before the model: not in its input

    return _marked(preprocess)


def _skipped_when_all_refused(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def inference(self: PerRequestErrors, *args: Any, **kwargs: Any) -> Any:
        if self._every_request_refused():  # nothing reaches the model; postprocess answers the error items
            return args[0] if args else next(iter(kwargs.values()), None)
        return method(self, *args, **kwargs)

    return _marked(inference)


def _putting_back(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def answers(self: PerRequestErrors, *args: Any, **kwargs: Any) -> Any:
        if self._every_request_refused():
            return self._with_refusals([])
        return self._with_refusals(method(self, *args, **kwargs))

    return _marked(answers)


_WRAPPERS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "preprocess": _beginning_a_batch,
    "inference": _skipped_when_all_refused,
    "postprocess": _putting_back,
    "explain_handle": _putting_back,
}
