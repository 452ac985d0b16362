"""handlerkit.service: a model and its handler, loaded and run as TorchServe's worker does."""

from __future__ import annotations

import json
import os
import textwrap
import warnings
from pathlib import Path

import pytest

import handlerkit as hk
from handlerkit.errors import HandlerkitError, HandlerkitWarning, HandlerLoadError
from handlerkit.service import Service

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CLASSIFIER = FIXTURES / "models" / "image_classifier"
CIRCLE = FIXTURES / "images" / "circle.png"


def write_dir(path: Path, files: dict[str, str], handler: str | None = "handler.py") -> Path:
    """A model dir with ``files`` and a manifest naming ``handler``."""
    path.mkdir(parents=True)
    for name, text in files.items():
        (path / name).write_text(textwrap.dedent(text), encoding="utf-8")
    model = {"modelName": path.name, **({"handler": handler} if handler else {})}
    (path / "MAR-INF").mkdir()
    (path / "MAR-INF" / "MANIFEST.json").write_text(json.dumps({"runtime": "python", "model": model}))
    return path


#: The pattern of pytorch/serve's examples/Huggingface_Transformers/Transformer_handler_generalized.py:
#: a file of the model dir is opened by a relative name, found because the worker runs in the
#: model dir (otherwise that handler asks the Hub, which fails offline).
RELATIVE_PATHS = """
    import os

    with open("labels.txt") as f:  # at import, as module-level code may
        LABELS = f.read().split()


    class Handler:
        def initialize(self, context):
            if not os.path.isfile("vocab.txt"):
                raise RuntimeError("no vocab.txt here: the tokenizer would be downloaded from the Hub")
            self.vocab = open("vocab.txt").read().split()

        def handle(self, data, context):
            return [{"vocab": self.vocab, "labels": LABELS, "cwd": os.getcwd()} for _ in data]
"""


@pytest.fixture
def relative_dir(tmp_path: Path) -> Path:
    return write_dir(tmp_path / "relative", {"handler.py": RELATIVE_PATHS, "vocab.txt": "a b c", "labels.txt": "x y"})


def test_open_takes_the_manifests_handler_and_answers_as_the_harness(monkeypatch):
    monkeypatch.chdir(FIXTURES.parent)  # where notebooks and README examples run
    with Service.open(CLASSIFIER) as svc:
        assert svc.spec == "image_classifier" and svc.origin == "handlerkit"
        svc.initialize()
        out = svc.handle(hk.batch(hk.Request.from_file(CIRCLE)))
    assert max(out[0], key=out[0].get) == "circle"
    h = hk.Harness("image_classifier", hk.MockContext.from_model_dir(CLASSIFIER))
    assert h.run(hk.batch(hk.Request.from_file(CIRCLE))).output == out


def test_an_archive_is_unpacked_into_a_dir_the_service_removes(tmp_path):
    from handlerkit import archive

    mar = archive.build(CLASSIFIER, tmp_path / "store")
    svc = Service.open(mar)
    unpacked = Path(svc.model_dir)
    assert unpacked.is_dir() and (unpacked / "model.pt").is_file() and tmp_path not in unpacked.parents
    svc.initialize()
    assert len(svc.handle([{"body": CIRCLE.read_bytes()}])) == 1
    svc.close()
    assert not unpacked.exists()
    with Service.open(mar) as again:
        second = Path(again.model_dir)
    assert not second.exists()


def test_a_manifest_without_a_handler_says_how_to_give_one(tmp_path):
    model_dir = write_dir(tmp_path / "nohandler", {"model.py": "X = 1\n"}, handler=None)
    with pytest.raises(HandlerLoadError, match="no handler given and the manifest of .* names none") as info:
        Service.open(model_dir)
    assert "--handler SPEC" in info.value.fix


