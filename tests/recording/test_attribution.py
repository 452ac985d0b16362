"""A failure after preprocess names its request and its cause, on handlers as new users write
them (tests/_new_users.py) and small ones written here.

- the ranker's batch where request 1 sends item id 99: inference fails for request 1, at the
  handler's ``self.model(*inputs)`` *and* the model file's embedding line, and the fix is to
  validate the payload and refuse that request, not to correct the handler;
- postprocess failing for request 2, in ``h.run`` and in ``handlerkit check``;
- a batch that fails only together; a batch whose requests each fail alone;
- a truncated WAV alone: the payload's fault, not the line's;
- the served path (``serving._failures.batch_failure``), a function handler's ``handle``, and a
  streaming handler whose chunks must not reach the batch's clients again;
- running the requests alone leaves the handler's state, ``h.results``, the context and its
  metrics as the failure left them, and stops early;
- a handler class defined in a notebook cell: its lines are the cell's, and ``h.reload()``
  says to re-run the cell.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _new_users import (
    RANKER_EMBEDDING_LINE,
    RANKER_INFERENCE_LINE,
    audio_dir,
    ranker_dir,
    ranker_request,
    truncated_wav,
    wav_bytes,
)

import handlerkit as hk
from handlerkit.cli import main
from handlerkit.errors import HandlerkitError, StageError
from handlerkit.handlers import BaseHandler
from handlerkit.recording import failures
from handlerkit.recording.alone import ENOUGH_FAILING
from handlerkit.serving.frontend.failure_answers import batch_failure
from handlerkit.worker.locations import cell_name
from handlerkit.worker.streaming import ChunkSocket

ROOT = Path(__file__).resolve().parents[2]
REFUSE = "refuse that request alone (self.refuse(index, message, fix=...), see handlerkit.handlers.PerRequestErrors)"
BASES = ["handlerkit", pytest.param("torchserve", marks=pytest.mark.torchserve)]


def ranker_batch() -> hk.Batch:
    return hk.batch(hk.Request.json(ranker_request(1, [1, 2, 3])), hk.Request.json(ranker_request(2, [4, 99])))


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


# -- the ranker: an item id the embedding has no row for ------------------------------------
@pytest.mark.parametrize("base", BASES)
def test_an_item_id_out_of_the_embedding_is_request_1_at_both_user_lines(tmp_path, base):
    model_dir = ranker_dir(tmp_path / "recs", base=base)
    h = hk.Harness.open(model_dir)
    with pytest.raises(
        StageError, match=r"^inference failed in RecsHandler for request 1: IndexError: index out of range"
    ):
        h.run(ranker_batch())
    error = h.results["inference"].error
    handler_line = (
        f"at {model_dir / 'handler.py'}:{RANKER_INFERENCE_LINE}: return self.model(*inputs), inputs[1], inputs[2]"
    )
    model_line = f"at {model_dir / 'model.py'}:{RANKER_EMBEDDING_LINE}: items = self.items(item_ids)"
    assert error.message.splitlines()[1:] == [f"  {handler_line}", f"  {model_line}"]  # innermost last
    assert error.request_index == 1 and error.stage == "inference"
    assert [(Path(f).name, n) for f, n, _ in error.locations] == [
        ("handler.py", RANKER_INFERENCE_LINE),
        ("model.py", RANKER_EMBEDDING_LINE),
    ]
    assert error.location == error.locations[-1]  # the innermost user line, as before
    assert error.fix == (
        f"request 1 sent the index 99, which the embedding at model.py line {RANKER_EMBEDDING_LINE} has no row for "
        f"(it has 40, 0 to 39): validate it in preprocess and {REFUSE}"
    )
    assert "correct" not in error.fix


def test_stepping_the_ranker_attributes_inference_too_unless_its_input_was_given_by_hand(tmp_path):
    h = hk.Harness.open(ranker_dir(tmp_path / "recs", base="handlerkit"))
    h.initialize()
    preprocessed = h.preprocess(ranker_batch())
    with pytest.raises(StageError, match=r"^inference failed in RecsHandler for request 1: IndexError") as info:
        h.inference()
    assert info.value.fix.startswith("request 1 sent the index 99")
    assert h.results["preprocess"] is preprocessed and list(h.results) == ["initialize", "preprocess", "inference"]
    with pytest.raises(StageError, match=r"^inference failed in RecsHandler for the batch: IndexError") as info:
        h.inference(tuple(t.clone() for t in preprocessed.output))  # the user's own tensors: about no request
    assert info.value.request_index is None
    assert (
        "\n  the requests were not run alone to find the one at fault: inference ran on an input given by hand "
        "(h.inference(value)), not on the batch's requests\n" in str(info.value)
    )
    assert info.value.fix.startswith("a request sent the index 99, which the embedding at model.py line 13")


def test_a_served_batch_names_the_request_and_the_model_line(tmp_path):
    with hk.Service.open(ranker_dir(tmp_path / "recs", base="handlerkit")) as service:
        service.initialize()
        batch = ranker_batch()
        with pytest.raises(IndexError) as info:
            service.handle(batch)
        error = batch_failure(service, batch, info.value, failures.handler_files(service.handler))
        assert error.stage == "inference" and error.request_index == 1
        assert error.message.startswith("inference failed in RecsHandler for request 1: IndexError")
        assert f"recs/model.py:{RANKER_EMBEDDING_LINE}: items = self.items(item_ids)" in error.message
        assert service.context.request_ids == batch.request_ids  # bound back to the whole batch
        assert error.fix.startswith("request 1 sent the index 99")


# -- postprocess: request 2, in h.run and in `handlerkit check` --------------------------------
SCORES = """\
from handlerkit.handlers import BaseHandler


