"""The worker's contract: the stages, and the rules TorchServe 0.12 applies to ``handle``'s return.

TorchServe 0.12 (``ts/service.py``, ``ts/protocol/otf_message_handler.py``) answers 503
"Invalid model predict output" when ``handle`` returns anything but a list, 503 "number of
batch response mismatched" when the list's length differs from the batch, and 503
"Unsupported model output data type." when an item is neither ``str``/``bytes`` nor
JSON-serialisable (``torch.Tensor`` items are sent as ``torch.save`` bytes). NaN is written
as ``NaN``, which strict JSON clients reject. :func:`check_output` says so, per request, as
:class:`Problem` data with its fix, before TorchServe turns the mistake into "worker died".
Each request's status (``context.set_response_status``) goes out as its HTTP status line, so
it must be an HTTP code: :func:`check_statuses`. A streaming handler's chunks obey the
frontend's rules (``BatchAggregator.sendResponse``): :func:`check_chunks`. The worker binds no request before
``initialize``, so a request-header read there fails the model load: :func:`header_reads_in_initialize`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from handlerkit.summaries import describe

__all__ = [
    "HANDLER_STAGES",
    "STAGES",
    "HeaderReads",
    "Problem",
    "check_chunks",
    "check_output",
    "check_statuses",
    "header_reads_in_initialize",
    "response_statuses",
    "skipped_stages",
]

#: The stage methods of TorchServe's BaseHandler that ``handle`` runs, in order.
HANDLER_STAGES = ("preprocess", "inference", "postprocess")
#: Every step of a handler's life the harness can run: ``initialize`` once, then the stages.
STAGES = ("initialize", *HANDLER_STAGES)


@dataclass
class Problem:
    """One broken rule: where, what, and how to fix it."""

    check: str
    message: str
    fix: str = ""
    stage: str | None = None
    request_index: int | None = None
    severity: str = "error"  # "error": TorchServe fails or clients break; "warning": surprising

    def __str__(self) -> str:
        where = f"{self.stage}: " if self.stage else ""
        req = f"request {self.request_index}: " if self.request_index is not None else ""
        fix = f"; fix: {self.fix}" if self.fix else ""
        return f"{where}{req}{self.message}{fix}"


def check_output(output: Any, batch_size: int | None, stage: str = "handle") -> list[Problem]:
    """The rules ``Service.predict`` and ``create_predict_response`` apply to ``handle``'s return."""
    problems: list[Problem] = []
    if not isinstance(output, list):
        problems.append(
            Problem(
                "output-type",
                f"must return a list with one item per request, got {describe(output)} "
                "(TorchServe answers 503 'Invalid model predict output')",
                _one_per_request(output),
                stage,
            )
        )
        return problems
    if batch_size is not None and len(output) != batch_size:
        problems.append(
            Problem(
                "output-count",
                f"must return one item per request: got {len(output)} item(s) for a batch of {batch_size} "
                "(TorchServe answers 503 'number of batch response mismatched')",
                "build the output list from the batch, one entry for every request in data",
                stage,
            )
        )
    for index, item in enumerate(output):
        if type(item) is dict and _json_trouble(item) is None:
            continue  # the usual item (a label → score dict) needs no more questions
        problems.extend(_check_item(item, index, stage))
    return problems


def _one_per_request(output: Any) -> str:
    """The fix for an output that is no list, in terms of what it is."""
    if isinstance(output, (str, bytes, bytearray)):
        kind = "str" if isinstance(output, str) else "bytes"
        return f"return a list with one {kind} per request (the answers themselves, not one {kind} joined from them)"
    if isinstance(output, tuple):
        return "return a list, not a tuple: list(output), one item per request"
    return "return one item per request, e.g. output.tolist() for a tensor or [result] for a single dict"


_JSON_LEAVES = frozenset({str, int, bool, type(None)})


