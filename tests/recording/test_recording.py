"""handlerkit.recording: the spied class and the recorder behind Harness.run (pass-through
outside a run, every call recorded inside one: several calls, other threads, keywords; static and
class methods bound as usual; copies and pickles of the handler's own class; reload), and failure
attribution (the stage, the request, the line, the fix)."""

from __future__ import annotations

import contextlib
import copy
import os
import pickle
import threading
import warnings

import pytest
from _tabular import FEATURES, tabular_dir

import handlerkit as hk
from handlerkit.errors import HandlerkitError, RequestError, StageError
from handlerkit.recording import failures
from handlerkit.recording import spy as _recorder


class Plain:
    def initialize(self, context):
        self.initialized = True

    def preprocess(self, data):
        return [row["body"] for row in data]

    def inference(self, x):
        return [v * 2 for v in x]

    def postprocess(self, y):
        return y

    def handle(self, data, context):
        return self.postprocess(self.inference(self.preprocess(data)))


def test_the_spied_class_passes_calls_through_outside_a_run():
    handler = Plain()
    assert _recorder.spy_on(handler)
    assert type(handler) is not Plain and isinstance(handler, Plain)
    assert type(handler).__name__ == "Plain" and _recorder.own_class(handler) is Plain
    assert handler.handle([{"body": 2}], None) == [4]  # no run going on: the methods run as they are
    assert _recorder.spied_class(Plain) is type(handler)  # one subclass per class


def test_two_harnesses_on_one_instance_both_record_and_do_not_overlap():
    handler = Plain()
    first = hk.Harness(handler, hk.MockContext(gpu_id=None))
    second = hk.Harness(handler, hk.MockContext(gpu_id=None))
    run = second.run([{"body": 3}])
    assert run.output == [6] and run.stages["inference"].calls == 1
    assert first.run([{"body": 1}]).stages["inference"].input == [1]

    class Reentrant(Plain):
        def inference(self, x):
            other.run([{"body": 1}])  # a second run on the same instance while this one goes on
            return x

    inner = Reentrant()
    other = hk.Harness(inner, hk.MockContext(gpu_id=None))
    outer = hk.Harness(inner, hk.MockContext(gpu_id=None))
    with pytest.raises(hk.StageError, match="in the middle of another run") as info:
        outer.run([{"body": 1}])
    assert info.value.fix.startswith("run one batch at a time")
    assert outer.run  # and both harnesses still work afterwards
    assert hk.Harness(Plain(), hk.MockContext(gpu_id=None)).run([{"body": 1}]).output == [2]


def test_static_and_class_methods_keep_their_binding():
    class Odd:
        def initialize(self, context):
            pass

        @staticmethod
        def preprocess(data):
            return [row["body"] for row in data]

        @classmethod
        def inference(cls, x):
            return [cls.__name__ for _ in x]

        @staticmethod
        def handle(data, context):
            return ["static handle"] * len(data)

    h = hk.Harness(Odd, hk.MockContext(gpu_id=None))
    with pytest.warns(hk.HandlerkitWarning, match="never called preprocess"):  # true: it does not
        assert h.run([{"body": 1}]).output == ["static handle"]
    assert h.handler.preprocess([{"body": 5}]) == [5] and h.handler.inference([1]) == ["Odd"]
    assert h.preprocess([{"body": 5}]).output == [5] and h.inference().output == ["Odd"]


def test_keyword_calls_are_recorded_and_a_caught_stage_error_is_kept():
    class Keywords(Plain):
        def handle(self, data, context):
            try:
                self.inference(x=None)  # raises TypeError inside; handle falls back
            except TypeError:
                pass
            return self.postprocess(y=self.inference(x=self.preprocess(data=data)))

    h = hk.Harness(Keywords, hk.MockContext(gpu_id=None))
    run = h.run([{"body": 2}])
    assert run.output == [4] and list(run.stages) == ["initialize", "inference", "preprocess", "postprocess"]
    inference = run.stages["inference"]
    assert inference.calls == 2 and not inference.ok and isinstance(inference.error.original, TypeError)
    assert run.stages["preprocess"].input == [{"body": 2}]