class Scores(BaseHandler):
    def initialize(self, context):
        self.initialized = True

    def preprocess(self, data):
        return [float((row.get("data") or row.get("body"))["x"]) for row in data]

    def inference(self, xs):
        return [2 * x for x in xs]

    def postprocess(self, ys):
        answers = []
        for y in ys:
            if y < 0:
                raise ValueError(f"a score below zero: {y}")
            answers.append({"score": y})
        return answers
"""


def model_dir(path: Path, source: str, name: str) -> Path:
    path.mkdir(parents=True)
    (path / "handler.py").write_text(source)
    (path / "MAR-INF").mkdir()
    manifest = {"runtime": "python", "model": {"modelName": name, "handler": "handler.py"}}
    (path / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest))
    return path


def test_postprocess_failing_for_request_2_is_told_in_a_run(tmp_path):
    path = model_dir(tmp_path / "scores", SCORES, "scores")
    h = hk.Harness.open(path)
    batch = hk.batch(*(hk.Request.json({"x": x}) for x in (1, 2, -3)))
    with pytest.raises(
        StageError, match=r"^postprocess failed in Scores for request 2: ValueError: a score below zero"
    ):
        h.run(batch)
    error = h.results["postprocess"].error
    line = line_of(path / "handler.py", "raise ValueError")
    assert error.request_index == 2 and error.location[1] == line
    assert error.fix == (
        "request 2 fails postprocess alone where request 0 passes, so what it sent is what the handler cannot "
        f"read: compare its payload with request 0's; validate it in preprocess and {REFUSE}, or correct handler.py "
        f"line {line} if it should be read"
    )


def test_handlerkit_check_names_the_file_of_the_request_postprocess_fails_for(tmp_path, capsys):
    path = model_dir(tmp_path / "scores", SCORES, "scores")
    files = []
    for name, x in (("one.json", 1), ("two.json", 2), ("minus.json", -3)):
        (tmp_path / name).write_text(json.dumps({"x": x}))
        files.append(str(tmp_path / name))
    code = main(["check", str(path), *files, "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1 and data["ok"] is False
    (problem,) = data["problems"]
    assert (problem["check"], problem["stage"], problem["request"], problem["file"]) == (
        "runs",
        "postprocess",
        2,
        files[2],
    )
    assert problem["message"] == f"postprocess failed in Scores for {files[2]}: ValueError: a score below zero: -6.0"
    assert problem["fix"].startswith(f"{files[2]} fails postprocess alone where {files[0]} passes")
    code = main(["check", str(path), *files])
    out = capsys.readouterr().out
    assert code == 1 and f"postprocess failed in Scores for {files[2]}: ValueError" in " ".join(out.split())  # wrapped


# -- only together, or each alone ------------------------------------------------------------
class Ragged(BaseHandler):
    """Lists of any length in; inference needs them of one length (``torch.tensor`` of a ragged list fails)."""

    def initialize(self, context):
        self.initialized = True

    def preprocess(self, data):
        return [row["body"]["row"] for row in data]

    def inference(self, rows):
        import torch

        return torch.tensor(rows, dtype=torch.float32).sum(dim=1).tolist()

    def postprocess(self, sums):
        return sums


def test_a_batch_that_fails_only_together_in_inference_is_told_so():
    h = hk.Harness(Ragged, hk.MockContext(gpu_id=None))
    batch = hk.batch(*(hk.Request.json({"row": row}) for row in ([1, 2, 3], [4, 5, 6], [7, 8])))
    assert h.run(batch[2:]).output == [15.0]  # each passes alone
    with pytest.raises(StageError, match=r"^inference failed in Ragged for the batch: ValueError: expected sequence"):
        h.run(batch)
    error = h.results["inference"].error
    assert error.request_index is None
    assert "\n  run alone, each of the 3 requests passes: only the batch as a whole fails\n" in str(error)
    assert error.fix == (
        "each of the 3 requests passes inference alone, so it is their combination that fails: what they sent "
        "differs where the handler puts them together (lists of different lengths, images of different sizes); "
        f"compare their payloads, and where one has the wrong size, validate it in preprocess and {REFUSE}, or make "
        f"test_attribution.py line {inspect.unwrap(Ragged.inference).__code__.co_firstlineno + 3} pad them"
    )


class Tally(BaseHandler):
    """Keeps per-batch state in self; inference refuses a negative number. Counts its inference
    calls on the class, where running requests alone cannot put the count back."""

    inference_calls = 0

    def initialize(self, context):
        self.seen: list[float] = []
        self.batches = 0

    def preprocess(self, data):
        self.batches += 1
        self.last_size = len(data)
        self.context.metrics.add_counter("Rows", len(data))
        xs = [float(row["body"]["x"]) for row in data]
        self.seen.extend(xs)
        return xs

    def inference(self, xs):
        Tally.inference_calls += 1  # on the class: its own, not the spied subclass's
        if any(x < 0 for x in xs):
            raise ValueError("a negative number")
        return xs

    def postprocess(self, ys):
        return ys


def numbers(*xs: float) -> hk.Batch:
    return hk.batch(*(hk.Request.json({"x": x}) for x in xs))


def test_running_requests_alone_leaves_state_results_context_and_metrics_as_the_failure_left_them():
    h = hk.Harness(Tally, hk.MockContext(gpu_id=None))
    h.run(numbers(5))
    batch = numbers(1, -2, 3)
    with pytest.raises(StageError, match=r"^inference failed in Tally for request 1: ValueError") as info:
        h.run(batch)
    assert info.value.fix.startswith("request 1 fails inference alone where request 0 passes")
    handler = h.handler
    assert (handler.seen, handler.batches, handler.last_size) == ([5.0, 1.0, -2.0, 3.0], 2, 3)
    assert list(h.results) == ["initialize", "preprocess", "inference"]
    assert h.results["preprocess"].output == [1.0, -2.0, 3.0] and h.results["inference"].input == [1.0, -2.0, 3.0]
    assert h.results["inference"].error is info.value
    assert h.context.request_ids == batch.request_ids
    assert [r.value for r in h.context.metrics.records if r.name == "Rows"] == [1, 3]  # the two batches' own


@pytest.mark.parametrize(("bad", "calls"), [({0}, 1 + 2), ({5}, 1 + 6), (set(range(64)), 1 + ENOUGH_FAILING)])
def test_a_batch_of_64_runs_requests_alone_only_until_it_knows(bad, calls):
    h = hk.Harness(Tally, hk.MockContext(gpu_id=None))
    h.initialize()
    Tally.inference_calls = 0
    with pytest.raises(StageError) as info:
        h.run(numbers(*(-1 if i in bad else i for i in range(64))))
    assert Tally.inference_calls == calls
    if len(bad) == 1:
        assert info.value.request_index == min(bad)
    else:
        assert info.value.request_index is None
        assert (
            f"\n  run alone, each of the first {ENOUGH_FAILING} requests fails too: no one request is at fault\n"
            in (str(info.value))
        )
        assert info.value.fix.startswith("ValueError was raised at test_attribution.py line ")


class Instances(BaseHandler):
    """TF Serving's instances (the json envelope hands them over, every request's in one list)."""

    def initialize(self, context):
        self.initialized = True

    def preprocess(self, instances):
        return [float(x) for x in instances]

    def inference(self, xs):
        if any(x < 0 for x in xs):
            raise ValueError("a negative number")
        return xs

    def postprocess(self, ys):
        return ys


def test_an_envelopes_batch_is_not_run_alone_and_the_message_says_why():
    h = hk.Harness(Instances, hk.MockContext(gpu_id=None), envelope="json")
    batch = hk.batch(hk.Request.json({"instances": [1, 2]}), hk.Request.json({"instances": [-1]}))
    with pytest.raises(StageError, match=r"^inference failed in Instances for the batch: ValueError") as info:
        h.run(batch)
    assert info.value.message.splitlines()[-1] == (
        "  the requests were not run alone to find the one at fault: the handler got a service envelope's view of "
        "the batch, not its requests"
    )


def test_an_async_stage_is_not_run_alone_and_the_message_says_why(tmp_path):
    from _async_handlers import VLLM_STYLE, prompt, write_model_dir

    with hk.Harness.open(write_model_dir(tmp_path, VLLM_STYLE)).service as service:
        h = hk.Harness(service)
        batch = hk.batch(hk.Request.from_bytes(prompt("two words")), hk.Request.from_bytes(prompt("fail")))
        with pytest.raises(StageError, match=r"^preprocess failed in TinyVLLMHandler for the batch: Assertion") as info:
            h.run(batch)  # TorchServe's vllm example takes batches of one
    assert info.value.message.splitlines()[-1] == (
        "  the requests were not run alone to find the one at fault: its preprocess is async (a coroutine), "
        "which is not run again here"
    )


# -- a truncated WAV: the payload's fault ------------------------------------------------------
def test_a_truncated_wav_alone_is_told_to_be_refused_not_corrected(tmp_path):
    path = audio_dir(tmp_path / "sounds", base="handlerkit")
    h = hk.Harness.open(path)
    line = line_of(path / "handler.py", "wave.open(")
    with pytest.raises(StageError, match=r"^preprocess failed in SpectrogramHandler for request 0: EOFError"):
        h.run(hk.batch(hk.Request.from_bytes(truncated_wav(), "audio/wav")))
    assert h.results["preprocess"].error.fix == (
        f"request 0's bytes do not decode (EOFError at handler.py line {line}): the client sent a truncated or "
        f"malformed payload. A handler cannot trust what clients send: validate it in preprocess and {REFUSE}"
    )
    good = hk.Request.from_bytes(wav_bytes(), "audio/wav")
    with pytest.raises(StageError, match=r"^preprocess failed in SpectrogramHandler for request 1: EOFError") as info:
        h.run(hk.batch(good, hk.Request.from_bytes(truncated_wav(), "audio/wav"), good))
    assert info.value.fix.startswith(f"request 1's bytes do not decode (EOFError at handler.py line {line})")


# -- handle of a single-stage handler; a streaming handler -------------------------------------
FUNCTION = """\
class Service:
    def __init__(self):
        self.batches = 0
        self.sizes = []

    def handle(self, data, context):
        self.batches += 1
        self.sizes.append(len(data))
        return [1 / row["body"]["x"] for row in data]


