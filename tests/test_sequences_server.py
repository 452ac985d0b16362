"""Stateful sequences and an async handler under the real TorchServe 0.12 server, driven over
HTTP as TorchServe's own clients drive them (pytorch/serve ``test/pytest/
test_example_stateful_*_http.py``), and the same requests through hk.Sequences / the Harness:
the same answer per request, in the same order, the same HTTP chunks for streamed ones.

What a client does, as read from the real server (pinned below):

- ``sequenceBatching``: a request without ``ts_request_sequence_id`` opens a sequence the
  frontend names ``ts-seq-<uuid4>`` (the worker sees ``ts_request_sequence_start: true``); the
  frontend does **not** answer that id itself: a handler that wants its client to continue the
  sequence sets the response header (``STREAMING_SUM`` does, ``SEQUENCE_SUM`` does not, so its
  clients name their own sequences, as ``test_example_stateful_sequence_batching_http.py``).
  Later requests carry ``ts_request_sequence_id``. The handler ends a sequence with the response
  header ``ts_request_sequence_end``; ``-1`` cancels a sequence's stream (the handler's protocol).
- ``maxNumSequence`` is 1 when model-config.yaml does not set it (``GET /models/<m>``): one
  sequence more than it allows is answered 503 until one ends or idles out (hk.Sequences raises;
  it sets no limit when the config sets none); the configs here set 3 and 2.
- Under ``continuousBatching`` a request the handler leaves unfinished is answered as HTTP
  chunks, one per step (``transfer-encoding: chunked``, ``ts_stream_next: true``).

One server for the whole module (three models); requests are sent one at a time, so each
worker call holds one request and both sides see the same order.

The same requests then go to handlerkit.serving.ray (``-m ray``; each sequence request also
carries ``serve_multiplexed_model_id``, Ray's routing header): the same answers, headers and
error documents, the async handler's same chunks, and under continuous batching the same HTTP
chunks, one per step, and final answers (Ray's continuous-batching loop:
``handlerkit.serving.frontend.continuous``).
"""

from __future__ import annotations

import concurrent.futures
import json
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from _async_handlers import VLLM_STYLE, prompt, reversed_words, write_model_dir
from _serving import ray_apps
from _stateful_handlers import CONTINUOUS_CONFIG, SEQUENCE_CONFIG, SEQUENCE_SUM, STREAMING_SUM, model_dir
from _ts_server import HOST, TorchServe, missing_requirements, serving

import handlerkit as hk
from handlerkit.sequences import Job, Sequence
from handlerkit.serving.frontend.sequence_desk import ROUTING_HEADER

_missing = missing_requirements()
pytestmark = [
    pytest.mark.torchserve,
    pytest.mark.server,
    pytest.mark.skipif(_missing is not None, reason=f"real TorchServe server: {_missing}"),
]

SEQ_ID, SEQ_START, SEQ_END = "ts_request_sequence_id", "ts_request_sequence_start", "ts_request_sequence_end"
#: Several sequences open at once (TorchServe's default is 1).
SUM_CONFIG = SEQUENCE_CONFIG + "maxNumSequence: 3\n"
STREAM_CONFIG = CONTINUOUS_CONFIG + "maxNumSequence: 2\n"

#: (sequence, body) in sending order. SEQUENCE_SUM: the clients name their sequences.
SUM_SCRIPT = [("seq_0", 1), ("seq_1", 2), ("seq_0", 3), ("seq_1", 4), ("seq_0", 5)]
#: STREAMING_SUM: ``a`` and ``b`` open without an id (the first request of each); odd numbers
#: stream for five more steps; -1 cancels; 0 ends. After ``a``'s cancel only even numbers are
#: sent: an odd one would be answered by a lone final frame with ``ts_stream_next: false``,
#: which TorchServe's frontend never sends to the client (no status line: the client waits).
STREAM_SCRIPT = [("a", 2), ("a", 3), ("b", 1), ("b", 7), ("a", 4), ("a", -1), ("b", 0), ("a", 6), ("a", 0)]