def test_copies_and_pickles_are_of_the_handlers_own_class():
    h = hk.Harness(Plain, hk.MockContext(gpu_id=None))
    for clone in (copy.copy(h.handler), copy.deepcopy(h.handler), pickle.loads(pickle.dumps(h.handler))):
        assert type(clone) is Plain and clone.handle([{"body": 4}], None) == [8]


def test_a_handler_without_an_instance_dict_runs():
    class Slots:
        __slots__ = ("initialized",)

        def initialize(self, context):
            self.initialized = True

        def preprocess(self, data):
            return [row["body"] for row in data]

        def handle(self, data, context):
            return self.preprocess(data)

    h = hk.Harness(Slots, hk.MockContext(gpu_id=None))
    run = h.run([{"body": 1}])
    assert run.output == [1] and list(run.stages) == ["initialize", "preprocess"]
    assert h.preprocess([{"body": 2}]).output == [2]


def test_stages_called_from_other_threads_and_several_times_are_all_recorded():
    class Split(Plain):
        def handle(self, data, context):  # two micro-batches, the second on another thread
            out = {}
            worker = threading.Thread(target=lambda: out.setdefault(1, self.inference(self.preprocess(data[1:]))))
            out[0] = self.inference(self.preprocess(data[:1]))
            worker.start()
            worker.join()
            return self.postprocess(out[0] + out[1])

    h = hk.Harness(Split, hk.MockContext(gpu_id=None))
    run = h.run([{"body": 1}, {"body": 5}])
    assert run.output == [2, 10]
    inference = run.stages["inference"]
    assert inference.calls == 2 and sorted(inference.input) == [[1], [5]]
    assert run.stages["postprocess"].calls == 1 and run.stages["postprocess"].input == [2, 10]
    with pytest.raises(hk.HandlerkitError, match="inference ran 2 times") as info:
        h.postprocess()
    assert info.value.fix.startswith("pass the input")


def test_a_reloaded_class_is_what_the_spies_call(tmp_path):
    source = tmp_path / "doubler.py"
    source.write_text(
        "class Doubler:\n"
        "    def initialize(self, context): pass\n"
        "    def preprocess(self, data): return [row['body'] for row in data]\n"
        "    def handle(self, data, context): return [v * 2 for v in self.preprocess(data)]\n"
    )
    ctx = hk.MockContext(model_dir=str(tmp_path), gpu_id=None)
    h = hk.Harness("doubler.py", ctx)
    assert h.run([{"body": 2}]).output == [4]
    source.write_text(source.read_text().replace("return [row['body'] for row in data]", "return [row['body'] + 1 for row in data]"))
    h.reload()
    run = h.run([{"body": 2}])
    assert run.output == [6] and run.stages["preprocess"].output == [3]


def test_a_stage_error_from_unknown_code_names_the_handler_line(tmp_path):
    source = tmp_path / "broken.py"
    source.write_text(
        "class Broken:\n"
        "    def initialize(self, context): pass\n"
        "    def preprocess(self, data):\n"
        "        return [row['image'] for row in data]\n"
        "    def handle(self, data, context): return self.preprocess(data)\n"
    )
    h = hk.Harness("broken.py", hk.MockContext(model_dir=str(tmp_path), gpu_id=None))
    with pytest.raises(hk.StageError) as info:
        h.run([{"body": b"x"}])
    error = info.value
    assert error.stage == "preprocess" and error.request_index == 0
    assert error.location[1:] == (4, "return [row['image'] for row in data]")
    assert error.location[0].endswith("broken.py")
    assert "broken.py:4: return [row['image'] for row in data]" in str(error)
    assert h.run([{"image": 7}]).output == [7]  # the harness keeps working


