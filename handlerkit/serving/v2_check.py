"""Does a server speak the Open Inference Protocol v2? :func:`check` asks it, rule by rule.

The protocol is KServe's "V2" (``kserve/kserve`` ``docs/predict-api/v2/required_api.md``),
which Triton, MLServer and KServe's own model server implement. The check sends the spec's
requests over HTTP (the standard library's ``http.client``; nothing else is needed):

- health: ``GET /v2/health/live`` and ``/v2/health/ready`` answer 200;
- server metadata: ``GET /v2`` answers ``name``, ``version`` and ``extensions``;
- model metadata and readiness: ``GET /v2/models/<name>`` answers ``name``, ``platform``,
  ``inputs`` and ``outputs`` (each tensor with ``name``, a v2 ``datatype`` and a ``shape``;
  ``versions`` is optional), ``GET /v2/models/<name>/ready`` answers 200;
- inference: a request built from the metadata (every input with its name, shape and datatype,
  ``-1`` dimensions filled with 1; a ``BYTES`` element is a small PNG, base64, which an image
  model decodes and a text model reads as text), sent with flat data and again with nested data (the spec
  allows both); the answer names the model, echoes the request's ``id`` and has ``outputs``
  whose ``data`` holds as many values as their ``shape`` says;
- bad requests: a wrong shape, a wrong datatype, an unknown model, malformed JSON and a body
  without ``inputs`` are each answered with a 4xx status and a JSON ``{"error": "..."}``.

The spec has no "list models" call; where ``model`` is not given it is discovered through the
calls servers add (KServe's ``GET /v2/models``, the model repository extension's ``POST
/v2/repository/index`` of Triton and MLServer, KServe's ``GET /v1/models``).
"""

from __future__ import annotations

import http.client
import json
import math
import urllib.parse
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from handlerkit._render import Rendered, Table
from handlerkit.errors import HandlerkitError
from handlerkit.serving.v2 import DATATYPES, flat, metadata_problems, nest, tensor_problems

__all__ = ["DATATYPES", "Answer", "RuleResult", "V2Report", "check"]

_EXCERPT = 120  # characters of a body shown in a row
# A BYTES element of the well-formed request: a 16x16 PNG (a red disc), base64. BYTES inputs
# mostly take an encoded file or text: a model of images decodes it, a model of text reads it as
# text, so a check needs no --inputs for either.
_PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAABAAAAAQCAIAAACQkWg2AAAAS0lEQVR42mP8//8/AymAiYFEQLIGFkyhk/LycLb5w4cEbEBWjclF14Ap"
    "jSnIhF81phTtQ4kCDZghiFWKCZcELkEm/NKYRjAOvsQHAMWCGxvrm+jlAAAAAElFTkSuQmCC"
)
_REQUEST_ID = "handlerkit-v2-check"
_NO_SUCH_MODEL = "handlerkit-no-such-model"
_ERROR_BODY = 'body is JSON {"error": <string>}'


@dataclass(frozen=True)
class Answer:
    """What a server answered: its status (None when no answer came) and its body."""

    status: int | None
    body: bytes = b""
    failure: str = ""  # why no answer came (connection refused, timed out)

    def json(self) -> Any:
        """The body parsed as JSON, or None when it is not JSON."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    def excerpt(self) -> str:
        """The body on one line, cut to a readable length."""
        if self.status is None:
            return self.failure
        text = " ".join(self.body.decode("utf-8", "replace").split())
        return text if len(text) <= _EXCERPT else text[: _EXCERPT - 1] + "…"


@dataclass(frozen=True)
class RuleResult:
    """One endpoint and one rule of the spec: kept or not, and what came back."""

    endpoint: str  # "GET /v2/health/live"
    rule: str  # "answers 200"
    ok: bool
    status: int | None
    excerpt: str  # the body, cut short
    detail: str = ""  # what was wrong, when ``ok`` is false


@dataclass(repr=False)  # Rendered's one-line repr
class V2Report(Rendered):
    """The check of one server and model: a row per endpoint and rule. ``ok`` when all pass."""

    url: str
    model: str
    rows: list[RuleResult] = field(default_factory=list)
    discovered_by: str | None = None  # the call that named the model, when it was not given

    @property
    def ok(self) -> bool:
        return all(row.ok for row in self.rows)

    @property
    def failures(self) -> list[RuleResult]:
        return [row for row in self.rows if not row.ok]

    def passed(self, endpoint: str, rule: str) -> bool:
        """Whether the row of ``endpoint`` and ``rule`` passed (KeyError when there is none)."""
        for row in self.rows:
            if row.endpoint == endpoint and row.rule == rule:
                return row.ok
        raise KeyError(f"no row for {endpoint!r} and {rule!r}")

    def _summary(self) -> str:
        passed = sum(row.ok for row in self.rows)
        found = f" (found by {self.discovered_by})" if self.discovered_by else ""
        return f"Open Inference Protocol v2: {passed} of {len(self.rows)} rules pass; model {self.model}{found} at {self.url}"

    def _tables(self) -> list[Table]:
        # Failures in full (what was wrong and what came back); what passed, one line per endpoint.
        failed = [
            (r.endpoint, r.rule, "" if r.status is None else r.status, r.detail, r.excerpt) for r in self.failures
        ]
        passed: dict[str, tuple[list[str], list[int]]] = {}
        for r in self.rows:
            if r.ok:
                rules, codes = passed.setdefault(r.endpoint, ([], []))
                rules.append(r.rule)
                if r.status is not None and r.status not in codes:
                    codes.append(r.status)
        kept = [(endpoint, "; ".join(rules), ", ".join(map(str, codes))) for endpoint, (rules, codes) in passed.items()]
        return [
            Table(("endpoint", "rule", "status", "what was wrong", "came back"), failed, "FAILED"),
            Table(("endpoint", "rules kept", "status"), kept, "passed"),
        ]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data: the URL, the model, ``ok`` and the rows."""
        return {
            "url": self.url,
            "model": self.model,
            "discovered_by": self.discovered_by,
            "ok": self.ok,
            "rows": [asdict(row) for row in self.rows],
        }