class Answer(NamedTuple):
    """One HTTP answer: status, headers (lower-cased names), the body's chunks (one item for a
    response with a content length), and whether it came chunked."""

    status: int
    headers: dict[str, str]
    chunks: list[bytes]
    chunked: bool


def exchange(port: int, path: str, body: bytes, headers: Mapping[str, str] | None = None) -> Answer:
    """POST ``body`` and read the raw answer, keeping each HTTP chunk as it was framed."""
    head = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    with socket.create_connection((HOST, port), timeout=30) as conn:
        conn.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode() + body
        )
        reader = conn.makefile("rb")
        status = int(reader.readline().split()[1])
        got: dict[str, str] = {}
        while (line := reader.readline()) not in (b"\r\n", b""):
            key, _, value = line.decode("latin-1").partition(":")
            got[key.strip().lower()] = value.strip()
        if got.get("transfer-encoding") != "chunked":
            return Answer(status, got, [reader.read(int(got.get("content-length", 0)))], False)
        chunks = []
        while size := int(reader.readline().split(b";")[0], 16):
            chunks.append(reader.read(size + 2)[:size])
        return Answer(status, got, chunks, True)


def _encoded(answer: Any) -> bytes:
    """An answer as the worker writes it."""
    return answer.encode() if isinstance(answer, str) else json.dumps(answer, indent=2).encode()


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sequence_sources")
    return {
        "seqsum": model_dir(root, "seqsum", SEQUENCE_SUM, SUM_CONFIG),
        "stream": model_dir(root, "stream", STREAMING_SUM, STREAM_CONFIG),
        "tiny_llm": write_model_dir(root, VLLM_STYLE),
    }


@pytest.fixture(scope="module")
def torchserve(tmp_path_factory: pytest.TempPathFactory, sources: dict[str, Path]) -> Iterator[TorchServe]:
    from handlerkit.archive import build

    store = tmp_path_factory.mktemp("sequence_store")
    archives = {name: build(directory, store, force=True) for name, directory in sources.items()}
    with serving(tmp_path_factory.mktemp("sequence_ts"), archives, timeout=120) as ts:
        yield ts


def send_script(
    port: int, model: str, script: list[tuple[str, int]], *, issued: bool, prefix: str = ""
) -> list[Answer]:
    """Send ``script`` over HTTP; ``issued``: a sequence's first request goes without an id and
    the later ones carry the id its answer named (else each request names its own sequence).
    With a ``prefix`` (a Ray application's route) each request naming its sequence also carries
    Ray's routing header, as the adapter's clients do."""
    ids: dict[str, str] = {}
    answers = []
    for name, number in script:
        headers = {}
        if not issued:
            headers[SEQ_ID] = name
        elif name in ids:
            headers[SEQ_ID] = ids[name]
        if prefix and SEQ_ID in headers:
            headers[ROUTING_HEADER] = headers[SEQ_ID]
        answer = exchange(port, f"{prefix}/predictions/{model}", str(number).encode(), headers)
        if issued and name not in ids:
            ids[name] = answer.headers[SEQ_ID]
        answers.append(answer)
    return answers


def harness_script(directory: Path, script: list[tuple[str, int]], *, issued: bool) -> list[Job]:
    """The same requests through hk.Sequences, each run to its end before the next is sent."""
    seqs = hk.Sequences(hk.Harness.open(directory))
    opened: dict[str, Sequence] = {}
    jobs = []
    for name, number in script:
        request = hk.Request.text(str(number))
        if name not in opened:
            opened[name] = seqs.start(request, sequence_id=None if issued else name)
            job = opened[name].jobs[-1]
        else:
            job = opened[name].send(request)
        seqs.run()
        jobs.append(job)
    return jobs


def _same(answers: list[Answer], jobs: list[Job]) -> None:
    """Each HTTP answer is the hk job's: status 200, the chunks (one per step when it streamed),
    and the sequence headers naming the same sequences at the same requests."""
    names_ts: dict[str, int] = {}
    names_hk: dict[str, int] = {}
    for answer, job in zip(answers, jobs, strict=True):
        assert answer.status == 200
        assert answer.chunks == [_encoded(a) for a in job.answers], (answer, job)
        assert answer.chunked == (len(job.answers) > 1)
        for key in (SEQ_ID, SEQ_END):
            theirs, ours = answer.headers.get(key), job.headers.get(key)
            assert (theirs is None) == (ours is None), (key, answer, job)
            if theirs is not None and ours is not None:  # the same sequence, by order of appearance
                assert names_ts.setdefault(theirs, len(names_ts)) == names_hk.setdefault(ours, len(names_hk))