# -- failure attribution -----------------------------------------------------------------
def test_a_stage_error_from_a_foreign_exception_points_at_the_raising_line(tmp_path):
    source = tmp_path / "my_handler.py"
    source.write_text("def preprocess(data):\n    return data[0]['image']\n")
    namespace: dict = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)
    try:
        namespace["preprocess"]([{"body": b""}])
    except KeyError as exc:
        error = failures.stage_error("preprocess", exc, handler="MyHandler", request_index=0, handler_files={str(source)})
    assert error.location == (str(source), 2, "return data[0]['image']")
    assert f"at {source}:2: return data[0]['image']" in error.message
    assert error.stage == "preprocess" and error.request_index == 0 and isinstance(error.original, KeyError)
    assert error.fix.startswith("a dict lacks the key the handler reads")  # no batch to tell which dict


def test_a_stage_error_without_a_known_cause_names_the_line_in_its_fix(tmp_path):
    source = tmp_path / "h.py"
    source.write_text("def inference(x):\n    raise RuntimeError('the frobnicator broke')\n")
    namespace: dict = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)
    try:
        namespace["inference"](1)
    except RuntimeError as raised:
        exc = raised
    error = failures.stage_error("inference", exc, handler="H", request_index=None, handler_files=set())
    assert "for the batch: RuntimeError: the frobnicator broke" in error.message
    assert error.fix == "RuntimeError was raised at h.py line 2; correct it there, then h.reload() and run inference again"
    served = failures.stage_error("inference", exc, handler="H", request_index=None, then="serve the model again")
    assert served.fix == "RuntimeError was raised at h.py line 2; correct it there, then serve the model again"
    loading = failures.stage_error("initialize", exc, handler="H", request_index=None)
    assert loading.message.startswith("initialize failed in H: RuntimeError")  # before any batch: about none


def test_handlerkit_errors_keep_their_own_fix_in_a_stage_error():
    try:
        raise RequestError("request 1: empty body", 1, fix="send the image as the body")
    except RequestError as exc:
        error = failures.stage_error("preprocess", exc, handler="H", request_index=1)
    assert error.fix == "send the image as the body"
    assert "preprocess failed in H for request 1: RequestError: request 1: empty body" in error.message


def test_a_handlerkit_error_in_a_stage_states_its_fix_once():
    own = HandlerkitError("the model dir does not exist", fix="point the context at the model dir")
    error = failures.stage_error("initialize", own, handler="H", request_index=None)
    assert str(error).count("point the context at the model dir") == 1
    assert error.fix == "point the context at the model dir"


def test_the_stage_is_read_off_the_traceback_for_a_server():
    class Handler(Plain):
        def inference(self, x):
            return [1 / 0 for _ in x]

    handler = Handler()
    try:
        handler.handle([{"body": 1}], None)
    except ZeroDivisionError as exc:
        assert failures.stage_of(exc, handler) == "inference"
    try:
        handler.handle(None, None)  # fails in preprocess, which the base class defines
    except TypeError as exc:
        assert failures.stage_of(exc, handler) == "preprocess"

    class Own(Plain):
        def handle(self, data, context):
            raise RuntimeError("outside the stages")

    try:
        Own().handle([], None)
    except RuntimeError as exc:
        assert failures.stage_of(exc, Own()) == "handle"
    spied = hk.Harness(Handler).handler
    try:
        spied.handle([{"body": 1}], None)
    except ZeroDivisionError as exc:
        assert failures.stage_of(exc, spied) == "inference"