# ----------------------------------------------------------------------------------- HTTP
class _Client:
    """One request per connection to a base URL (its path is kept as a prefix)."""

    def __init__(self, url: str, timeout: float):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise HandlerkitError(
                f"expected the server's base URL, like http://127.0.0.1:8080: got {url!r}",
                fix="pass the URL the server listens on, with http:// or https://",
            )
        self.parts, self.prefix, self.timeout = parts, parts.path.rstrip("/"), timeout

    def __call__(self, method: str, path: str, body: bytes | None = None) -> Answer:
        kind = http.client.HTTPSConnection if self.parts.scheme == "https" else http.client.HTTPConnection
        connection = kind(self.parts.hostname or "", self.parts.port, timeout=self.timeout)
        headers = {"Content-Type": "application/json"} if body is not None else {}
        try:
            connection.request(method, self.prefix + path, body=body, headers=headers)
            response = connection.getresponse()
            return Answer(response.status, response.read())
        except (OSError, http.client.HTTPException) as exc:
            return Answer(None, failure=f"no answer: {type(exc).__name__}: {exc}")
        finally:
            connection.close()


def _json_body(value: Any) -> bytes:
    return json.dumps(value).encode()


# ------------------------------------------------------------------------------ the rules
def _output_problems(output: Any, index: int) -> list[str]:
    """An output's tensor rule, its data counted but not typed: TorchServe's ``kservev2``
    envelope answers a handler's dicts (a classifier's ``{label: probability}``) as ``BYTES``."""
    where = f"outputs[{index}]"
    if isinstance(output, dict) and not isinstance(output.get("data"), list):
        return [f"{where} has no data list"]
    return tensor_problems(output, where, elements=False)


def _value(datatype: str, i: int) -> Any:
    """The ``i``-th value of a well-formed tensor of ``datatype``."""
    if datatype == "BOOL":
        return i % 2 == 0
    if datatype == "BYTES":
        return _PNG
    if datatype.startswith("FP"):
        return 0.5 * (i % 4)
    return i % 4 + 1