def test_every_handler_form(tmp_path):
    model_dir = write_dir(tmp_path / "forms", {"handler.py": """
        class Echo:
            def initialize(self, context):
                self.ready = True

            def handle(self, data, context):
                return [self.ready for _ in data]
        """})
    ctx = hk.MockContext(model_dir=model_dir)
    from_spec = Service("handler.py", ctx)
    cls = type(from_spec.handler)
    calls = []

    def handle(data, context):
        calls.append(data)
        return None if data is None else ["fn"] * len(data)

    instance = cls()
    for handler, expected in ((from_spec, None), (cls, None), (instance, None)):
        svc = handler if isinstance(handler, Service) else Service(handler, ctx)
        svc.initialize()
        assert svc.handle([1, 2]) == [True, True] and not svc.is_function
    svc = Service(handle, ctx)
    svc.initialize()  # TorchServe initialises a function handler with handle(None, context)
    assert svc.is_function and calls == [None]
    assert svc.handle([{"body": "x"}]) == ["fn"] and svc.name == "test_every_handler_form.<locals>.handle"
    with pytest.raises(TypeError, match="a spec string, a class, an instance with a handle method"):
        Service(42, ctx)


def test_a_class_without_handle_is_a_load_error_with_a_fix():
    class Stages:  # the three stages, but nothing TorchServe calls
        def preprocess(self, data):
            return data

    with pytest.raises(HandlerLoadError, match=r"^class Stages has no handle method; TorchServe calls instance\.handle") as info:
        Service(Stages, hk.MockContext())
    assert info.value.fix.startswith("subclass handlerkit.BaseHandler (or TorchServe's)")


def test_a_constructor_that_needs_arguments_is_a_load_error_with_a_fix():
    class NeedsArgs:
        def __init__(self, path):
            self.path = path

        def handle(self, data, context):
            return data

    with pytest.raises(HandlerLoadError, match=r"builds the handler with NeedsArgs\(\) \(no arguments\)") as info:
        Service(NeedsArgs, hk.MockContext())
    assert "initialize(self, context)" in info.value.fix


def test_the_entry_point_is_taken_before_initialize():
    class Early:
        def __init__(self):
            self.handle = lambda data, context: ["from __init__"] * len(data)

        def initialize(self, context):
            pass

    class Late:
        def initialize(self, context):
            self.handle = lambda data, context: ["from initialize"] * len(data)

        def handle(self, data, context):
            return ["class handle"] * len(data)

    early = Service(Early, hk.MockContext())
    early.initialize()
    assert early.handle([1]) == ["from __init__"] and early.single_stage
    late = Service(Late, hk.MockContext())
    with pytest.warns(HandlerkitWarning, match="initialize sets self.handle, but TorchServe's worker takes handle before"):
        late.initialize()
    assert late.handle([1]) == ["class handle"]


def test_the_envelope_wraps_the_entry_point_once():
    def handle(data, context):
        return None if data is None else [sum(row) for row in data]

    svc = Service(handle, hk.MockContext(), envelope="json")
    assert svc.envelope is not None and svc.entry == svc.envelope.handle
    svc.initialize()  # bypasses the envelope, as the worker's initialisation call does
    out = svc.handle([{"body": {"instances": [[1, 2], [3, 4]]}}])
    assert [json.loads(item) for item in out] == [{"predictions": [3, 7]}]
    with pytest.raises(hk.HandlerkitError, match="unknown service envelope 'jsn'.*did you mean 'json'"):
        Service(handle, hk.MockContext(), envelope="jsn")


def test_the_handler_runs_in_the_model_dir_and_the_notebook_keeps_its_own(relative_dir, tmp_path, monkeypatch):
    notebook_dir = tmp_path / "notebook"
    notebook_dir.mkdir()
    monkeypatch.chdir(notebook_dir)
    svc = Service.open(relative_dir)  # the handler module read labels.txt at import
    assert os.getcwd() == str(notebook_dir)
    svc.initialize()  # found vocab.txt
    assert os.getcwd() == str(notebook_dir)
    (out,) = svc.handle([{"body": b""}])
    assert out == {"vocab": ["a", "b", "c"], "labels": ["x", "y"], "cwd": str(relative_dir.resolve())}
    assert os.getcwd() == str(notebook_dir)


