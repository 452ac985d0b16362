"""TorchServe 0.12 compatibility, both ways, against TorchServe's own code (test-only dependency).

- TorchServe's BaseHandler unit tests run on handlerkit's handler and context.
- TorchServe's handlers run on handlerkit's MockContext and agree with handlerkit's handlers.
- A handlerkit handler served by TorchServe's ``ts.model_loader`` + ``ts.service.Service``
  in-process answers exactly what ``handler.handle`` answers in a notebook.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import handlerkit as hk
from conftest import (
    ARGMAX_MODEL_PY,
    cnn_dir,
    decode_predict_response,
    format_context,
    png_bytes,
    ts_imports,
    ts_metrics_cache,
    write_model_dir,
)
from handlerkit.handlers.base import BaseHandler
from handlerkit.handlers.image_classifier import ImageClassifier

pytestmark = pytest.mark.torchserve
ts = pytest.importorskip("ts")

FIXTURE_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "models" / "image_classifier"
FIXTURE_IMAGES = Path(__file__).resolve().parents[2] / "fixtures" / "images"


# ---------------------------------------------------------------------------------------------
# TorchServe's own BaseHandler unit tests, with handlerkit's classes
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def ts_base_model_dir(tmp_path: Path) -> Path:
    """TorchServe's conftest ``base_model_dir``: its base_model.py as model.py, saved by its code."""
    from ts.torch_handler.unit_tests.models import base_model

    model_dir = tmp_path / "base_model_dir"
    model_dir.mkdir()
    shutil.copyfile(base_model.__file__, model_dir / "model.py")
    base_model.save_pt_file((model_dir / "model.pt").as_posix())
    return model_dir


@pytest.mark.parametrize("context_kind", ["handlerkit", "torchserve"])
def test_torchserve_base_handler_unit_tests_pass_with_handlerkit(ts_base_model_dir, monkeypatch, context_kind):
    from ts.torch_handler.unit_tests import test_base_handler as ts_tests
    from ts.torch_handler.unit_tests.test_utils.mock_context import MockContext as TsMockContext

    context_class = hk.MockContext if context_kind == "handlerkit" else TsMockContext
    context = context_class(model_name="mnist", model_dir=ts_base_model_dir.as_posix(), model_file="model.py")
    handler = BaseHandler()
    handler.initialize(context)
    ts_tests.test_single_handle(handler, context)
    ts_tests.test_batch_handle(handler, context)
    # This one sets ENABLE_TORCH_PROFILER=1 in os.environ and does not clean up: let monkeypatch.
    monkeypatch.setenv("ENABLE_TORCH_PROFILER", "")
    ts_tests.test_inference_with_profiler_works_with_custom_initialize_method(handler, context)
    names = [m.name for m in context.metrics.store] if context_kind == "torchserve" else context.metrics.names()
    assert "HandlerTime" in names


@pytest.mark.parametrize("profile", [None, False, True])
def test_same_metrics_as_torchserve_base_handler(argmax_dir, profile):
    from ts.torch_handler.base_handler import BaseHandler as TsBaseHandler

    config = {} if profile is None else {"handler": {"profile": profile}}
    recorded = {}
    for name, handler in (("torchserve", TsBaseHandler()), ("handlerkit", BaseHandler())):
        ctx = hk.MockContext(model_dir=argmax_dir, gpu_id=None, model_yaml_config=config)
        with ts_imports(argmax_dir):
            handler.initialize(ctx)
        data = [[1.0, 2.0], [4.0, 3.0]]
        hk.Batch.coerce(data).bind(ctx)  # as the worker does before handle
        assert handler.handle(data, ctx) == [1, 0]
        recorded[name] = [(r.name, r.unit, r.metric_type) for r in ctx.metrics]
    assert recorded["handlerkit"] == recorded["torchserve"]
    stage_metrics = {"ts_handler_preprocess", "ts_handler_inference", "ts_handler_postprocess"}
    names = {name for name, _, _ in recorded["handlerkit"]}
    assert ("HandlerTime" in names) and (stage_metrics <= names) is bool(profile)