_service = Service()
seen = []


def handle(data, context):
    if data is None:
        return None
    seen.append(len(data))
    return _service.handle(data, context)
"""


def test_a_function_handlers_handle_is_run_alone_and_its_module_state_put_back(tmp_path):
    path = model_dir(tmp_path / "inverse", FUNCTION, "inverse")
    h = hk.Harness("handler.py:handle", hk.MockContext.from_model_dir(path, gpu_id=None))
    with pytest.raises(StageError, match=r"^handle failed in handle for request 2: ZeroDivisionError") as info:
        h.run(numbers(1, 2, 0))
    assert info.value.fix.startswith("request 2 fails alone where request 0 passes")
    assert [Path(f).name for f, _, _ in info.value.locations] == ["handler.py"]
    names = h.function.__globals__
    assert (names["seen"], names["_service"].batches, names["_service"].sizes) == ([3], 1, [3])


STREAMING = """\
from handlerkit.handlers import BaseHandler
from ts.handler_utils.utils import send_intermediate_predict_response


class Echo(BaseHandler):
    def initialize(self, context):
        self.initialized = True

    def preprocess(self, data):
        return [row.get("data") or row.get("body") for row in data]

    def inference(self, texts):
        for i, text in enumerate(texts):
            ids = {i: self.context.request_ids[i]}
            send_intermediate_predict_response({i: text[:1]}, ids, "Intermediate Prediction success", 200, self.context)
        return texts

    def postprocess(self, texts):
        if "!" in texts:
            raise ValueError("an exclamation")
        return texts
