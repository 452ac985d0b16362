"""The spied class and the recorder behind Harness.run: pass-through outside a run, every call
recorded inside one (several calls, other threads, keywords), static and class methods bound as
usual, copies and pickles of the handler's own class, reload, and the stage that raised."""

from __future__ import annotations

import threading

import pytest

import handlerkit as hk
import copy
import pickle

from handlerkit import _recorder


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
