"""Per-request errors shared by the built-in handlers: the error, its status, its item, its place."""

from __future__ import annotations

import pytest

import handlerkit as hk
from handlerkit.errors import RequestError
from handlerkit.handlers.request_errors import (
    STATUS_PHRASES,
    error_item,
    fail,
    payload_kind,
    put_back,
    request_error,
    set_status,
)


def test_request_error_names_the_request_and_keeps_code_and_fix():
    error = request_error(3, "the body is empty", "send text", 413)
    assert isinstance(error, RequestError)
    assert (error.request_index, error.error_code, error.fix) == (3, 413, "send text")
    assert error.reason == "request 3: the body is empty"
    assert error.detail == "the body is empty"  # the request is named by its index, as data
    assert request_error(0, "x", "y").error_code == 400


@pytest.mark.parametrize(
    "payload, kind",
    [({"a": 1}, "a JSON object"), ([1], "a JSON array"), (True, "a JSON boolean"), (3, "a JSON number"),
     (2.5, "a JSON number"), (None, "a NoneType"), (object(), "a object")],
)
def test_payload_kind(payload, kind):
    assert payload_kind(payload) == kind


def test_error_item_says_what_is_wrong_without_naming_the_request():
    item = error_item(request_error(2, "a JSON object is not text", "send a string"))
    assert item == {"code": 400, "error": "a JSON object is not text", "fix": "send a string"}
    # A RequestError made by hand: its message is the answer, as written (no text is parsed back).
    mine = RequestError("request 2: not JSON", 2, fix="send JSON")
    assert error_item(mine) == {"code": 400, "error": "request 2: not JSON", "fix": "send JSON"}
    told = RequestError("request 2: not JSON", 2, fix="send JSON", detail="not JSON")
    assert error_item(told)["error"] == "not JSON"


def _bound_context(size: int) -> hk.MockContext:
    ctx = hk.MockContext()
    hk.batch(*(hk.Request.text("x") for _ in range(size))).bind(ctx)
    return ctx


def test_fail_records_the_error_and_sets_the_status():
    ctx = _bound_context(2)
    errors: dict[int, RequestError] = {}
    big = request_error(1, "too long", "split it", 413)
    fail(errors, 1, big, ctx)
    assert errors == {1: big}
    assert ctx.get_response_status(1) == (413, STATUS_PHRASES[413])
    assert ctx.get_response_status(0) == (200, None)


@pytest.mark.parametrize(("code", "phrase"), [(400, "Bad Request"), (413, "Payload Too Large"),
                                             (422, "Unprocessable Entity"), (418, "I'm a Teapot"),
                                             (499, "Bad Request"), (599, "Internal Server Error")])
def test_each_code_gets_its_phrase_and_a_context_without_statuses_is_fine(code, phrase):
    ctx = _bound_context(1)
    set_status(ctx, 0, request_error(0, "teapot", "brew coffee", code))
    assert ctx.get_response_status(0) == (code, phrase)
    set_status(None, 0, request_error(0, "x", "y"))
    set_status(object(), 0, request_error(0, "x", "y"))  # TorchServe's test MockContext has no statuses


def test_put_back_puts_each_item_at_its_index():
    errors = {0: request_error(0, "a", "fa"), 2: request_error(2, "b", "fb")}
    out = put_back(["x", "y"], errors, 4)
    assert out == [error_item(errors[0]), "x", error_item(errors[2]), "y"]


def test_put_back_is_idempotent_and_leaves_other_values_alone():
    errors = {1: request_error(1, "a", "fa")}
    once = put_back(["x", "y"], errors, 3)
    assert put_back(once, errors, 3) is once  # already one per request
    assert put_back("not a list", errors, 3) == "not a list"
    assert put_back(["x"], errors, 3) == ["x"]  # neither one per readable request nor per request
    assert put_back(["x", "y"], {}, 2) == ["x", "y"]
    assert put_back([], {0: request_error(0, "a", "fa")}, 1) == [error_item(request_error(0, "a", "fa"))]


# ---------------------------------------------------------------------------- PerRequestErrors, on handlers
# unlike the fixtures: the audio handler of tests/_new_users.py once it validates its WAVs (on
# TorchServe's BaseHandler with the mixin, and on handlerkit's), the multi-input ranker, a tabular one.
import torch  # noqa: E402
from _new_users import (  # noqa: E402
    AUDIO_SEND,
    RANKER_HANDLER_PY,
    TRUNCATED_WAV_ERROR,
    audio_dir,
    ranker_dir,
    ranker_request,
    truncated_wav,
    wav_bytes,
)
from _tabular import tabular_dir  # noqa: E402