ASYNC_PROMPTS = [("the quick brown fox", False), ("jumps over the lazy dog", False), ("hello big world", True)]


def sum_answers(port: int, prefix: str = "") -> dict[str, Any]:
    """SEQUENCE_SUM's scenario: a sequence the frontend opens, the script, one sequence too many."""
    path = f"{prefix}/predictions/seqsum"
    unnamed = exchange(port, path, b"7")  # opens ts-seq-<uuid>, which its client never learns
    script = send_script(port, "seqsum", SUM_SCRIPT, issued=False, prefix=prefix)
    refused = exchange(port, path, b"1", {SEQ_ID: "seq_2", ROUTING_HEADER: "seq_2"})  # over maxNumSequence
    return {"unnamed": unnamed, "script": script, "refused": refused}


def async_answers(port: int, prefix: str = "") -> list[Answer]:
    def post(item: tuple[str, bool]) -> Answer:
        text, stream = item
        body, headers = prompt(text, stream=stream), {"Content-Type": "application/json"}
        return exchange(port, f"{prefix}/predictions/tiny_llm", body, headers)

    with concurrent.futures.ThreadPoolExecutor(3) as pool:  # awaited at once by the async worker
        return list(pool.map(post, ASYNC_PROMPTS))


def all_answers(port: int, prefix: str = "") -> dict[str, Any]:
    """Every scenario's answers from the server on ``port`` (``prefix``: Ray, one application per model)."""
    return {
        "seqsum": sum_answers(port, prefix and f"{prefix}seqsum"),
        "stream": send_script(port, "stream", STREAM_SCRIPT, issued=True, prefix=prefix and f"{prefix}stream"),
        "tiny_llm": async_answers(port, prefix and f"{prefix}tiny_llm"),
    }


@pytest.fixture(scope="module")
def theirs(torchserve: TorchServe) -> dict[str, Any]:
    return all_answers(torchserve.inference_port)


@pytest.fixture(scope="module")
def on_ray(theirs: dict[str, Any], sources: dict[str, Path]) -> Iterator[dict[str, Any]]:
    """The same scenarios through handlerkit.serving.ray (one replica per model)."""
    pytest.importorskip("ray")
    with ray_apps(sources) as port:
        yield all_answers(port, prefix="/")


def test_sequence_batching_answers_as_torchserve(theirs, sources):
    unnamed, answers, refused = theirs["seqsum"]["unnamed"], theirs["seqsum"]["script"], theirs["seqsum"]["refused"]
    assert (unnamed.status, unnamed.chunks) == (200, [b"7"]) and SEQ_ID not in unnamed.headers
    assert [a.chunks[0] for a in answers] == [b"1", b"2", b"4", b"6", b"9"]  # running sums per sequence
    _same(answers, harness_script(sources["seqsum"], SUM_SCRIPT, issued=False))
    assert refused.status == 503 and b"exceeds maxSequenceJobQueueSize" in refused.chunks[0]
    seqs = hk.Sequences(hk.Harness.open(sources["seqsum"]))
    for name in ("unnamed", "seq_0", "seq_1"):
        seqs.start(hk.Request.text("1"), sequence_id=name)
    with pytest.raises(
        hk.HandlerkitError,
        match=r"3 sequences are open, the most maxNumSequence allows \(3\): TorchServe answers this request 503",
    ):
        seqs.start(hk.Request.text("1"), sequence_id="seq_2")


def test_continuous_batching_streams_and_ends_as_torchserve(theirs, sources):
    answers = theirs["stream"]
    assert answers[1].chunks == [b"5"] * 6 and answers[1].headers["ts_stream_next"] == "true"
    assert answers[3].chunks == [b"8"] * 6  # a second sequence streams its own sum
    assert [a.chunks for a in answers[4:]] == [[b"9"], [b"-1"], [b"8"], [b"15"], [b"15"]]
    assert SEQ_END in answers[6].headers and SEQ_END in answers[8].headers
    assert answers[0].headers[SEQ_ID].startswith("ts-seq-")
    _same(answers, harness_script(sources["stream"], STREAM_SCRIPT, issued=True))