"""


@pytest.mark.torchserve
def test_a_streaming_handlers_requests_run_alone_send_nothing_to_the_batchs_clients(tmp_path):
    with hk.Service.open(model_dir(tmp_path / "echo", STREAMING, "echo")) as service:
        service.initialize()
        clients = service.context.cl_socket = ChunkSocket()  # stands for the worker's socket
        batch = hk.batch(hk.Request.text("hello"), hk.Request.text("!"), hk.Request.text("world"))
        with pytest.raises(ValueError) as info:
            service.handle(batch)
        sent = list(clients.sent)
        assert len(sent) == 3  # the batch's own chunks
        error = batch_failure(service, batch, info.value, failures.handler_files(service.handler))
        assert error.stage == "postprocess" and error.request_index == 1
        assert service.context.cl_socket is clients and clients.sent == sent


# -- a handler class defined in a notebook cell ------------------------------------------------
CELL = """\
from handlerkit.handlers import BaseHandler


class Notebook(BaseHandler):
    def initialize(self, context):
        self.initialized = True

    def preprocess(self, data):
        return [1 / row["body"]["x"] for row in data]
"""


def test_a_class_from_a_kernels_cell_file_is_told_as_a_cell_and_not_reloaded(tmp_path):
    cell = tmp_path / "ipykernel_4242" / "3576958819.py"  # as ipykernel names a cell's code
    cell.parent.mkdir()
    cell.write_text(CELL)
    namespace: dict = {"__name__": "__main__"}
    exec(compile(CELL, str(cell), "exec"), namespace)
    h = hk.Harness(namespace["Notebook"], hk.MockContext(gpu_id=None))
    with pytest.raises(StageError, match=r"^preprocess failed in Notebook for request 0: ZeroDivisionError") as info:
        h.run(numbers(0))
    assert info.value.message.splitlines()[1] == (
        '  at a notebook cell, line 9: return [1 / row["body"]["x"] for row in data]'
    )
    assert info.value.location == (str(cell), 9, 'return [1 / row["body"]["x"] for row in data]')
    assert info.value.fix == (
        "ZeroDivisionError was raised at a notebook cell, line 9; correct it there, then re-run the cell and build "
        "a new Harness from what it defines (h.reload() cannot reload a cell)"
    )
    with pytest.raises(HandlerkitError, match=r"^cannot reload Notebook: it is defined in a notebook cell") as info:
        h.reload()
    assert info.value.fix == (
        "edit and re-run the cell that defines Notebook, then build a new Harness from it: "
        "h = hk.Harness(Notebook, h.context)"
    )


IPYTHON_SESSION = """\
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