from handlerkit.handlers import PerRequestErrors  # noqa: E402

TRUNCATED_ITEM = {"code": 400, "error": TRUNCATED_WAV_ERROR, "fix": AUDIO_SEND}


def _wavs(*bodies: bytes) -> hk.Batch:
    return hk.batch(*(hk.Request.from_bytes(body, "audio/wav") for body in bodies))


def test_the_mixin_is_public_and_in_handlerkits_base_handler():
    assert hk.PerRequestErrors is PerRequestErrors is hk.handlers.PerRequestErrors
    assert issubclass(hk.BaseHandler, PerRequestErrors)


@pytest.mark.parametrize("base", ["torchserve", "handlerkit"])
def test_a_bad_wav_is_answered_alone_and_the_others_as_alone(tmp_path, base):
    h = hk.Harness.open(audio_dir(tmp_path / "sounds", base=base, validating=True))
    bodies = [wav_bytes(440.0), truncated_wav(), wav_bytes(None), wav_bytes(3000.0)]
    run = h.run(_wavs(*bodies))
    assert run.output[1] == TRUNCATED_ITEM and not run.problems
    assert [h.context.get_response_status(i) for i in range(4)] == [(200, None), (400, "Bad Request"), (200, None), (200, None)]
    assert [h.context.get_response_headers(i)["X-Batch-Size"] for i in range(4)] == ["4"] * 4
    assert h.handler.refused[1].reason == f"request 1: {TRUNCATED_WAV_ERROR}"
    for i in (0, 2, 3):
        assert run.output[i] == h.run(_wavs(bodies[i])).output[0]
    assert h.handler.refused == {}  # a new batch begins with no refusal


def test_torchserves_own_handle_answers_the_same_with_the_mixin(tmp_path):
    h = hk.Harness.open(audio_dir(tmp_path / "sounds", validating=True))
    assert "ts.torch_handler.base_handler" in {cls.__module__ for cls in type(h.handler).__mro__}
    batch = _wavs(wav_bytes(440.0), wav_bytes()[:1000])
    h.initialize()
    answers = h.handle(batch)  # TorchServe's BaseHandler.handle, as its worker calls it
    assert answers == h.run(batch).output and isinstance(answers[0], dict)
    assert answers[1] == {"code": 400, "fix": AUDIO_SEND,
                          "error": "the WAV has 478 samples at 8000 Hz; the model takes 8000 at 8000 Hz"}
    assert h.context.get_response_status(1) == (400, "Bad Request")


def test_raising_request_error_instead_fails_the_whole_batch(tmp_path):
    h = hk.Harness.open(audio_dir(tmp_path / "sounds", validating=True, bad_wav="raise"))
    with pytest.raises(hk.StageError, match=f"request 1: {TRUNCATED_WAV_ERROR}") as failed:
        h.run(_wavs(wav_bytes(), truncated_wav(), wav_bytes(None)))
    assert (failed.value.stage, failed.value.request_index) == ("preprocess", 1)
    assert failed.value.original.fix == AUDIO_SEND and failed.value.original.error_code == 400


def _refusing_ranker(model_dir):
    """The ranker of tests/_new_users.py behind a preprocess that refuses item ids its
    embedding lacks; the naive preprocess (and its own inference) run on the others."""
    namespace: dict = {}
    exec(RANKER_HANDLER_PY.format(base="handlerkit.handlers"), namespace)

    class RefusingRanker(namespace["RecsHandler"]):
        def preprocess(self, data):
            for index, row in enumerate(data):
                unknown = [i for i in row["body"]["item_ids"] if not 0 <= i < 40]
                if unknown:
                    self.refuse(index, f"item ids {unknown} are unknown", fix="send item ids from 0 to 39", code=422)
            kept = [row for _, row in self.accepted(data)]
            return super().preprocess(kept) if kept else None

    return hk.Harness(RefusingRanker, hk.MockContext.from_model_dir(model_dir))


