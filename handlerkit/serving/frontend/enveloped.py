"""A service envelope around a batch of several requests, each read and answered by its own
envelope, the handler called once (engine-free).

TorchServe's ``kserve`` and ``kservev2`` envelopes read only the first request of a batch (then
the worker fails them all: :mod:`handlerkit.worker.envelopes`), so TorchServe-on-KServe runs with
``batchSize: 1``. A frontend that batches KServe's requests needs each request read alone:
:class:`Enveloped` gives every request of a batch an envelope of its own, joins what they read
(the v1 ``instances``, the v2 ``inputs``) into one list for one ``handle`` call, and hands each
envelope back its share of the results to format, as the ``json`` envelope splits its
predictions. A batch of one goes through the envelope exactly as TorchServe's worker runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from handlerkit.errors import HandlerkitError, RequestError
from handlerkit.worker.envelopes import Envelope, get_envelope

__all__ = ["Enveloped"]

Handle = Callable[[Any, Any], Any]


class _OneRequest:
    """The context as request ``index`` of a batch sees it through its envelope: request 0 is
    that request; what the envelope sets on it (``input_names`` …) stays its own."""

    def __init__(self, context: Any, index: int) -> None:
        self._context, self._index = context, index

    def __getattr__(self, name: str) -> Any:
        if name.startswith("input_"):  # the envelope's own per-request state
            raise AttributeError(name)
        return getattr(self._context, name)

    def get_request_header(self, idx: int, key: str) -> Any:
        return self._context.get_request_header(self._index + idx, key)

    def get_request_id(self, idx: int = 0) -> Any:
        return self._context.get_request_id(self._index + idx)


class Enveloped:
    """``handle`` wrapped in envelope ``name``, for batches of any size (see the module docs)."""

    def __init__(self, handle: Handle, name: str) -> None:
        self._handle, self._cls = handle, get_envelope(name)
        self._one: Envelope = self._cls(handle)  # one for the model's lifetime, as the worker's

    def __call__(self, data: list[Any], context: Any) -> Any:
        if len(data) <= 1:
            return self._one.handle(data, context)
        envelopes = [self._cls(self._handle) for _ in data]
        shares = []
        for index, (envelope, row) in enumerate(zip(envelopes, data)):
            envelope.context = _OneRequest(context, index)
            try:
                rows = envelope.parse_input([row])
            except RequestError as exc:  # it read the request as request 0: name it in the batch
                raise RequestError(exc.reason.replace("request 0", f"request {index}", 1), index, fix=exc.fix) from exc
            if not isinstance(rows, list):
                raise RequestError(
                    f"request {index}: the {self._cls.name} envelope read a {type(rows).__name__}, not a list, "
                    "so it cannot share a batch",
                    index,
                    fix="send a list (of instances, of inputs), or set batchSize: 1 in model-config.yaml",
                )
            shares.append(rows)
        results = self._handle([row for rows in shares for row in rows], context)
        total = sum(map(len, shares))
        if not isinstance(results, (list, tuple)) or len(results) != total:
            got = f"{len(results)} items" if isinstance(results, (list, tuple)) else f"a {type(results).__name__}"
            raise HandlerkitError(
                f"under the {self._cls.name} envelope, batched, the handler must return one item per row it "
                f"received: got {got} for {total} rows (requests of {', '.join(str(len(s)) for s in shares)})",
                fix="return a list as long as the list the handler received",
            )
        out: list[Any] = []
        cursor = 0
        for envelope, rows in zip(envelopes, shares):
            out.extend(envelope.format_output(list(results[cursor : cursor + len(rows)])))
            cursor += len(rows)
        return out
