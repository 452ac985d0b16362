"""The vision built-ins on the model dirs pytorch/serve's examples make answer as TorchServe 0.12's
worker does, bit for bit, on images of awkward sizes and modes (see ``_vision_examples``).

Each example's model dir is made by the real ``torch-model-archiver``; TorchServe's worker
(``ts.model_loader``) loads it with its own built-in handler, handlerkit's :class:`Service` with
ours, and both answer the same batch. The JSON answers must be equal: exactness is the default.
"""

from __future__ import annotations

import json

import pytest
import torch
from _vision_examples import awkward_images, build, ts_answers, ts_service

import handlerkit as hk

pytestmark = pytest.mark.torchserve

#: Segmenters and detectors are ResNet-101/50 sized: fewer images, still every kind of awkward.
SEGMENTER_IMAGES = (
    "landscape 1280x960 jpeg", "portrait 333x777 (vertical pass first)", "odd 257x301", "tiny 7x5", "grayscale 300x227",
)
DETECTOR_IMAGES = ("odd 257x301", "wide 1000x61", "palette 277x350")


@pytest.fixture(scope="module")
def images():
    return {image.name: image for image in awkward_images()}


def _batches(images, names=None):
    chosen = [images[name] for name in names] if names else list(images.values())
    ours = hk.batch(*(hk.Request.from_bytes(image.sent) for image in chosen))
    theirs = hk.batch(*(hk.Request.from_bytes(image.theirs) for image in chosen))
    return ours, theirs


def _json(answers):
    """Answers as the worker sends them: JSON (floats keep every bit through repr)."""
    return json.loads(json.dumps(answers))


@pytest.mark.parametrize("name", ["resnet_18", "squeezenet"])
def test_the_image_classifier_answers_as_torchserve_on_its_examples(name, tmp_path, images):
    model_dir = build(name, tmp_path)
    ours, theirs = _batches(images)
    expected = ts_answers(ts_service(model_dir, batch_size=len(theirs)), theirs)
    with hk.Service.open(model_dir) as service:
        service.initialize()
        got = service.handle(ours)
    assert len(got) == len(expected) == len(images)
    for image_name, answer, reference in zip(images, _json(got), expected, strict=True):
        assert answer == reference, image_name
    assert len(expected[0]) == 5 and all(isinstance(label, str) for label in expected[0])  # named by the map
    # The comparison can tell: torch's resize kernel (the fast_resize opt-in) moves the answers.
    config = tmp_path / "fast.yaml"
    config.write_text("handler:\n  fast_resize: true\n")
    with hk.Service.open(model_dir, config=config) as service:
        service.initialize()
        fast = _json(service.handle(ours))
    assert fast != expected and [list(a) for a in fast] == [list(a) for a in expected]  # same classes, other bits


@pytest.mark.parametrize("name", ["fcn", "deeplabv3"])
def test_the_image_segmenter_answers_as_torchserve_on_its_examples(name, tmp_path, images):
    model_dir = build(name, tmp_path)
    ours, theirs = _batches(images, SEGMENTER_IMAGES)
    expected = ts_answers(ts_service(model_dir, batch_size=len(theirs)), theirs)
    with hk.Service.open(model_dir) as service:
        service.initialize()
        got = _json(service.handle(ours))
    for image_name, answer, reference in zip(SEGMENTER_IMAGES, got, expected, strict=True):
        assert answer == reference, image_name
    pixels = torch.tensor(expected[0])  # [224, 224, (class, probability)]
    assert pixels.shape == (224, 224, 2)
    # Not a degenerate network: the classes and probabilities vary over the image.
    assert len(pixels[..., 0].unique()) > 1 and float(pixels[..., 1].std()) > 1e-3


@pytest.mark.parametrize("name", ["fast-rcnn", "maskrcnn"])
def test_the_object_detector_answers_as_torchserve_on_its_examples(name, tmp_path, images):
    """One image per batch: TorchServe's detector cannot stack images of different sizes."""
    model_dir = build(name, tmp_path)
    worker = ts_service(model_dir, batch_size=1)
    with hk.Service.open(model_dir) as service:
        service.initialize()
        for image_name in DETECTOR_IMAGES:
            ours, theirs = _batches(images, [image_name])
            expected = ts_answers(worker, theirs)
            assert _json(service.handle(ours)) == expected, image_name
            assert len(expected[0]) >= 3, image_name  # boxes to compare, not two empty lists