def test_a_handler_that_changes_the_working_directory_is_reported_and_put_back(tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    model_dir = write_dir(tmp_path / "wanders", {"handler.py": f"""
        import os

        class Wanders:
            def initialize(self, context):
                pass

            def handle(self, data, context):
                os.chdir({str(elsewhere)!r})
                return [os.getcwd() for _ in data]
        """})
    monkeypatch.chdir(tmp_path)
    svc = Service.open(model_dir)
    svc.initialize()
    with pytest.warns(HandlerkitWarning, match=r"handle changed the working directory to .*elsewhere; TorchServe's worker"):
        assert svc.handle([1]) == [str(elsewhere)]
    assert os.getcwd() == str(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per directory
        svc.handle([1])
    assert os.getcwd() == str(tmp_path)


def test_running_blocks_nest_and_only_the_outermost_moves(relative_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    svc = Service.open(relative_dir)
    with svc.running():
        assert os.getcwd() == str(relative_dir.resolve())
        with svc.running():
            assert os.getcwd() == str(relative_dir.resolve())
        assert os.getcwd() == str(relative_dir.resolve())
    assert os.getcwd() == str(tmp_path)


def test_a_worker_process_moves_once_for_good(relative_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # put back after the test
    svc = Service.open(relative_dir, working_dir="process")
    assert os.getcwd() == str(relative_dir.resolve())  # before the handler module was imported
    svc.initialize()
    svc.handle([1])
    assert os.getcwd() == str(relative_dir.resolve())


def test_a_working_dir_of_none_leaves_the_directory_alone(relative_dir):
    with pytest.raises(HandlerLoadError, match="labels.txt"):  # module-level open() looks in the cwd
        Service.open(relative_dir, working_dir=None)
    with pytest.raises(ValueError, match="working_dir must be 'call', 'process' or None"):
        Service.open(relative_dir, working_dir="notebook")


def test_the_harness_is_built_on_a_service(relative_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    h = hk.Harness.open(relative_dir)
    assert h.service.spec == "handler.py" and h.context is h.service.context
    assert h.run([{"body": b""}]).output[0]["vocab"] == ["a", "b", "c"]
    svc = Service.open(relative_dir)
    assert hk.Harness(svc).service is svc
    with pytest.raises(ValueError, match="a Service brings its own context"):
        hk.Harness(svc, hk.MockContext())
    assert os.getcwd() == str(tmp_path)


def test_the_caller_moving_between_calls_is_where_the_next_call_returns(relative_dir, tmp_path, monkeypatch):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    svc = Service.open(relative_dir)
    svc.initialize()
    svc.handle([1])
    assert os.getcwd() == str(first)
    os.chdir(second)  # the notebook's own %cd between two calls
    assert svc.handle([1])[0]["cwd"] == str(relative_dir.resolve())
    assert os.getcwd() == str(second)


def test_the_directories_held_open_are_closed_with_the_service(relative_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = set(os.listdir("/proc/self/fd"))
    svc = Service.open(relative_dir)
    svc.initialize()
    svc.handle([1])
    held = set(os.listdir("/proc/self/fd")) - before
    assert len(held) == 2  # the model dir and the caller's, for fchdir
    svc.close()
    assert set(os.listdir("/proc/self/fd")) - before == set()


def test_a_harness_can_leave_the_working_directory_alone(relative_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(relative_dir)  # where the handler's relative paths then resolve
    h = hk.Harness("handler.py", hk.MockContext(model_dir=relative_dir), working_dir=None)
    h.initialize()
    monkeypatch.chdir(tmp_path)
    assert h.service.working_dir is None
    assert h.run([{"body": b""}]).output[0]["cwd"] == str(tmp_path)  # the handler ran where the caller is


# -- async handlers (asyncCommunication: true) ---------------------------------------------------


def _prompt_batch(text, request_id=None):
    from _async_handlers import prompt

    return hk.batch(hk.Request.from_bytes(prompt(text), request_id=request_id))


def test_an_async_handler_runs_under_harness_run_with_no_loop_and_inside_a_running_one(tmp_path):
    import asyncio

    from _async_handlers import VLLM_STYLE, reversed_words, write_model_dir

    h = hk.Harness.open(write_model_dir(tmp_path, VLLM_STYLE))
    try:
        assert h.service.asynchronous
        first = h.run(_prompt_batch("hello async world"))
        assert first.output == [{"text": reversed_words("hello async world"), "tokens": 3, "at_once": 1}]
        # initialize ran in the worker loop's thread, its engine started on the loop handle runs on
        assert h.handler.engine.loop is h.service.worker_loop.loop

        async def notebook_cell():  # a notebook's loop is running in this thread
            asyncio.get_running_loop()
            return h.run(_prompt_batch("inside a cell")).output

        assert asyncio.run(notebook_cell()) == [{"text": reversed_words("inside a cell"), "tokens": 3, "at_once": 1}]
    finally:
        h.service.close()


def test_ahandle_runs_batches_concurrently_each_with_its_own_context(tmp_path):
    import asyncio
    import copy

    from _async_handlers import VLLM_STYLE, reversed_words, write_model_dir

    with Service.open(write_model_dir(tmp_path, VLLM_STYLE)) as svc:
        svc.initialize()
        contexts = [copy.copy(svc.context) for _ in range(4)]

        async def together():
            return await asyncio.gather(
                *[svc.ahandle(_prompt_batch(f"w x y {i}", f"r{i}"), context=c) for i, c in enumerate(contexts)]
            )

        outputs = asyncio.run(together())
    assert [o[0]["text"] for o in outputs] == [reversed_words(f"w x y {i}") for i in range(4)]
    assert {o[0]["at_once"] for o in outputs} == {4}  # all four generating at once, as in the async worker
    assert [c.request_ids for c in contexts] == [{0: f"r{i}"} for i in range(4)]


def test_a_sync_handler_under_async_communication_fails_as_the_worker_does(tmp_path):
    from _async_handlers import SYNC_HANDLER, write_model_dir

    with Service.open(write_model_dir(tmp_path, SYNC_HANDLER)) as svc:
        svc.initialize()
        with pytest.raises(HandlerkitError, match="returned list, not an awaitable.*503 'Prediction failed'"):
            svc.handle(_prompt_batch("x"))
    h = hk.Harness.open(write_model_dir(tmp_path / "h", SYNC_HANDLER))
    with pytest.raises(hk.StageError, match="not an awaitable") as info:
        h.run(_prompt_batch("x"))
    assert "async def handle" in str(info.value)
    h.service.close()


def test_an_async_handler_without_async_communication_fails_as_the_worker_does(tmp_path):
    from _async_handlers import UNAWAITED, write_model_dir

    with Service.open(write_model_dir(tmp_path, UNAWAITED, asynchronous=False)) as svc:
        assert not svc.asynchronous
        svc.initialize()
        with pytest.raises(HandlerkitError, match="'Invalid model predict output'") as info:
            svc.handle(_prompt_batch("x"))
        assert "asyncCommunication: true" in info.value.fix
        import asyncio

        with pytest.raises(HandlerkitError, match="served synchronously.*nothing to await"):
            asyncio.run(svc.ahandle(_prompt_batch("x")))


def test_an_answer_never_awaited_is_named_and_an_async_initialize_warned(tmp_path):
    from _async_handlers import UNAWAITED, write_model_dir

    with Service.open(write_model_dir(tmp_path, UNAWAITED)) as svc:
        svc.initialize()
        with pytest.raises(HandlerkitError, match=r"request 0 with a coroutine \(ForgetfulHandler.generate\)"):
            svc.handle(_prompt_batch("x"))

    class AsyncInit:
        async def initialize(self, context):
            raise AssertionError("TorchServe never runs it")

        async def handle(self, data, context):
            return ["ok" for _ in data]

    svc = Service(AsyncInit, hk.MockContext(model_yaml_config={"asyncCommunication": True}))
    with pytest.warns(HandlerkitWarning, match="AsyncInit's initialize is a coroutine function"):
        svc.initialize()
    assert svc.handle(_prompt_batch("x")) == ["ok"]
    svc.close()


def test_running_keeps_one_block_per_label_and_a_block_inside_it_is_its_own(tmp_path):
    svc = Service(lambda data, context: data, hk.MockContext(model_dir=tmp_path))
    handle = svc.running("handle")
    assert svc.running("handle") is handle and svc.running() is not handle  # one per label
    with handle:
        inner = svc.running("handle")
        assert inner is not handle  # entered already: a block of its own
        with inner:
            assert os.getcwd() == os.path.realpath(tmp_path)
    assert svc.running("handle") is handle and svc.running("handle", max_age=0) is not handle


def test_bind_reads_a_batch_once_and_binds_it_to_the_context_given(tmp_path):
    svc = Service(lambda data, context: data, hk.MockContext(model_dir=tmp_path))
    other = hk.MockContext(model_dir=tmp_path)
    batch = svc.bind([{"body": b"x"}], other)
    assert svc.bind(batch) is batch  # a Batch is taken as it is
    assert other.request_ids == batch.request_ids and svc.context.request_ids == batch.request_ids
    with pytest.raises(TypeError, match="str"):
        svc.bind("not a batch")