def test_the_server_lists_the_sequence_settings(torchserve):
    described = torchserve.management("GET", "/models/stream").json()[0]
    assert described["maxNumSequence"] == 2 and described["stateful"] and described["continuousBatching"]


def test_the_async_handler_answers_and_streams_as_the_harness(theirs, sources):
    h = hk.Harness.open(sources["tiny_llm"])
    try:
        for (text, stream), answer in zip(ASYNC_PROMPTS, theirs["tiny_llm"], strict=True):
            run = h.run(hk.batch(hk.Request.from_bytes(prompt(text, stream=stream), content_type="application/json")))
            final = json.loads(answer.chunks[-1])
            assert answer.status == 200 and final["text"] == run.output[0]["text"] == reversed_words(text)
            assert final["tokens"] == run.output[0]["tokens"]
            assert answer.chunks[:-1] == [c.body for c in run.chunks]  # the tokens, sent before the answer
            assert answer.chunked is stream and len(run.chunks) == (3 if stream else 0)
    finally:
        h.service.close()


# -- the same requests on Ray Serve ------------------------------------------------------------
def _sans(answer: Answer) -> tuple[int, dict[str, str], list[bytes], bool]:
    """An answer without the headers only one server adds (or that differ per request)."""
    one_sided = {"date", "server", "x-request-id", "pragma", "cache-control", "expires", "connection", "content-length"}
    return answer.status, {k: v for k, v in answer.headers.items() if k not in one_sided}, answer.chunks, answer.chunked


@pytest.mark.ray
def test_sequence_batching_on_ray_answers_as_torchserve(theirs, on_ray):
    ts, ours = theirs["seqsum"], on_ray["seqsum"]
    assert [_sans(a) for a in ours["script"]] == [_sans(a) for a in ts["script"]]
    assert _sans(ours["unnamed"]) == _sans(ts["unnamed"])  # no sequence id answered on either
    assert _sans(ours["refused"]) == _sans(ts["refused"])  # the same 503 document past maxNumSequence


def _by_order(answers: list[Answer]) -> list[tuple[int, dict[str, str], list[bytes], bool]]:
    """The answers as :func:`_sans` has them, each frontend-issued sequence id named by its order
    of appearance (``seq0``, ``seq1``...), so that two servers' answers compare."""
    names: dict[str, str] = {}
    out = []
    for answer in answers:
        status, headers, chunks, chunked = _sans(answer)
        for key in (SEQ_ID, SEQ_END):
            if key in headers:
                headers[key] = names.setdefault(headers[key], f"seq{len(names)}")
        out.append((status, headers, chunks, chunked))
    return out


@pytest.mark.ray
def test_continuous_batching_on_ray_streams_and_ends_as_torchserve(theirs, on_ray, sources):
    """Each request TorchServe streams (an HTTP chunk per step, ``ts_stream_next: true``) is
    streamed by Ray's loop with the same chunks and headers; every other answer is the same too."""
    ours = on_ray["stream"]
    assert _by_order(ours) == _by_order(theirs["stream"])
    assert [len(a.chunks) for a in ours if a.chunked] == [6, 6]
    _same(ours, harness_script(sources["stream"], STREAM_SCRIPT, issued=True))  # and as hk.Sequences


@pytest.mark.ray
def test_the_async_handler_on_ray_answers_and_streams_as_torchserve(theirs, on_ray):
    for ts, ours in zip(theirs["tiny_llm"], on_ray["tiny_llm"], strict=True):
        assert (ours.status, ours.chunks[:-1], ours.chunked) == (ts.status, ts.chunks[:-1], ts.chunked)
        final_ts, final_ours = json.loads(ts.chunks[-1]), json.loads(ours.chunks[-1])
        assert (final_ours["text"], final_ours["tokens"]) == (final_ts["text"], final_ts["tokens"])
