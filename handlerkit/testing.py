"""Assertions for a handler's own test suite (pytest or any runner that reports AssertionError).

Each assertion runs the handler through a :class:`~handlerkit.harness.Harness` and, when it
fails, raises an ``AssertionError`` whose message lists every problem with its stage, the
request at fault (its index in the batch, and the file it came from when the test built it with
the ``hk_request`` fixture) and the fix. They set ``__tracebackhide__`` so pytest points at the
test's line, not at handlerkit::

    from handlerkit.testing import assert_batch_parity, assert_contract, assert_matches_golden

    def test_classifier(hk_harness, hk_request):
        h = hk_harness()
        batch = hk_request.batch("images/circle.png", "images/star.jpg")
        assert_contract(h, batch)            # one run: what TorchServe's worker would refuse
        assert_batch_parity(h, batch)        # each request alone answers as in the batch
        assert_matches_golden(h.run(batch), hk_request.path("golden/shapes.json"))

Golden files are JSON; ``pytest --hk-regen`` (the plugin in :mod:`handlerkit.pytest_plugin`)
writes them instead of comparing, and the run's summary lists what it wrote.

Importing this module does not import torch.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

from handlerkit._compare import Difference, differences, shown
from handlerkit._stack import user_stacklevel
from handlerkit.errors import HandlerkitWarning, StageError
from handlerkit.summaries import describe
from handlerkit.worker.batches import Batch
from handlerkit.worker.contract import Problem, check_statuses, response_statuses
from handlerkit.worker.locations import shown_at

__all__ = ["RequestFiles", "assert_batch_parity", "assert_contract", "assert_matches_golden", "label_request"]

#: Set by ``pytest --hk-regen`` (the plugin); read when ``assert_matches_golden(regen=None)``.
_regen = False
#: Golden files written while ``_regen`` was on, for the plugin's end-of-run summary.
written: list[Path] = []
#: request id → where the request came from (a file name), for failure messages.
_origins: dict[str, str] = {}

_MAX_DIFFERENCES = 10


def label_request(request: Any, label: str) -> Any:
    """Remember where ``request`` came from (``"circle.png"``) so that failures name it; returns it."""
    request_id = getattr(request, "request_id", None)
    if request_id is not None:
        _origins[request_id] = label
    return request


def _request_name(batch: Batch | None, index: int | None) -> str:
    if index is None:
        return "the whole batch"
    if batch is None or not 0 <= index < len(batch):
        return f"request {index}"
    request = batch[index]
    origin = _origins.get(request.request_id)
    return f"request {index} ({origin})" if origin else f"request {index} {request!r}"


def _problem_lines(number: int, problem: Problem, batch: Batch | None) -> list[str]:
    where = f"{problem.stage or 'handle'}, {_request_name(batch, problem.request_index)}"
    lines = [f"  {number}. {where}: {problem.message}"]
    if problem.fix:
        lines.append(f"     fix: {problem.fix}")
    return lines


def _stage_failure(error: StageError, batch: Batch) -> list[str]:
    """The lines for a stage that raised: stage, request, what was raised, where, the fix."""
    original = error.original
    if original is None:
        what = error.message.splitlines()[0]
    else:
        reason = getattr(original, "reason", None) or getattr(original, "message", None) or str(original)
        what = f"{type(original).__name__}: {str(reason).splitlines()[0] if str(reason) else ''}"
    where = "before any request" if error.stage == "initialize" else _request_name(batch, error.request_index)
    lines = [f"  1. {error.stage}, {where}: {what}"]
    lines.extend(f"     at {shown_at(at)}: {at[2]}" for at in error.locations)  # one per user file, innermost last
    if error.fix:
        lines.append(f"     fix: {error.fix}")
    return lines


def _failure(title: str, body: list[str]) -> AssertionError:
    return AssertionError("\n".join([title, *body]))


def assert_contract(h: Any, batch: Any, *, strict: bool = False) -> Any:
    """Run ``batch`` through ``h`` once, as TorchServe's worker would, and fail on what it refuses.

    Fails when a stage raises (the stage, the request, the line and the fix), when ``handle``
    does not return a list with one JSON-encodable, str or bytes item per request (TorchServe
    answers 503), or when a response status is no HTTP code. Warning-level findings (a tensor
    item, a ``handle`` that skips the stage methods) fail only with ``strict=True``; otherwise
    they are issued as :class:`~handlerkit.errors.HandlerkitWarning`. Batch parity is
    :func:`assert_batch_parity`'s (it takes several more runs).

    Returns the :class:`~handlerkit.recording.results.Run`, for further assertions.
    """
    __tracebackhide__ = True
    batch = Batch.coerce(batch)
    with warnings.catch_warnings():
        # The run's contract warnings ("handlerkit: <stage>: ...", one per Problem) become the
        # listed problems below, or are issued again from here; any other warning passes.
        warnings.filterwarnings("ignore", message=r"handlerkit: \w+: ", category=HandlerkitWarning)
        try:
            run = h.run(batch)
        except StageError as error:
            raise _failure(
                f"{h.name} failed on a batch of {len(batch)} request(s):", _stage_failure(error, batch)
            ) from None
    problems = list(run.problems) + check_statuses(response_statuses(h.context, len(batch)))
    failing = [p for p in problems if strict or p.severity == "error"]
    if failing:
        body = [line for i, p in enumerate(failing, 1) for line in _problem_lines(i, p, batch)]
        raise _failure(
            f"{h.name} broke TorchServe's contract on a batch of {len(batch)} request(s): {len(failing)} problem(s)",
            body,
        )
    for problem in problems:
        warnings.warn(f"handlerkit: {problem}", HandlerkitWarning, stacklevel=user_stacklevel())
    return run


def assert_batch_parity(h: Any, batch: Any, *, atol: float = 1e-4, rtol: float = 1e-4) -> Any:
    """Each request alone must answer what it answers inside ``batch`` (within ``atol``/``rtol``).

    Runs :meth:`Harness.check <handlerkit.harness.Harness.check>` and keeps its batch-parity
    verdicts. A handler whose outputs change between two identical runs (state kept across
    calls, random numbers drawn per batch) cannot be judged, and the assertion fails saying so
    rather than pass on nothing. Returns the :class:`~handlerkit.diagnostics.checks.CheckReport`.
    """
    __tracebackhide__ = True
    batch = Batch.coerce(batch)
    if len(batch) < 2:
        raise ValueError(f"batch parity compares requests alone with a batch of several: got {len(batch)} request(s)")
    report = h.check(batch, atol=atol, rtol=rtol, progress=False)
    runs = [p for p in report.problems if p.check == "runs"]
    if runs:
        body = [line for i, p in enumerate(runs, 1) for line in _problem_lines(i, p, batch)]
        raise _failure(f"{h.name} failed on a batch of {len(batch)} request(s), so parity cannot be judged:", body)
    undecided = sorted({verdict for _, verdict in report.parity if verdict.startswith("cannot judge")})
    if undecided:
        raise _failure(f"batch parity of {h.name} cannot be judged:", [f"  {verdict}" for verdict in undecided])
    broken = [p for p in report.problems if p.check == "batch-parity"]
    if broken:
        body = [line for i, p in enumerate(broken, 1) for line in _problem_lines(i, p, batch)]
        raise _failure(
            f"{h.name} answers {len(broken)} request(s) differently alone than in a batch of {len(batch)} "
            f"(atol={atol}, rtol={rtol}):",
            body,
        )
    return report


# ---------------------------------------------------------------------------- golden outputs
def _jsonable(value: Any) -> Any:
    """The output as a client reads it (JSON), tensors and arrays as nested lists."""

    def default(obj: Any) -> Any:
        if hasattr(obj, "tolist"):
            return obj.tolist()
        if isinstance(obj, (bytes, bytearray)):
            raise TypeError(
                f"{type(obj).__name__} item: golden files hold JSON; decode it (e.g. json.loads(item)) first"
            )
        raise TypeError(f"{describe(obj)} is not JSON-encodable")

    return json.loads(json.dumps(value, default=default, allow_nan=False))


def _golden_message(difference: Difference) -> str:
    """One line of a golden-file failure: where the output differs from the golden file, and how."""
    d = difference
    where = f"output{d.path}" if d.path else "the output"
    if d.kind == "number":
        return f"{where}: golden {d.expected!r}, got {d.actual!r} (off by {abs(d.actual - d.expected):.3g})"
    if d.kind in ("missing keys", "new keys"):
        return f"{where}: {d.kind.replace('keys', 'key(s)')} {list(d.keys)}"
    if d.kind == "length":
        return f"{where}: golden has {len(d.expected)} item(s), got {len(d.actual)}"
    return f"{where}: golden {shown(d.expected)}, got {shown(d.actual)}"


def _write_golden(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(partial, path)


def assert_matches_golden(
    run_or_output: Any,
    path: str | os.PathLike[str],
    *,
    atol: float = 1e-4,
    rtol: float = 1e-4,
    regen: bool | None = None,
) -> None:
    """``run_or_output`` (a :class:`~handlerkit.recording.results.Run`, or the output itself) must match the
    JSON golden file at ``path``: same structure, dict keys in any order, numbers within
    ``atol + rtol * |golden|``.

    With ``regen`` (None: whether pytest runs with ``--hk-regen``) the golden file is written
    instead, nothing is compared, and the path joins :data:`written` (the plugin lists them at
    the end of the run). A relative ``path`` is taken from the current directory, as ``open``
    does; ``hk_request.path("golden/x.json")`` makes it relative to the test file instead.
    """
    __tracebackhide__ = True
    output = getattr(run_or_output, "output", run_or_output)
    path = Path(path)
    try:
        actual = _jsonable(output)
    except (TypeError, ValueError) as exc:  # ValueError: NaN or Infinity
        raise _failure(f"the output cannot be stored as a JSON golden file ({path}):", [f"  {exc}"]) from None
    if _regen if regen is None else regen:
        _write_golden(path, actual)
        written.append(path.resolve())
        return
    if not path.is_file():
        raise _failure(
            f"no golden file at {path}:", ["  run pytest with --hk-regen once to write it, review it, and commit it"]
        )
    try:
        golden = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise _failure(
            f"the golden file {path} is not JSON ({exc}):", ["  fix: regenerate it with pytest --hk-regen"]
        ) from None
    found = []
    for difference in differences(golden, actual, atol, rtol):
        found.append(_golden_message(difference))
        if len(found) > _MAX_DIFFERENCES:
            break
    if found:
        shown = [f"  {d}" for d in found[:_MAX_DIFFERENCES]]
        if len(found) > _MAX_DIFFERENCES:
            shown.append("  ... and more")
        shown.append(
            "  fix: correct the handler, or if the change is intended, rerun with --hk-regen and review the diff"
        )
        raise _failure(f"the output differs from the golden file {path} (atol={atol}, rtol={rtol}):", shown)


# ---------------------------------------------------------------------------- requests from files
class RequestFiles:
    """Requests built from files found relative to one directory (the ``hk_request`` fixture's:
    the test file's directory), so a test reads the same from wherever pytest is started.

    ``file`` / ``form`` / ``batch`` resolve relative paths against :attr:`base` (absolute paths
    are kept); ``json`` and ``text`` are :meth:`Request.json <handlerkit.worker.requests.Request.json>`
    and :meth:`Request.text <handlerkit.worker.requests.Request.text>`. Requests made from files are
    named by their path in failure messages of this module's assertions.
    """

    def __init__(self, base: str | os.PathLike[str]) -> None:
        self.base = Path(base)

    def path(self, path: str | os.PathLike[str]) -> Path:
        """``path`` relative to :attr:`base` (an absolute path as it is)."""
        path = Path(path).expanduser()
        return path if path.is_absolute() else self.base / path

    def file(
        self, path: str | os.PathLike[str], content_type: str | None = None, name: str = "body", **kwargs: Any
    ) -> Any:
        """:meth:`Request.from_file <handlerkit.worker.requests.Request.from_file>` of ``self.path(path)``."""
        from handlerkit.worker.requests import Request

        resolved = self.path(path)
        if not resolved.is_file():
            raise FileNotFoundError(
                f"no such file: {resolved}"
                + ("" if Path(path).is_absolute() else f" ({str(path)!r} is taken relative to {self.base})")
            )
        label = str(path) if not Path(path).is_absolute() else resolved.name
        return label_request(Request.from_file(resolved, content_type, name, **kwargs), label)

    def json(self, obj: Any, **kwargs: Any) -> Any:
        from handlerkit.worker.requests import Request

        return Request.json(obj, **kwargs)

    def text(self, s: str, **kwargs: Any) -> Any:
        from handlerkit.worker.requests import Request

        return Request.text(s, **kwargs)

    def form(self, fields: dict[str, Any], **kwargs: Any) -> Any:
        """:meth:`Request.form <handlerkit.worker.requests.Request.form>`; ``Path`` values (alone or first
        in a ``(path, content_type)`` pair) are resolved against :attr:`base`."""
        from handlerkit.worker.requests import Request

        def resolve(value: Any) -> Any:
            if isinstance(value, os.PathLike):
                return self.path(value)
            if isinstance(value, tuple) and value and isinstance(value[0], os.PathLike):
                return (self.path(value[0]), *value[1:])
            return value

        return Request.form({key: resolve(value) for key, value in fields.items()}, **kwargs)

    def batch(self, *items: Any, decode: bool | None = None) -> Batch:
        """A batch of ``items``: a ``str`` or path is a file (:meth:`file`), anything else goes to
        :func:`handlerkit.batch` as it is (Requests, data dicts)."""
        requests = [self.file(item) if isinstance(item, (str, os.PathLike)) else item for item in items]
        return Batch(requests, decode=decode)

    def __repr__(self) -> str:
        return f"RequestFiles(base={str(self.base)!r})"