def test_a_batch_error_names_the_request_that_fails_alone():
    class Picky(Plain):
        def preprocess(self, data):
            return [row["body"]["x"] for row in data]

    handler = Picky()
    batch = hk.batch(hk.Request.json({"x": 1}), hk.Request.json({"y": 2}), hk.Request.json({"x": 3}))
    ctx = hk.MockContext()
    batch.bind(ctx)
    try:
        handler.preprocess(batch.data)
    except KeyError as exc:
        caught = exc
    imports = lambda: contextlib.nullcontext()  # noqa: E731 - the model dir's imports, none here
    error = failures.batch_error("preprocess", caught, handler=handler, handler_name="Picky", batch=batch,
                                 context=ctx, imports=imports, on_batch_data=True)
    assert isinstance(error, StageError) and error.request_index == 1
    assert ctx.request_ids == batch.request_ids  # bound back to the whole batch
    alone = failures.batch_error("inference", caught, handler=handler, handler_name="Picky", batch=batch[:1],
                                 context=ctx, imports=imports)
    assert alone.request_index == 0  # the only request
    unknown = failures.batch_error("inference", caught, handler=handler, handler_name="Picky", batch=batch,
                                   context=ctx, imports=imports)
    assert unknown.request_index is None and "for the batch" in unknown.message
    own = failures.batch_error("preprocess", HandlerkitError("bad config"), handler=handler, handler_name="Picky",
                               batch=batch[:1], context=ctx, imports=imports, on_batch_data=True)
    assert own.request_index is None  # handlerkit's own errors say what they are about
    told = failures.batch_error("preprocess", RequestError("not JSON", 2), handler=handler, handler_name="Picky",
                                batch=batch, context=ctx, imports=imports, on_batch_data=True)
    assert told.request_index == 2


# -- fixes that fit the handler: a tabular handler, TorchServe's BaseHandler, a real reload ---
TABULAR_SOURCE = (
    "class Tabular:\n"
    "    def initialize(self, context): pass\n"
    "    def preprocess(self, data):\n"
    "        return [row['body']['features'] for row in data]\n"
    "    def handle(self, data, context): return self.preprocess(data)\n"
)


def test_reload_shows_the_line_that_raised_from_the_file_as_it_is_now(tmp_path):
    source = tmp_path / "tabular.py"
    source.write_text(TABULAR_SOURCE)
    h = hk.Harness("tabular.py", hk.MockContext(model_dir=str(tmp_path), gpu_id=None))
    with pytest.raises(StageError) as before:
        h.run([{"body": {"feature": [1.0]}}])
    assert before.value.location[1:] == (4, "return [row['body']['features'] for row in data]")
    stamp = os.stat(source).st_mtime_ns
    source.write_text(
        "# two lines added above the class move every line down\n\n"
        + TABULAR_SOURCE.replace("return [row['body']['features'] for row in data]",
                                 "rows = [row['body'] for row in data]\n        return [r['values'] for r in rows]")
    )
    os.utime(source, ns=(stamp, stamp))  # an edit within one clock tick: the mtime says nothing changed
    h.reload()
    with pytest.raises(StageError, match=r"at .*tabular\.py:7: return \[r\['values'\] for r in rows\]") as after:
        h.run([{"body": {"feature": [1.0]}}])
    assert after.value.location == (str(source), 7, "return [r['values'] for r in rows]")


def test_a_syntax_error_on_reload_has_its_location_and_a_fix_and_says_failed_once(tmp_path):
    source = tmp_path / "tabular.py"
    source.write_text(TABULAR_SOURCE)
    h = hk.Harness("tabular.py", hk.MockContext(model_dir=str(tmp_path), gpu_id=None))
    source.write_text(TABULAR_SOURCE.replace("def preprocess(self, data):", "def preprocess(self, data)"))
    with pytest.raises(StageError, match=r"^reload of tabular\.py failed, Tabular keeps its previous code: SyntaxError") as info:
        h.reload()
    error = info.value
    assert error.stage == "reload" and error.location == (str(source), 3, "def preprocess(self, data)")
    assert error.fix == "SyntaxError was raised at tabular.py line 3; correct it there, then h.reload() again"
    assert str(error).count("failed") == 1 and "for the batch" not in str(error)
    assert h.run([{"body": {"features": [1.0]}}]).output == [[1.0]]  # the previous code runs on