def _json_trouble(value: Any, depth: int = 0) -> str | None:
    """Why ``json.dumps(value, allow_nan=False)`` would fail ("nan" / "type"), or None.

    A walk over the usual output shapes; far cheaper than encoding, which matters because the
    harness checks every postprocess output. Anything unusual is left to ``json.dumps``.
    """
    if value is None or isinstance(value, (str, bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else "nan"
    if depth > 50:
        return "type"  # json.dumps would recurse too deep as well
    if isinstance(value, dict):
        for key in value:
            if not (key is None or isinstance(key, (str, int, float, bool))):
                return "type"
        items: Any = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        items = None
    if items is not None:
        for item in items:
            kind = type(item)  # leaves (a label's score...) without a call
            if kind is float:
                if not math.isfinite(item):
                    return "nan"
            elif kind not in _JSON_LEAVES:
                trouble = _json_trouble(item, depth + 1)
                if trouble:
                    return trouble
        return None
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return "nan"
    except (TypeError, RecursionError):
        return "type"
    return None


def _check_item(item: Any, index: int, stage: str) -> list[Problem]:
    if isinstance(item, (str, bytes, bytearray)):
        return []
    if type(item).__module__.startswith("torch") and type(item).__name__ == "Tensor":
        return [
            Problem(
                "item-type",
                "the item is a Tensor, which TorchServe sends as torch.save bytes that an HTTP client cannot read as JSON",
                "convert it with .tolist() (or .item() for a scalar)",
                stage,
                index,
                severity="warning",
            )
        ]
    trouble = _json_trouble(item)
    if trouble == "nan":
        return [
            Problem(
                "item-nan",
                "the item contains NaN or Infinity, which TorchServe writes as NaN/Infinity: not valid JSON",
                "look for a division by zero or an empty softmax upstream; replace non-finite values before returning",
                stage,
                index,
            )
        ]
    if trouble == "type":
        try:
            json.dumps(item)
            detail = "a value or key json cannot encode"
        except (TypeError, ValueError, RecursionError) as exc:
            detail = str(exc)
        return [
            Problem(
                "item-serialisable",
                f"the item is not JSON-serialisable ({detail}); TorchServe answers 503 'Unsupported model output data type.' "
                "for the whole batch",
                "return lists, dicts with str keys, numbers and strings (tensor.tolist(), float(x))",
                stage,
                index,
            )
        ]
    return []


def response_statuses(context: Any, count: int) -> list[tuple[Any, Any]]:
    """Each request's ``(code, phrase)`` as the handler left them (``context.get_response_status``)."""
    return [context.get_response_status(index) for index in range(count)]


def check_statuses(statuses: Sequence[tuple[Any, Any]], stage: str = "handle") -> list[Problem]:
    """A problem for each request whose status code is not an HTTP status code (an int in 100..599)."""
    problems = []
    for index, (code, _phrase) in enumerate(statuses):
        if isinstance(code, bool) or not isinstance(code, int) or not 100 <= code <= 599:
            problems.append(
                Problem(
                    "status",
                    f"response status {code!r} is not an HTTP status code",
                    "use context.set_response_status(code, phrase, idx) with 100..599",
                    stage,
                    index,
                )
            )
    return problems


class HeaderReads:
    """The request-header reads made inside a ``with`` block around ``initialize``, and the
    problem they are (:func:`header_reads_in_initialize`).

    A MockContext notes them (``context.noting_header_reads()``) and answers them as for a
    request without headers; any other context notes nothing (TorchServe's raises on them)."""

    def __init__(self, context: Any) -> None:
        noting = getattr(context, "noting_header_reads", None)
        self._block: AbstractContextManager[list[str]] = noting() if noting is not None else nullcontext([])
        self.reads: list[str] = []

    def __enter__(self) -> HeaderReads:
        self.reads = self._block.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._block.__exit__(*exc_info)

    def add_to(self, result: Any) -> list[Problem]:
        """The problems so far, added to ``result.problems`` (a StageResult); none for None."""
        problems = header_reads_in_initialize(self.reads) if result is not None else []
        if problems:
            result.problems.extend(problems)
        return problems


def header_reads_in_initialize(reads: Sequence[str]) -> list[Problem]:
    """A problem when ``initialize`` read request headers (``reads``: the calls, as
    ``MockContext.noting_header_reads`` notes them).

    TorchServe's model loader calls ``initialize`` before the worker binds any request: its
    Context's ``request_processor`` is None, so ``get_request_header`` raises TypeError and the
    model fails to load. A MockContext answers as for a request without headers instead, as
    TorchServe's test MockContext does, which hides the mistake unless it is reported."""
    if not reads:
        return []
    calls = ", ".join(f"context.{read}" for read in reads)
    return [
        Problem(
            "header-in-initialize",
            f"read request headers ({calls}), but TorchServe binds no request before initialize "
            "(context.request_processor is None): there the read raises TypeError and the model "
            "fails to load; handlerkit's MockContext answered as for a request without headers",
            "read request headers per request in preprocess or handle (context.get_request_header(idx, key)); "
            "take what initialize needs from context.model_yaml_config, context.manifest or context.system_properties",
            "initialize",
        )
    ]


def skipped_stages(handler: Any) -> list[Problem]:
    """A handler whose ``handle`` ran none of its stage methods: edits to them do nothing.

    Only a handler that has such methods is flagged (a plain class with ``handle`` alone has
    nothing to skip)."""
    if not any(callable(getattr(handler, name, None)) for name in HANDLER_STAGES):
        return []
    name = type(handler).__name__
    return [
        Problem(
            "skipped-stages",
            f"{name}.handle() never called preprocess, inference or postprocess: edits to those "
            "methods have no effect, here or under TorchServe",
            "call them from handle(), or drop the handle override and let BaseHandler.handle run them",
            "handle",
            severity="warning",
        )
    ]


#: The output problems after which the worker answers the whole batch 503 instead of the final answers.
_BATCH_FAILS = frozenset({"output-type", "output-count", "item-serialisable"})
#: ``create_predict_response``'s message when a chunk's payload has no encoding.
_UNENCODABLE = "Unsupported model output data type."


def check_chunks(
    chunks: Sequence[Any],
    malformed: Sequence[tuple[int, str]],
    request_ids: Mapping[int, str],
    output_problems: Sequence[Problem],
    stage: str = "handle",
) -> list[Problem]:
    """The frontend's rules for what a streaming handler sent before ``handle`` returned.

    ``chunks`` are :class:`~handlerkit.worker.streaming.Chunk` s (request id, batch index, frame code and
    message), ``malformed`` the sends that were no frame (position, why), ``request_ids`` the
    batch's, ``output_problems`` what :func:`check_output` found in the final answer.

    TorchServe 0.12's ``BatchAggregator.sendResponse`` fails the worker on a 200 frame naming a
    request id it is not serving ("Unexpected job in sendResponse() with 200 status code"),
    answers every request of the batch with the error of a non-200 frame and forgets them (the
    final answer then goes nowhere), and a stream ends only with the final answer.
    """
    problems = [
        Problem(
            "chunk-frame",
            f"send {position} to context.cl_socket is not a predict-response frame ({why}): "
            "TorchServe's frontend cannot read it and the worker's connection fails",
            "send chunks with send_intermediate_predict_response(ret, context.request_ids, message, 200, "
            "context), from handlerkit (or TorchServe's ts.handler_utils.utils)",
            stage,
        )
        for position, why in malformed
    ]
    known = ", ".join(repr(rid) for rid in request_ids.values()) or "none"
    foreign: dict[str, None] = {}
    failed_frames: dict[int, Any] = {}
    for chunk in chunks:
        if chunk.frame_code != 200:
            failed_frames.setdefault(chunk.frame, chunk)
        elif chunk.index is None:
            foreign.setdefault(chunk.request_id)
    for request_id in foreign:
        problems.append(
            Problem(
                "chunk-request",
                f"sent a chunk for request id {request_id!r}, which is not in the batch (its ids: {known}): "
                "TorchServe's frontend throws 'Unexpected job in sendResponse() with 200 status code' "
                "and the batch's clients get an error instead of their streams",
                "pass the batch's own ids: send_intermediate_predict_response(ret, context.request_ids, ...), "
                "ret holding one item per request, by index",
                stage,
            )
        )
    for chunk in failed_frames.values():
        if chunk.frame_message == _UNENCODABLE:
            problems.append(
                Problem(
                    "chunk-type",
                    f"a chunk's payload is of a type the worker cannot encode: send_intermediate_predict_response "
                    f"sent 503 {_UNENCODABLE!r} instead, and the frontend ends every request of the batch "
                    "with that error (the final answer goes nowhere)",
                    "send str, bytes or JSON-serialisable values (lists, dicts with str keys, numbers: tensor.tolist())",
                    stage,
                    chunk.index,
                )
            )
        else:
            problems.append(
                Problem(
                    "chunk-status",
                    f"sent a chunk frame with code {chunk.frame_code} ({chunk.frame_message!r}): TorchServe's "
                    "frontend answers every request of the batch with that error and ends their streams "
                    "(the final answer goes nowhere)",
                    "send chunks with code 200; to fail one request, set its status in the final answer "
                    "(context.set_response_status(code, phrase, idx)); to fail the batch, raise PredictionException",
                    stage,
                    chunk.index,
                )
            )
    fatal = [p for p in output_problems if p.severity == "error" and p.check in _BATCH_FAILS]
    if fatal and not failed_frames:
        counts: dict[int, int] = {}
        for chunk in chunks:
            if chunk.index is not None and chunk.frame_code == 200:
                counts[chunk.index] = counts.get(chunk.index, 0) + 1
        for index in sorted(counts):
            problems.append(
                Problem(
                    "stream-unfinished",
                    f"got {counts[index]} chunk(s) but no final answer ({fatal[0].check}: the worker answers "
                    "the batch 503): its client sees the chunks, then an error instead of the stream's end",
                    "return a list from handle with one encodable item per request: the stream ends with it",
                    stage,
                    index,
                )
            )
    return problems