def test_torchserve_default_inference_cannot_run_onnx_but_handlerkit_can(fast_format_dirs):
    from ts.torch_handler.base_handler import BaseHandler as TsBaseHandler

    ctx = format_context("onnx", fast_format_dirs["onnx"])
    ts_handler = TsBaseHandler()
    ts_handler.initialize(ctx)
    hk.Batch.coerce([[1.0, 2.0, 3.0, 4.0]]).bind(ctx)  # as the worker does before handle
    with pytest.raises(TypeError, match="not callable"):
        ts_handler.handle([[1.0, 2.0, 3.0, 4.0]], ctx)
    handler = BaseHandler()
    handler.initialize(ctx)
    assert len(handler.handle([[1.0, 2.0, 3.0, 4.0]], ctx)[0]) == 3


@pytest.mark.slow
def test_aoti_so_runs_like_torchserve(aoti_format_dirs):
    from ts.torch_handler.base_handler import BaseHandler as TsBaseHandler

    ctx = format_context("aoti-so", aoti_format_dirs["aoti-so"])
    ts_handler, handler = TsBaseHandler(), BaseHandler()
    ts_handler.initialize(ctx)
    handler.initialize(ctx)
    x = torch.randn(3, 4).tolist()
    hk.Batch.coerce(x).bind(ctx)  # as the worker does before handle
    torch.testing.assert_close(torch.tensor(handler.handle(x, ctx)), torch.tensor(ts_handler.handle(x, ctx)), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# TorchServe's ImageClassifier on handlerkit's MockContext, against handlerkit's ImageClassifier
# ---------------------------------------------------------------------------------------------


def _compare_image_classifiers(model_dir: Path, images: list[bytes]) -> list[dict[str, float]]:
    from ts.torch_handler.image_classifier import ImageClassifier as TsImageClassifier

    outputs = {}
    for name, handler in (("torchserve", TsImageClassifier()), ("handlerkit", ImageClassifier())):
        ctx = hk.MockContext(model_dir=model_dir, gpu_id=None)  # TorchServe's test signature defaults
        batch = hk.batch(*(hk.Request.from_bytes(image) for image in images))
        batch.bind(ctx)
        data = batch.data
        assert all(isinstance(row["body"], bytearray) for row in data)
        with ts_imports(model_dir):
            handler.initialize(ctx)
            outputs[name] = handler.handle(data, ctx)
    ts_out, hk_out = outputs["torchserve"], outputs["handlerkit"]
    assert len(ts_out) == len(hk_out) == len(images)
    for ts_row, hk_row in zip(ts_out, hk_out):
        assert list(ts_row) == list(hk_row)  # same labels, same order
        assert list(hk_row.values()) == pytest.approx(list(ts_row.values()), abs=1e-6)
    return hk_out


def test_torchserve_image_classifier_agrees_with_handlerkit(tmp_path):
    model_dir = cnn_dir(tmp_path / "cnn7", 7)
    out = _compare_image_classifiers(model_dir, [png_bytes(seed=0), png_bytes(80, 60, seed=1)])
    assert all(len(row) == 5 for row in out)  # TorchServe's topk


def test_torchserve_image_classifier_needs_five_classes_handlerkit_does_not(tmp_path):
    from ts.torch_handler.image_classifier import ImageClassifier as TsImageClassifier

    model_dir = cnn_dir(tmp_path / "cnn3", 3)
    ctx = hk.MockContext(model_dir=model_dir, gpu_id=None)
    batch = hk.batch(hk.Request.from_bytes(png_bytes()))
    batch.bind(ctx)
    ts_handler = TsImageClassifier()
    with ts_imports(model_dir):
        ts_handler.initialize(ctx)
    with pytest.raises(RuntimeError, match="out of range"):
        ts_handler.handle(batch.data, ctx)
    handler = ImageClassifier()
    handler.initialize(ctx)
    assert len(handler.handle(batch.data, ctx)[0]) == 3


def test_torchserve_image_classifier_agrees_on_the_fixture_model():
    if not (FIXTURE_DIR / "model.pt").is_file():
        pytest.skip("fixtures/models/image_classifier is not built (python -m fixtures.builder)")
    images = [p.read_bytes() for p in sorted(FIXTURE_IMAGES.glob("*.png"))][:4]
    assert images, f"no PNG in {FIXTURE_IMAGES}"
    _compare_image_classifiers(FIXTURE_DIR, images)


# ---------------------------------------------------------------------------------------------
# A handlerkit handler served by TorchServe's own model loader and Service, in-process
# ---------------------------------------------------------------------------------------------

SERVED_CLASSIFIER = '''\
from handlerkit.handlers.image_classifier import ImageClassifier


class ServedClassifier(ImageClassifier):
    """A handlerkit handler as a user archives it in a .mar."""
'''

SERVED_BASE = '''\
from handlerkit.handlers.base import BaseHandler


class ServedArgmax(BaseHandler):
    pass
'''

RAISES_REQUEST_ERROR = '''\
from handlerkit.errors import RequestError
from handlerkit.handlers.base import BaseHandler


class Refuses(BaseHandler):
    def preprocess(self, data):
        raise RequestError("request 0: no numbers here", request_index=0, fix="send a JSON list of numbers")
'''

RAISES_PREDICTION_EXCEPTION = '''\
from handlerkit.errors import PredictionException
from handlerkit.handlers.base import BaseHandler


class Teapot(BaseHandler):
    def preprocess(self, data):
        raise PredictionException("I am a teapot", 418)
'''


def _archive_dir(model_dir: Path, handler_source: str, config: str | None = None) -> Path:
    (model_dir / "served_handler.py").write_text(handler_source)
    model = {
        "modelName": "served",
        "serializedFile": "model.pt",
        "modelFile": "model.py",
        "handler": "served_handler.py",
        "modelVersion": "1.0",
    }
    if config is not None:
        (model_dir / "model-config.yaml").write_text(config)
        model["configFile"] = "model-config.yaml"
    write_model_dir(model_dir, None, manifest={"createdOn": "today", "runtime": "python", "model": model, "archiverVersion": "0.12.0"})
    return model_dir


def _serve(model_dir: Path, batch: hk.Batch, batch_size: int) -> tuple[int, str, list]:
    """TorchServe's worker path: model_loader.load (handler resolution + initialize), Service.predict."""
    from ts.model_loader import TsModelLoader

    cache = ts_metrics_cache("served")
    with ts_imports(model_dir):
        service = TsModelLoader().load(
            "served", str(model_dir), handler="served_handler.py", gpu_id=None, batch_size=batch_size, metrics_cache=cache
        )
        service.set_cl_socket(None)
        response = service.predict(batch.to_worker_message())
    assert type(service.context).__module__ == "ts.context"
    return decode_predict_response(response)


def _direct(model_dir: Path, handler: BaseHandler, batch: hk.Batch) -> list:
    ctx = hk.MockContext.from_model_dir(model_dir)
    handler.initialize(ctx)
    batch.bind(ctx)
    return handler.handle(batch.data, ctx)


def test_served_image_classifier_answers_like_handle(tmp_path):
    model_dir = _archive_dir(cnn_dir(tmp_path / "served", 5), SERVED_CLASSIFIER, "batchSize: 2\nhandler:\n  topk: 3\n")
    batch = hk.batch(
        hk.Request.from_bytes(png_bytes(seed=0), "image/png"),
        hk.Request.form({"data": (png_bytes(80, 60, seed=3), "image/png")}),
    )
    code, message, responses = _serve(model_dir, batch, batch_size=2)
    expected = _direct(model_dir, ImageClassifier(), batch)

    assert (code, message) == (200, "Prediction success")
    assert [r.request_id for r in responses] == list(batch.request_ids.values())
    assert [r.code for r in responses] == [200, 200]
    served = [r.json() for r in responses]
    assert all(len(row) == 3 for row in served)  # the config reached the served handler
    for got, want in zip(served, expected):
        assert list(got) == list(want)
        assert list(got.values()) == pytest.approx(list(want.values()), abs=1e-7)


def test_served_base_handler_answers_like_handle(tmp_path):
    model_dir = _archive_dir(write_model_dir(tmp_path / "argmax", ARGMAX_MODEL_PY), SERVED_BASE)
    batch = hk.batch(hk.Request.json([1.0, 2.0]), hk.Request.json([4.0, 3.0]))
    code, _, responses = _serve(model_dir, batch, batch_size=2)
    assert code == 200
    assert [r.json() for r in responses] == _direct(model_dir, BaseHandler(), batch) == [1, 0]
    assert [r.body for r in responses] == [b"1", b"0"]  # json.dumps(1, indent=2)


def test_served_bad_request_gets_its_own_400_and_the_others_their_answers(tmp_path):
    # The built-in vision handlers isolate a bad request: the worker answers the batch 200, the
    # bad request 400 with its error item (code, error, fix) as JSON, the others their answers.
    model_dir = _archive_dir(cnn_dir(tmp_path / "served", 5), SERVED_CLASSIFIER)
    batch = hk.batch(hk.Request.from_bytes(png_bytes(), "image/png"), hk.Request.from_bytes(b"not an image"))
    code, _message, responses = _serve(model_dir, batch, batch_size=2)
    assert code == 200
    assert [r.code for r in responses] == [200, 400]
    answer, error = (json.loads(r.body) for r in responses)
    assert len(answer) == 5 and abs(sum(answer.values()) - 1) < 1e-3
    assert error["code"] == 400 and error["error"] == "the 12-byte body is not an image PIL can read" and error["fix"]
    assert _direct(model_dir, ImageClassifier(), batch) == [answer, error]


def test_served_request_error_fails_the_batch_with_its_400(tmp_path):
    # A RequestError a handler raises is a PredictionException(code 400): the worker answers
    # the whole batch with it and its message, instead of a bare 503 "Prediction failed".
    model_dir = _archive_dir(write_model_dir(tmp_path / "refuses", ARGMAX_MODEL_PY), RAISES_REQUEST_ERROR)
    code, message, responses = _serve(model_dir, hk.batch(hk.Request.json([1.0, 2.0])), batch_size=1)
    assert code == 400 and message.startswith("request 0: no numbers")
    assert [(r.code, r.body) for r in responses] == [(400, b"error")]


def test_served_prediction_exception_keeps_its_code(tmp_path):
    # handlerkit's PredictionException derives from TorchServe's when torchserve is installed
    from ts.utils.util import PredictionException as TorchServePredictionException

    assert issubclass(hk.PredictionException, TorchServePredictionException)
    model_dir = _archive_dir(write_model_dir(tmp_path / "argmax", ARGMAX_MODEL_PY), RAISES_PREDICTION_EXCEPTION)
    code, message, _ = _serve(model_dir, hk.batch(hk.Request.json([1.0, 2.0])), batch_size=1)
    assert (code, message) == (418, "I am a teapot")


def test_decode_predict_response_reads_torchserve_encoding():
    from ts.protocol.otf_message_handler import create_predict_response

    ctx = hk.MockContext(gpu_id=None)
    hk.batch(hk.Request.json(1), hk.Request.json(2)).bind(ctx)
    ctx.set_response_status(201, "made", 1)
    ctx.set_response_content_type(1, "application/json")
    ids = dict(ctx.request_ids)
    raw = create_predict_response(["text", {"a": 1}], ids, "ok", 200, context=ctx)
    code, message, responses = decode_predict_response(raw)
    assert (code, message) == (200, "ok")
    assert [(r.request_id, r.code, r.phrase, r.content_type, r.body) for r in responses] == [
        (ids[0], 200, "", "", b"text"),
        (ids[1], 201, "made", "application/json", json.dumps({"a": 1}, indent=2).encode()),
    ]
    assert responses[1].headers == {"content-type": "application/json"}