@pytest.mark.torchserve
def test_weights_that_do_not_fit_model_py_get_one_diagnosis_under_either_base_handler(tmp_path):
    errors = {}
    for base in ("torchserve", "handlerkit"):
        h = hk.Harness.open(tabular_dir(tmp_path / base, base=base, outputs=2))
        with pytest.raises(StageError, match=r"^initialize failed in TabularHandler: ") as info:
            h.initialize()
        errors[base] = info.value
    theirs, ours = errors["torchserve"], errors["handlerkit"]
    assert theirs.fix == ours.fix == "ship the model.py the weights were trained with, or re-save the weights from it"
    assert "RuntimeError: Error(s) in loading state_dict for TabNet" in theirs.message
    assert "ModelLoadError: the state_dict in" in ours.message and "does not fit TabNet" in ours.message
    assert "for the batch" not in theirs.message and "preprocess" not in theirs.fix


@pytest.mark.torchserve
def test_a_field_the_clients_json_lacks_is_told_as_the_clients_payload(tmp_path):
    h = hk.Harness.open(tabular_dir(tmp_path / "tabular"))
    good, misspelt = hk.Request.json({"features": FEATURES}), hk.Request.json({"feature": FEATURES})
    assert h.run([good]).output[0]["label"] in (0, 1, 2)
    with pytest.raises(StageError, match=r"preprocess failed in TabularHandler for request 1: KeyError: 'features'") as info:
        h.run([good, misspelt])
    assert info.value.fix == (
        "the client's payload lacks the key 'features' (did you mean 'feature'?): request 1 sent a JSON object "
        "with 'feature'. Send 'features' in the request, or validate it in preprocess and refuse that request alone "
        "(self.refuse(index, message, fix=...), see handlerkit.handlers.PerRequestErrors), so the client gets a 400 "
        "that says what to send"
    )


def test_a_parameter_the_request_lacks_is_told_as_torchserves_layout_and_a_label_lookup_as_neither(tmp_path):
    class ReadsData(Plain):
        def preprocess(self, data):
            return [row["data"]["features"] for row in data]

    h = hk.Harness(ReadsData, hk.MockContext(gpu_id=None))
    with pytest.raises(StageError, match=r"for request 0: KeyError: 'data'") as info:
        h.run([hk.Request.json({"features": FEATURES})])  # a raw JSON body arrives under 'body'
    assert info.value.fix.startswith("request 0 has no parameter 'data' (it has 'body'): TorchServe puts a raw body")

    class LooksUp(Plain):
        def preprocess(self, data):
            return [{"small": 0, "large": 1}[row["body"]["size"]] for row in data]

    h = hk.Harness(LooksUp, hk.MockContext(gpu_id=None))
    with pytest.raises(StageError, match=r"KeyError: 'medium'") as info:
        h.run([hk.Request.json({"size": "medium"})])  # the client's value, not a missing field
    assert info.value.fix.startswith("KeyError was raised at test_recording.py line ")


@pytest.mark.torchserve
def test_a_stage_replaced_on_the_instance_is_recorded_and_blamed(tmp_path):
    h = hk.Harness.open(tabular_dir(tmp_path / "tabular"))
    batch = [hk.Request.json({"features": FEATURES})] * 2
    h.handler.postprocess = lambda scores: [1]  # a test's stub: one answer for two requests
    with pytest.warns(hk.HandlerkitWarning, match=r"postprocess: must return one item per request: got 1 item"):
        run = h.run(batch)
    assert list(run.stages) == ["initialize", "preprocess", "inference", "postprocess"]
    assert run.stages["postprocess"].output == [1] and tuple(run.stages["postprocess"].input.shape) == (2, 3)
    assert [p.stage for p in run.problems] == ["postprocess"] and run.stages["inference"].problems == []
    assert h.handler.postprocess(None) == [1]  # the instance keeps its stub after the run

    h.handler.postprocess = lambda scores: [1 / 0]
    with pytest.raises(StageError, match=r"^postprocess failed in TabularHandler for the batch: ZeroDivisionError"):
        h.run(batch)
    del h.handler.postprocess
    h.handler.preprocess = h.handler.preprocess  # the harness's own recording method, kept on the instance
    run = h.run(batch)
    assert run.stages["preprocess"].calls == 1 and len(run.output) == 2  # recorded once, not twice