config = Config()
config.HistoryManager.hist_file = ":memory:"
shell = InteractiveShell.instance(config=config)
shell.run_cell("x = 1", store_history=True)
shell.run_cell(CELL, store_history=True)
import handlerkit as hk

h = hk.Harness(shell.user_ns["Notebook"], hk.MockContext(gpu_id=None))
try:
    h.run([{"body": {"x": 0}}])
except hk.StageError as error:
    print(error.message.splitlines()[1])
    print(error.fix)
try:
    h.reload()
except hk.HandlerkitError as error:
    print(error.message)
"""


def test_a_class_from_an_ipython_cell_is_named_as_ipython_names_the_cell(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "IPYTHONDIR": str(tmp_path / "ipython"),
    }
    script = f"CELL = {CELL!r}\n" + IPYTHON_SESSION
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        '  at Cell In[2], line 9: return [1 / row["body"]["x"] for row in data]',
        "ZeroDivisionError was raised at Cell In[2], line 9; correct it there, then re-run the cell and build a new "
        "Harness from what it defines (h.reload() cannot reload a cell)",
        "cannot reload Notebook: it is defined in a notebook cell (Cell In[2]), which only running the cell again "
        "defines anew",
    ]


def test_ipykernels_own_cell_names_are_read_from_its_shell(monkeypatch):
    # ipykernel's compiler names a cell's code as a file in its temp dir; IPython maps it back
    import IPython
    from ipykernel.compiler import XCachingCompiler

    compiler = XCachingCompiler()
    name = compiler.cache(CELL, number=7)
    assert os.path.basename(os.path.dirname(name)) == f"ipykernel_{os.getpid()}"
    assert cell_name(name) == "a notebook cell"  # no shell in this process: the count is not known
    monkeypatch.setattr(IPython, "get_ipython", lambda: type("Shell", (), {"compile": compiler})())
    assert cell_name(name) == "Cell In[7]"
    assert cell_name(__file__) is None
