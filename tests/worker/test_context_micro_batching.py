"""TorchServe 0.12's MicroBatching, driven as TorchServe's own unit test drives it, on ``hk.MockContext``.

pytorch/serve's ``ts/tests/unit_tests/test_micro_batching.py`` is not installed with torchserve,
so its behaviours are tested here, in tests of our own: TorchServe's ImageClassifier whose
``handle`` is replaced by a ``ts.handler_utils.MicroBatching`` (micro-batches of 1 and of 8,
parallelism read from the model config), called directly on a MockContext no batch was bound
to, answers a mixed batch of kittens and dogs request by request, still answers when the test
sets ``ctx.explain``, and runs as many threads per stage as its parallelism says, up and down.
The weights are the stand-in ResNet-18 of ``_ts_standins.py``, fitted to tell the two apart.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import _ts_standins
import pytest

import handlerkit as hk
from conftest import ts_imports

pytestmark = pytest.mark.torchserve

PARALLELISM = {"preprocess": 1, "inference": 2, "postprocess": 3}
KITTEN, DOG = "tiger_cat", "golden_retriever"


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _ts_standins.build_classifier(tmp_path_factory.mktemp("pytorch_serve"))


@pytest.fixture(scope="module")
def images(checkout: Path) -> dict[str, bytes]:
    folder = checkout / _ts_standins.BATCH_IMAGES
    return {KITTEN: (folder / "kitten.jpg").read_bytes(), DOG: (folder / "dog.jpg").read_bytes()}


@pytest.fixture(scope="module")
def model_dir(checkout: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model dir TorchServe's test makes: the example's model.py as image_classifier.py."""
    folder = tmp_path_factory.mktemp("image_classifier_model_dir")
    shutil.copyfile(_ts_standins.weights_for(checkout, _ts_standins.RESNET18_URL), folder / "model.pt")
    shutil.copyfile(checkout / _ts_standins.CLASSIFIER_DIR / "model.py", folder / "image_classifier.py")
    shutil.copyfile(checkout / _ts_standins.CLASSIFIER_DIR / "index_to_name.json", folder / "index_to_name.json")
    return folder


@pytest.fixture(scope="module")
def context(model_dir: Path) -> hk.MockContext:
    ctx = hk.MockContext(model_name="mnist", model_dir=str(model_dir), model_file="image_classifier.py")
    ctx.model_yaml_config = {"mb_size": 2, "mb_parallelism": dict(PARALLELISM)}
    return ctx


@pytest.fixture(scope="module", params=[1, 8], ids=["micro-batch-1", "micro-batch-8"])
def handler(context: hk.MockContext, model_dir: Path, request: pytest.FixtureRequest) -> Iterator[object]:
    from ts.handler_utils.micro_batching import MicroBatching  # the 0.12.0 wheel's package exports nothing
    from ts.torch_handler.image_classifier import ImageClassifier

    handler = ImageClassifier()
    micro_batching = MicroBatching(handler, micro_batch_size=request.param)
    with ts_imports(model_dir):
        handler.initialize(context)
    handler.handle = micro_batching
    micro_batching.parallelism = context.model_yaml_config["mb_parallelism"]
    yield handler
    micro_batching.shutdown()


def _threads(handler: object) -> dict[str, int]:
    return {stage: len(threads) for stage, threads in handler.handle.thread_groups.items()}  # type: ignore[attr-defined]


@pytest.mark.parametrize("labels", [[DOG], [KITTEN, DOG, DOG, KITTEN, KITTEN, KITTEN, DOG, KITTEN] * 2], ids=["1", "16"])
def test_a_mixed_batch_is_answered_request_by_request(handler, context, images, labels):
    before = len(context.metrics.find("HandlerTime"))
    results = handler.handle([{"data": images[label]} for label in labels], context)
    assert len(results) == len(labels)
    for label, result in zip(labels, results):
        other = DOG if label == KITTEN else KITTEN
        assert max(result, key=result.get) == label and other not in result
    assert len(context.metrics.find("HandlerTime")) == before + 1  # recorded, on a context nobody bound
    assert context.request_processor is None  # MicroBatching's handle binds nothing: it read no header


def test_the_explain_flag_of_the_test_leaves_requests_answered(handler, context, images):
    context.explain = True
    try:
        results = handler.handle([{"data": images[KITTEN], "target": 0}] * 2, context)
    finally:
        context.explain = False
    assert len(results) == 2 and all(max(r, key=r.get) == KITTEN for r in results)  # answers, not attributions


def test_each_stage_runs_the_threads_its_parallelism_asks_for(handler):
    assert _threads(handler) == PARALLELISM


def test_threads_spin_up_and_down_with_the_parallelism(handler):
    more = {"preprocess": 2, "inference": 3, "postprocess": 4}
    handler.handle.parallelism = more
    assert _threads(handler) == more
    handler.handle.parallelism = PARALLELISM
    assert _threads(handler) == PARALLELISM
