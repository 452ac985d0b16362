"""VisionHandler: the error items of unreadable requests are put back among any subclass's answers,
exactly once, however many classes a call passes through."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import handlerkit as hk
from conftest import png_bytes
from handlerkit.handlers.image_classifier import ImageClassifier
from handlerkit.handlers.vision import VisionHandler

HANDLERS = Path(__file__).resolve().parents[2] / "handlerkit" / "handlers"


class Rows(ImageClassifier):
    """Written for TorchServe's VisionHandler: one answer per row of the model's output."""

    def postprocess(self, data):
        return data.argmax(1).tolist()


class PassThrough(Rows):
    """Only passes the call on to its base class."""

    def postprocess(self, data):
        return super().postprocess(data)


class PassThroughAgain(PassThrough):
    def postprocess(self, data):
        return super().postprocess(data)


class RowsMixin:
    """Not a VisionHandler: a mixin that answers one item per tensor row."""

    def postprocess(self, data):
        return data.argmax(1).tolist()


class Mixed(RowsMixin, ImageClassifier):
    pass


class PerRequest(ImageClassifier):
    """Answers one item per request itself: nothing is put back."""

    def postprocess(self, data):
        return ["mine"] * (data.shape[0] + len(self.request_errors))


def _batch(ctx):
    batch = hk.batch(hk.Request.from_bytes(png_bytes()), hk.Request.from_bytes(b"junk"),
                     hk.Request.from_bytes(png_bytes(seed=1)), hk.Request.from_bytes(b""))
    batch.bind(ctx)
    return batch


def _handle(cls, model_dir):
    ctx = hk.MockContext(model_dir=model_dir, gpu_id=None)
    handler = cls()
    handler.initialize(ctx)
    return handler.handle(_batch(ctx).data, ctx), ctx


def _check(out, ctx):
    assert len(out) == 4
    assert isinstance(out[0], int) and isinstance(out[2], int)
    assert [item["code"] for item in (out[1], out[3])] == [400, 400]
    assert out[1]["error"] == "the 4-byte body is not an image PIL can read"
    assert out[3]["error"] == "an empty body"
    assert [ctx.get_response_status(i)[0] for i in range(4)] == [200, 400, 200, 400]


@pytest.mark.parametrize("cls", [Rows, PassThrough, PassThroughAgain, Mixed], ids=lambda c: c.__name__)
def test_error_items_go_back_once_whatever_the_subclass_chain(cnn5_dir, cls):
    out, ctx = _handle(cls, cnn5_dir)
    _check(out, ctx)
    reference, _ = _handle(Rows, cnn5_dir)
    assert out == reference


@pytest.mark.parametrize("cls", [PassThrough, Mixed], ids=lambda c: c.__name__)
def test_the_harness_run_answers_as_the_handler_does(cnn5_dir, cls):
    """The harness runs the handler as a subclass of its class whose stage methods pass every
    call on: the answers and the recorded postprocess output are the handler's own."""
    ctx = hk.MockContext(model_dir=cnn5_dir, gpu_id=None)
    h = hk.Harness(cls, ctx)
    batch = hk.batch(hk.Request.from_bytes(png_bytes()), hk.Request.from_bytes(b"junk"),
                     hk.Request.from_bytes(png_bytes(seed=1)), hk.Request.from_bytes(b""))
    run = h.run(batch)
    _check(run.output, ctx)
    assert run.stages["postprocess"].output == run.output
    assert not run.problems


def test_a_subclass_answering_every_request_itself_is_left_alone(cnn5_dir):
    out, _ = _handle(PerRequest, cnn5_dir)
    assert out == ["mine"] * 4


def test_explain_handle_of_a_pass_through_subclass_puts_errors_back_once(cnn5_dir):
    class Explains(ImageClassifier):
        def get_insights(self, tensor_data, raw_input, target=0):
            return [float(row.sum()) for row in tensor_data]  # one per readable request

        def explain_handle(self, data_preprocess, raw_data):
            return self.get_insights(data_preprocess, None)

    class ExplainsPassThrough(Explains):
        def explain_handle(self, data_preprocess, raw_data):
            return super().explain_handle(data_preprocess, raw_data)

    ctx = hk.MockContext(model_dir=cnn5_dir, gpu_id=None)
    answers = []
    for cls in (Explains, ExplainsPassThrough):
        handler = cls()
        handler.initialize(ctx)
        batch = hk.batch(hk.Request.from_bytes(b"junk").with_headers(explain="True"),
                         hk.Request.from_bytes(png_bytes()))
        batch.bind(ctx)
        answers.append(handler.handle(batch.data, ctx))
    assert answers[0] == answers[1]
    assert answers[0][0]["code"] == 400 and isinstance(answers[0][1], float)


def test_errors_recorded_for_another_batch_are_not_put_back(cnn5_dir):
    ctx = hk.MockContext(model_dir=cnn5_dir, gpu_id=None)
    handler = Rows()
    handler.initialize(ctx)
    handler.handle(_batch(ctx).data, ctx)  # two errors recorded for that batch
    fresh = hk.batch(hk.Request.from_bytes(png_bytes()), hk.Request.from_bytes(png_bytes(seed=1)))
    fresh.bind(ctx)  # new request ids; no preprocess ran through the wrapper to begin the batch
    assert handler.postprocess(torch.eye(5)[:2]) == [0, 1]
    assert handler.refused == {} and handler.request_errors == {}


def test_an_empty_readable_batch_passes_inference_without_the_model(cnn5_dir):
    ctx = hk.MockContext(model_dir=cnn5_dir, gpu_id=None)
    handler = VisionHandler()
    handler.initialize(ctx)
    handler.model = None  # calling it would fail
    batch = hk.batch(hk.Request.from_bytes(b""))
    batch.bind(ctx)
    empty = handler.preprocess(batch.data)
    assert handler.inference(empty) is empty and empty.shape[0] == 0
    assert handler.postprocess(empty) == [
        {"code": 400, "error": "an empty body", "fix": "send the image as the request body or as a form field named 'data'"}
    ]


def test_the_handlers_know_nothing_of_the_harness():
    """A lower layer never recognises a higher one's mechanism (the recorder's class marker)."""
    for path in HANDLERS.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "__handlerkit_spied__" not in text and "_recorder" not in text, path.name


def test_float_lists_of_the_wrong_shape_fail_alone(cnn5_dir):
    ctx = hk.MockContext(model_dir=cnn5_dir, gpu_id=None)
    handler = Rows()
    handler.initialize(ctx)
    good = torch.zeros(3, 224, 224).tolist()
    out = handler.handle([{"body": good}, {"body": [[1.0, 2.0]]}, {"body": [[1.0], [2.0, 3.0]]}], ctx)
    assert isinstance(out[0], int)
    assert out[1]["error"] == "a list of floats of shape [1, 2]; the model input is [3, 224, 224]"
    assert out[2]["error"].startswith("the JSON list is not a rectangular array of numbers")
