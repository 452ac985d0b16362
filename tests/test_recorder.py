"""The stage spies and the recorder behind Harness.run: pass-through outside a run, every call
recorded inside one (several calls, other threads), the class looked up at call time."""

from __future__ import annotations

import threading

import pytest

import handlerkit as hk
from handlerkit._recorder import Spies


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


def test_spies_pass_through_outside_a_run():
    handler = Plain()
    spies = Spies.install(handler)
    assert spies.names == ["preprocess", "inference", "postprocess"]
    assert handler.handle([{"body": 2}], None) == [4]  # no recorder: the methods run as they are
    assert handler.preprocess.__name__ == "preprocess"


def test_a_second_harness_spies_on_the_methods_not_on_the_first_spies():
    handler = Plain()
    first = hk.Harness(handler, hk.MockContext(gpu_id=None))
    second = hk.Harness(handler, hk.MockContext(gpu_id=None))
    run = second.run([{"body": 3}])
    assert run.output == [6] and run.stages["inference"].calls == 1
    assert first.run([{"body": 1}]).stages["inference"].input == [1]


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