def test_stage_methods_kept_by_init_before_the_harness_saw_the_handler_are_recorded():
    class Kept(Plain):
        def __init__(self):
            self.stages = (self.preprocess, self.inference, self.postprocess)  # taken before any harness
            self.first = self.preprocess

        def handle(self, data, context):
            pre, infer, post = self.stages
            return post(infer(pre(data)))

    handler = Kept()
    h = hk.Harness(handler, hk.MockContext(gpu_id=None))
    with warnings.catch_warnings():
        warnings.simplefilter("error", hk.HandlerkitWarning)  # no "never called preprocess ..."
        run = h.run([{"body": 2}, {"body": 3}])
    assert run.output == [4, 6] and list(run.stages) == ["initialize", "preprocess", "inference", "postprocess"]
    assert run.stages["inference"].input == [2, 3]
    assert handler.first([{"body": 1}]) == [1]  # still the handler's own preprocess, now recorded in runs


def _run_within(h, batch, seconds: float = 30.0):
    """``h.run(batch)``, failing rather than hanging: a MicroBatching waits forever for the answer
    of a stage thread that died (as one calling a method of a class it no longer belongs to)."""
    box: dict = {}

    def run() -> None:
        try:
            box["run"] = h.run(batch)
        except BaseException as exc:  # handed to the test's thread
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert box, f"no answer within {seconds} s: a MicroBatching thread died"
    if "error" in box:
        raise box["error"]
    return box["run"]


def _stop(batching) -> None:
    """Stop a MicroBatching's threads (each polls its queue every 0.5 s): all told, then joined."""
    workers = [w for group in batching.thread_groups.values() for w in group]
    for worker in workers:
        worker.event.set()
    for worker in workers:
        worker.thread.join()


@pytest.mark.torchserve
def test_a_micro_batching_built_before_the_harness_saw_the_handler_still_gives_each_stage(tmp_path):
    from ts.handler_utils.micro_batching import MicroBatching

    model_dir = tabular_dir(tmp_path / "tabular")
    handler_class = hk.Harness.open(model_dir).handler.__class__.__mro__[1]  # handler.py's TabularHandler

    class MicroBatched(handler_class):
        def __init__(self):
            super().__init__()
            self.handle = MicroBatching(self, micro_batch_size=1)  # takes the stage methods now

    handler = MicroBatched()
    try:
        h = hk.Harness(handler, hk.MockContext.from_model_dir(model_dir))
        with warnings.catch_warnings():
            warnings.simplefilter("error", hk.HandlerkitWarning)  # no "never called preprocess ..."
            run = _run_within(h, [hk.Request.json({"features": FEATURES})] * 2)
        assert {s: run.stages[s].calls for s in ("preprocess", "inference", "postprocess")} == {
            "preprocess": 2, "inference": 2, "postprocess": 2,
        }
        assert len(run.output) == 2 and "handle" not in run.stages
    finally:
        _stop(handler.handle)


@pytest.mark.torchserve
def test_a_reloaded_handler_whose_init_builds_a_micro_batching_runs_the_new_code(tmp_path):
    model_dir = tabular_dir(tmp_path / "tabular")
    handler_py = model_dir / "handler.py"
    handler_py.write_text(
        handler_py.read_text().replace("from ts.torch_handler.base_handler import BaseHandler", "from ts.torch_handler.base_handler import BaseHandler\nfrom ts.handler_utils.micro_batching import MicroBatching")
        .replace("class TabularHandler(BaseHandler):\n", "class TabularHandler(BaseHandler):\n    def __init__(self):\n        super().__init__()\n        self.handle = MicroBatching(self)\n\n")
    )
    h = hk.Harness.open(model_dir)
    try:
        batch = [hk.Request.json({"features": FEATURES})]
        assert set(_run_within(h, batch).output[0]) == {"label", "probability"}
        handler_py.write_text(handler_py.read_text().replace('"probability": float(p)', '"score": float(p)'))
        h.reload()
        run = _run_within(h, batch)
        assert set(run.output[0]) == {"label", "score"} and run.stages["postprocess"].calls == 1
    finally:
        _stop(h.handler.handle)
