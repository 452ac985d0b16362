"""``handler.handle(data, ctx)`` called directly on a MockContext no batch was bound to.

TorchServe's handler unit tests call it so, on their test MockContext; ``hk.MockContext`` is a
drop-in there: TorchServe's handlers answer as on that mock (header reads find no header),
metrics are recorded, and handlerkit's own handlers bind the call's data themselves, so the
statuses they set per request land in ``ctx.responses()``. The Harness still reports a header
read inside ``initialize`` as the problem it is under the real server, without crashing.

TorchServe's whole handler unit-test suite, run with this MockContext swapped in:
``test_context_torchserve_unit_tests.py``.
"""

from __future__ import annotations

import pytest

import handlerkit as hk
from conftest import ts_imports
from handlerkit.errors import HandlerkitWarning
from handlerkit.handlers.image_classifier import ImageClassifier

DATA = [[1.0, 2.0], [4.0, 3.0]]


@pytest.mark.torchserve
@pytest.mark.parametrize("profile", [False, True])
def test_torchserves_base_handler_runs_on_an_unbound_context_as_on_its_test_mock(argmax_dir, profile):
    from ts.torch_handler.base_handler import BaseHandler as TsBaseHandler
    from ts.torch_handler.unit_tests.test_utils.mock_context import MockContext as TsMockContext

    answers = {}
    for ctx in (TsMockContext(model_dir=str(argmax_dir), gpu_id=None), hk.MockContext(model_dir=argmax_dir, gpu_id=None)):
        ctx.model_yaml_config = {"handler": {"profile": profile}}
        ctx.explain = True  # as TorchServe's image classifier test sets it: no request asks for an explanation
        handler = TsBaseHandler()
        with ts_imports(argmax_dir):
            handler.initialize(ctx)
        output = handler.handle(DATA, ctx)
        if isinstance(ctx, hk.MockContext):
            names = ctx.metrics.names()
            assert ctx.request_processor is None  # TorchServe's handle binds nothing; it read no header
        else:
            names = [metric.name for metric in ctx.metrics.store]
        answers[type(ctx).__module__] = output, sorted(set(names))
    stages = ["ts_handler_inference", "ts_handler_postprocess", "ts_handler_preprocess"] if profile else []
    assert answers["handlerkit.worker.context"] == answers[TsMockContext.__module__] == ([1, 0], ["HandlerTime", *stages])


@pytest.mark.torchserve
def test_torchserves_json_envelope_runs_on_an_unbound_context(argmax_dir):
    from ts.torch_handler.base_handler import BaseHandler as TsBaseHandler
    from ts.torch_handler.request_envelope.json import JSONEnvelope

    ctx = hk.MockContext(model_dir=argmax_dir, gpu_id=None)
    handler = TsBaseHandler()
    with ts_imports(argmax_dir):
        handler.initialize(ctx)
    envelope = JSONEnvelope(handler.handle)
    assert envelope.handle([{"body": {"instances": DATA}}], ctx) == ['{"predictions": [1, 0]}']
    assert ctx.metrics.names() == ["HandlerTime"]


def test_handlerkits_handlers_bind_the_call_so_their_statuses_land(cnn5_dir, png):
    ctx = hk.MockContext(model_dir=cnn5_dir, gpu_id=None)
    handler = ImageClassifier()
    handler.initialize(ctx)

    first = handler.handle([{"data": png}, {"data": b"not an image"}], ctx)
    assert set(first[0]) and first[1]["code"] == 400
    assert [r.code for r in ctx.responses()] == [200, 400] and ctx.implicit_batch
    # The next direct call brings its own batch, of another size: bound anew.
    second = handler.handle([{"data": b""}, {"data": png}, {"data": png}], ctx)
    assert second[0]["code"] == 400 and second[1] == second[2]
    # The same image in a batch of one and of two: oneDNN may pick another convolution kernel for
    # another batch size, so the scores agree to float32 rounding, not bit for bit.
    assert second[1] == pytest.approx(first[0], rel=1e-6)
    assert [r.code for r in ctx.responses()] == [400, 200, 200]

    # A batch bound as the worker binds it is the one the handler answers, statuses and all.
    batch = hk.batch(hk.Request.from_bytes(png, "image/png"), hk.Request.from_bytes(b"nope", "image/png"))
    batch.bind(ctx)
    ids = dict(ctx.request_ids)
    handler.handle(batch.data, ctx)
    assert ctx.request_ids == ids and not ctx.implicit_batch
    assert [r.code for r in ctx.responses()] == [200, 400]
    assert len(ctx.metrics.find("HandlerTime")) == 3


class ReadsAHeaderInInitialize(hk.BaseHandler):
    def initialize(self, context):
        super().initialize(context)
        self.mode = context.get_request_header(0, "mode") or "fast"


class FailsOnTheAnswer(hk.BaseHandler):
    def initialize(self, context):
        super().initialize(context)
        self.mode = context.get_request_header(0, "mode").lower()


class ReadsHeadersPerRequest(hk.BaseHandler):
    def preprocess(self, data):
        self.modes = [self.context.get_request_header(i, "mode") for i in range(len(data))]
        return super().preprocess(data)


_PROBLEM = (
    r"handlerkit: initialize: read request headers \(context\.get_request_header\(0, 'mode'\)\), but "
    r"TorchServe binds no request before initialize"
)


def test_the_harness_reports_a_header_read_in_initialize_as_a_problem(argmax_dir):
    h = hk.Harness(ReadsAHeaderInInitialize, hk.MockContext(model_dir=argmax_dir, gpu_id=None))
    with pytest.warns(HandlerkitWarning, match=_PROBLEM):
        result = h.initialize()
    assert result.ok and h.handler.mode == "fast"  # answered as for a request without the header
    [problem] = result.problems
    assert (problem.check, problem.stage) == ("header-in-initialize", "initialize")
    assert problem.fix.startswith("read request headers per request in preprocess or handle")
    assert "problem" in str(result) and "header-in-initialize" not in str(result)
    assert h.run(DATA).output == [1, 0]


def test_the_harness_reports_the_read_when_initialize_then_fails_on_its_answer(argmax_dir):
    h = hk.Harness(FailsOnTheAnswer, hk.MockContext(model_dir=argmax_dir, gpu_id=None))
    with pytest.warns(HandlerkitWarning, match=_PROBLEM), pytest.raises(hk.StageError, match="initialize"):
        h.initialize()
    assert [p.check for p in h.results["initialize"].problems] == ["header-in-initialize"]


def test_headers_read_per_request_are_no_problem(argmax_dir, recwarn):
    ctx = hk.MockContext(model_dir=argmax_dir, gpu_id=None)
    h = hk.Harness(ReadsHeadersPerRequest, ctx)
    assert h.initialize().problems == []
    run = h.run(hk.batch(hk.Request.json([1.0, 2.0], headers={"mode": "slow"}), hk.Request.json([4.0, 3.0])))
    assert run.output == [1, 0] and h.handler.modes == ["slow", None]
    assert not [w for w in recwarn if "read request headers" in str(w.message)]


@pytest.mark.torchserve
def test_under_torchserves_context_the_same_initialize_fails(argmax_dir):
    """What the problem stands for: the worker's Context, unbound at initialize, raises."""
    from ts.context import Context

    ctx = Context("m", str(argmax_dir), {"model": {"serializedFile": "model.pt", "modelFile": "model.py"}}, 1, None, "0.12.0")
    with pytest.raises(TypeError, match="'NoneType' object is not subscriptable"), ts_imports(argmax_dir):
        ReadsAHeaderInInitialize().initialize(ctx)