def _inputs(metadata: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Well-formed request inputs (flat data) for the metadata's inputs: -1 dimensions filled with 1."""
    inputs = []
    for tensor in metadata:
        shape = [1 if d == -1 else d for d in tensor["shape"]]
        values = [_value(tensor["datatype"], i) for i in range(math.prod(shape))]
        inputs.append({"name": tensor["name"], "shape": shape, "datatype": tensor["datatype"], "data": values})
    return inputs


def _wrong_shape(inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first input's first dimension grown by one: its shape no longer matches its data."""
    first = inputs[0]
    shape = [first["shape"][0] + 1, *first["shape"][1:]] if first["shape"] else [2]
    return [{**first, "shape": shape}, *inputs[1:]]


def _wrong_datatype(inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first input sent as a datatype its metadata does not declare (strings for numbers)."""
    first = inputs[0]
    size = len(first["data"])
    if first["datatype"] == "BYTES":
        wrong = {"datatype": "FP32", "data": [0.5] * size}
    else:
        wrong = {"datatype": "BYTES", "data": ["not a number"] * size}
    return [{**first, **wrong}, *inputs[1:]]


class _Checker:
    """The rows of one check, and the helpers that add them."""

    def __init__(self, client: _Client, report: V2Report):
        self.ask, self.report = client, report

    def rule(self, endpoint: str, rule: str, answer: Answer, problems: list[str] | str | None) -> None:
        if isinstance(problems, str):
            problems = [problems]
        detail = "; ".join(problems or [])
        self.report.rows.append(RuleResult(endpoint, rule, not problems, answer.status, answer.excerpt(), detail))

    def status(self, endpoint: str, answer: Answer, expected: int = 200) -> bool:
        ok = answer.status == expected
        came = answer.failure if answer.status is None else f"got {answer.status}"
        self.rule(endpoint, f"answers {expected}", answer, None if ok else f"expected {expected}, {came}")
        return ok

    def json_object(
        self, endpoint: str, rule: str, answer: Answer, keys: Callable[[dict[str, Any]], list[str]]
    ) -> None:
        body = answer.json()
        if not isinstance(body, dict):
            self.rule(endpoint, rule, answer, "the body is not a JSON object")
        else:
            self.rule(endpoint, rule, answer, keys(body))

    def refused(self, endpoint: str, what: str, answer: Answer, *, error_body: bool = True) -> None:
        """A bad request: a 4xx status and, unless a health call, a JSON ``{"error": ...}``."""
        is_4xx = answer.status is not None and 400 <= answer.status < 500
        came = answer.failure if answer.status is None else f"got {answer.status}"
        self.rule(endpoint, f"{what}: answers 4xx", answer, None if is_4xx else f"expected a 4xx status, {came}")
        if error_body:
            body = answer.json()
            has_error = isinstance(body, dict) and isinstance(body.get("error"), str)
            self.rule(endpoint, f"{what}: {_ERROR_BODY}", answer, None if has_error else 'no JSON {"error": <string>}')


def _server_metadata(body: dict[str, Any]) -> list[str]:
    problems = [f"no string {key}" for key in ("name", "version") if not isinstance(body.get(key), str)]
    extensions = body.get("extensions")
    if not isinstance(extensions, list) or not all(isinstance(e, str) for e in extensions):
        problems.append(f"extensions {extensions!r} is not a list of strings")
    return problems


def _model_metadata(model: str) -> Callable[[dict[str, Any]], list[str]]:
    def problems(body: dict[str, Any]) -> list[str]:
        found = [] if body.get("name") == model else [f"name {body.get('name')!r} is not {model!r}"]
        if not isinstance(body.get("platform"), str):
            found.append("no string platform")
        versions = body.get("versions")
        if versions is not None and not (isinstance(versions, list) and all(isinstance(v, str) for v in versions)):
            found.append(f"versions {versions!r} is not a list of strings")
        for key in ("inputs", "outputs"):
            tensors = body.get(key)
            if not isinstance(tensors, list):
                found.append(f"no {key} list")
                continue
            found += metadata_problems(tensors, key)
        return found

    return problems


def _infer_response(model: str) -> Callable[[dict[str, Any]], list[str]]:
    def problems(body: dict[str, Any]) -> list[str]:
        found = [] if body.get("model_name") == model else [f"model_name {body.get('model_name')!r} is not {model!r}"]
        if body.get("id") != _REQUEST_ID:
            found.append(f"id {body.get('id')!r} is not the request's {_REQUEST_ID!r}")
        outputs = body.get("outputs")
        if not isinstance(outputs, list) or not outputs:
            return [*found, "no outputs"]
        for i, output in enumerate(outputs):
            found += _output_problems(output, i)
        return found

    return problems


# ------------------------------------------------------------------------------ the check
def check(
    url: str, model: str | None = None, *, inputs: list[dict[str, Any]] | None = None, timeout: float = 10.0
) -> V2Report:
    """Check the server at ``url`` (e.g. ``http://127.0.0.1:8080``) against the Open Inference
    Protocol v2, with ``model`` (discovered where the server lists its models, when not given).

    ``inputs``: the well-formed request's inputs (v2 ``$request_input`` objects), for a model
    that needs real data (an image classifier needs an encoded image, not any string); by
    default they are built from the model's metadata.

    Raises:
        HandlerkitError: the URL is no http(s) URL, ``inputs`` are no v2 request inputs,
            nothing answers there, or no model was given and the server names none (or several).
    """
    if inputs is not None:
        _check_inputs(inputs)
    ask = _Client(url, timeout)
    live = ask("GET", "/v2/health/live")
    if live.status is None:
        raise HandlerkitError(
            f"expected an Open Inference Protocol v2 server at {url}: {live.failure}",
            fix="start the server first, or check the URL's host and port",
        )
    discovered_by = None
    if model is None:
        model, discovered_by = _discover(ask, url)
    report = V2Report(url, model, discovered_by=discovered_by)
    rules = _Checker(ask, report)
    rules.status("GET /v2/health/live", live)
    rules.status("GET /v2/health/ready", ask("GET", "/v2/health/ready"))

    server = ask("GET", "/v2")
    if rules.status("GET /v2", server):
        rules.json_object("GET /v2", "name, version and extensions", server, _server_metadata)

    path = f"/v2/models/{urllib.parse.quote(model, safe='')}"
    metadata_answer = ask("GET", path)
    inputs_metadata: list[dict[str, Any]] = []
    if rules.status(f"GET {path}", metadata_answer):
        rules.json_object(f"GET {path}", "name, platform, inputs and outputs", metadata_answer, _model_metadata(model))
        body = metadata_answer.json()
        tensors = body.get("inputs") if isinstance(body, dict) else None
        if isinstance(tensors, list) and tensors and not metadata_problems(tensors, "inputs"):
            inputs_metadata = tensors
    rules.status(f"GET {path}/ready", ask("GET", f"{path}/ready"))

    infer = f"POST {path}/infer"
    if inputs is not None:
        well_formed = [{**t, "data": flat(t["data"])} for t in inputs]
    else:
        well_formed = _inputs(inputs_metadata) if inputs_metadata else []
    if not well_formed:
        missing = Answer(None, failure="not sent")
        rules.rule(
            infer,
            "a request built from the metadata's inputs",
            missing,
            "the metadata lists no usable inputs: send your own (--inputs FILE; inputs= in Python)",
        )
    types = ", ".join(sorted({t["datatype"] for t in well_formed}))
    for form, nested in (("flat data", False), ("nested data", True)):
        if not well_formed:
            break
        sent = [{**t, "data": nest(t["data"], t["shape"])} for t in well_formed] if nested else well_formed
        answer = ask("POST", f"{path}/infer", _json_body({"id": _REQUEST_ID, "inputs": sent}))
        endpoint = f"{infer} ({types}, {form})"
        if rules.status(endpoint, answer):
            rules.json_object(endpoint, "model_name, id and outputs (data fills shape)", answer, _infer_response(model))

    if well_formed:
        rules.refused(
            infer, "wrong shape", ask("POST", f"{path}/infer", _json_body({"inputs": _wrong_shape(well_formed)}))
        )
        wrong_type = _json_body({"inputs": _wrong_datatype(well_formed)})
        rules.refused(infer, "wrong datatype", ask("POST", f"{path}/infer", wrong_type))
    rules.refused(infer, "malformed JSON", ask("POST", f"{path}/infer", b'{"inputs": [{"name": '))
    rules.refused(infer, "no inputs", ask("POST", f"{path}/infer", _json_body({"id": _REQUEST_ID})))

    unknown = f"/v2/models/{_NO_SUCH_MODEL}"
    rules.refused(f"GET {unknown}", "unknown model", ask("GET", unknown))
    rules.refused(f"GET {unknown}/ready", "unknown model", ask("GET", f"{unknown}/ready"), error_body=False)
    body = {"inputs": well_formed or [{"name": "input-0", "shape": [1], "datatype": "FP32", "data": [0.5]}]}
    rules.refused(f"POST {unknown}/infer", "unknown model", ask("POST", f"{unknown}/infer", _json_body(body)))
    return report


def _check_inputs(inputs: Any) -> None:
    """``inputs`` are v2 request inputs: each a tensor of the rule, its data filling its shape."""
    if isinstance(inputs, list) and inputs:
        problems = [p for i, tensor in enumerate(inputs) for p in tensor_problems(tensor, f"inputs[{i}]")]
    else:
        problems = [f"expected a non-empty list: got {inputs!r:.60}"]
    if problems:
        raise HandlerkitError(
            f"expected v2 request inputs ({{name, shape, datatype, data}} each): {'; '.join(problems)}",
            fix='give a list like [{"name": "input-0", "shape": [1], "datatype": "BYTES", "data": ["..."]}]',
        )


def _discover(ask: _Client, url: str) -> tuple[str, str]:
    """The one model the server lists, and the call that listed it."""
    calls = (("GET", "/v2/models", None), ("POST", "/v2/repository/index", b"{}"), ("GET", "/v1/models", None))
    for method, path, body in calls:
        answer = ask(method, path, body)
        listed = answer.json() if answer.status == 200 else None
        if isinstance(listed, dict):
            listed = listed.get("models")
        if not isinstance(listed, list):
            continue
        found = [item.get("name") if isinstance(item, dict) else item for item in listed]
        names = sorted({n for n in found if isinstance(n, str)})
        if len(names) == 1:
            return names[0], f"{method} {path}"
        if names:
            raise HandlerkitError(
                f"expected one model at {url} to check: {method} {path} lists {len(names)} ({', '.join(names)})",
                fix=f"name one: --model {names[0]} (or check(url, model=...))",
            )
    raise HandlerkitError(
        f"no model named and none listed at {url} (tried GET /v2/models, POST /v2/repository/index, GET /v1/models)",
        fix="name the model: --model NAME (or check(url, model=...))",
    )