def test_a_refusal_in_a_subclass_survives_its_base_preprocess_and_all_refused_skips_the_model(tmp_path):
    h = _refusing_ranker(ranker_dir(tmp_path / "recs", base="handlerkit"))
    batch = hk.batch(*(hk.Request.json(ranker_request(1, ids)) for ids in ([3, 1], [99, 2], [5, 6, 7])))
    run = h.run(batch)
    assert run.output[1] == {"code": 422, "error": "item ids [99] are unknown", "fix": "send item ids from 0 to 39"}
    assert [len(answer) for answer in (run.output[0], run.output[2])] == [2, 3]
    assert h.context.get_response_status(1) == (422, "Unprocessable Entity")

    h.handler.model = None  # calling it would fail: every request is refused, so nothing reaches it
    run = h.run(hk.batch(hk.Request.json(ranker_request(1, [40])), hk.Request.json(ranker_request(2, [-1]))))
    assert [answer["error"] for answer in run.output] == ["item ids [40] are unknown", "item ids [-1] are unknown"]
    assert list(run.stages) == ["initialize", "preprocess"]  # inference and postprocess did not run


class _Tabular(hk.BaseHandler):
    """{"features": [4 numbers]} in, the likeliest class out; a request with another body is refused."""

    def preprocess(self, data):
        for index, row in enumerate(data):
            features = row["body"].get("features") if isinstance(row["body"], dict) else None
            if not (isinstance(features, list) and len(features) == 4):
                self.refuse(index, f"no 4 features in {row['body']!r}", fix='send {"features": [4 numbers]}')
        return torch.tensor([row["body"]["features"] for _, row in self.accepted(data)], dtype=torch.float32)

    def postprocess(self, scores):
        return scores.argmax(1).tolist()


class _Confident(_Tabular):
    """Refuses, after the model, a request whose scores it does not trust (here: request 2)."""

    def postprocess(self, scores):
        answers = super().postprocess(scores)
        self.refuse(2, "the model is not sure of it", fix="send it to a human", code=409)
        return answers


@pytest.fixture
def tabular_ctx(tmp_path):
    return hk.MockContext.from_model_dir(tabular_dir(tmp_path / "tab", base="handlerkit"))


def test_a_request_refused_after_the_model_has_its_answer_replaced(tabular_ctx):
    h = hk.Harness(_Confident, tabular_ctx)
    batch = hk.batch(hk.Request.json({"features": [1, 2, 3, 4]}), hk.Request.json([1]), hk.Request.json({"features": [4, 3, 2, 1]}))
    run = h.run(batch)
    assert isinstance(run.output[0], int)
    assert run.output[1] == {"code": 400, "error": "no 4 features in [1]", "fix": 'send {"features": [4 numbers]}'}
    assert run.output[2] == {"code": 409, "error": "the model is not sure of it", "fix": "send it to a human"}
    assert [h.context.get_response_status(i)[0] for i in range(3)] == [200, 400, 409]
    assert h.handler.postprocess(run.stages["inference"].output) == run.output  # once more: the same


def test_refuse_names_what_is_wrong_with_its_arguments(tabular_ctx):
    h = hk.Harness(_Tabular, tabular_ctx)
    h.preprocess(hk.batch(hk.Request.json({"features": [1, 2, 3, 4]}), hk.Request.json({"features": [0, 0, 0, 0]})))
    with pytest.raises(ValueError, match=r"^refuse\(2, \.\.\.\): no such request in this batch of 2 \(indices 0\.\.1\)$"):
        h.handler.refuse(2, "x")
    with pytest.raises(ValueError, match=r"refuse\(-1, \.\.\.\): no such request"):
        h.handler.refuse(-1, "x")
    with pytest.raises(TypeError, match=r"index must be the request's position \(an int\), got True"):
        h.handler.refuse(True, "x")
    with pytest.raises(ValueError, match=r"refuse\(\.\.\., code=200\): a refused request's status is a 4xx"):
        h.handler.refuse(0, "x", code=200)
    assert h.handler.refused == {}
    error = h.handler.refuse(1, "all zeros", fix="send a real one", code=413)
    assert error_item(error) == {"code": 413, "error": "all zeros", "fix": "send a real one"}
    assert (error.reason, error.request_index) == ("request 1: all zeros", 1)
    assert h.handler.accepted(h.batch.data) == [(0, h.batch.data[0])]


def test_only_plain_stage_methods_are_wrapped():
    async def preprocess(self, data):
        return data

    def postprocess(data):
        return data

    # A coroutine is awaited by the handler's own handle (not wrapped: put back with put_back
    # there); a staticmethod takes no self (not wrapped either).
    Later = type("Later", (PerRequestErrors,), {"preprocess": preprocess, "postprocess": staticmethod(postprocess)})
    assert Later.__dict__["preprocess"] is preprocess and Later.__dict__["postprocess"].__func__ is postprocess
    assert Later.postprocess([1]) == [1]
