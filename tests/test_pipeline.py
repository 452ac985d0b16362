"""handlerkit.handlers._pipeline: ResizeCropNormalize's geometry and arithmetic (its tensors against
TorchServe's torchvision pipeline are test_image_classifier.py's)."""

from __future__ import annotations

import io

import numpy
import pytest
import torch
from PIL import Image

from handlerkit.handlers._pipeline import IMAGENET_MEAN, IMAGENET_STD, ResizeCropNormalize, _axis, pipeline_from


@pytest.mark.parametrize(
    "resize, size, expected",
    [(256, (640, 480), (341, 256)), (256, (480, 640), (256, 341)), (256, (300, 300), (256, 256)),
     ((100, 120), (640, 480), (120, 100)), (None, (33, 44), (33, 44))],
)
def test_resized_size_follows_torchvisions_rule(resize, size, expected):
    assert ResizeCropNormalize(resize=resize).resized_size(*size) == expected


def test_output_shape_is_fixed_by_the_crop_or_an_exact_resize():
    assert ResizeCropNormalize().output_shape == (3, 224, 224)
    assert ResizeCropNormalize(resize=(100, 120), crop=None).output_shape == (3, 100, 120)
    assert ResizeCropNormalize(resize=256, crop=None).output_shape is None


def test_center_crop_axis_rounds_as_torchvision_and_pads_when_larger():
    assert _axis(256, 224) == (16, 224, 0)
    assert _axis(225, 224) == (0, 224, 0)  # (225 - 224) / 2 = 0.5 rounds half to even
    assert _axis(227, 224) == (2, 224, 0)  # 1.5 rounds to 2
    assert _axis(100, 120) == (0, 100, 10)
    assert _axis(50, None) == (0, 50, 0)


def test_a_crop_larger_than_the_image_pads_with_zeros():
    image = Image.new("RGB", (4, 2), (255, 255, 255))
    pixels = ResizeCropNormalize(resize=None, crop=(4, 6), mean=None, std=None).to_uint8(image)
    assert pixels.shape == (3, 4, 6) and pixels.dtype == torch.uint8
    assert pixels[:, 1:3, 1:5].eq(255).all() and pixels[:, 0].eq(0).all() and pixels[:, :, 0].eq(0).all()


def test_normalize_is_torchserves_float32_arithmetic():
    pixels = torch.tensor([[[0, 255]], [[128, 64]], [[1, 2]]], dtype=torch.uint8)  # [3, 1, 2]
    out = ResizeCropNormalize().normalize([pixels, pixels])
    mean = torch.tensor(IMAGENET_MEAN).reshape(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).reshape(3, 1, 1)
    expected = (pixels.float() / 255 - mean) / std
    assert out.shape == (2, 3, 1, 2) and out.dtype == torch.float32
    assert torch.equal(out[0], expected) and torch.equal(out[1], expected)
    plain = ResizeCropNormalize(mean=None, std=None).normalize([pixels])
    assert torch.equal(plain[0], pixels.float() / 255)


def test_draft_decodes_a_jpeg_at_reduced_size_only_when_asked():
    buffer = io.BytesIO()
    Image.fromarray(numpy.full((960, 1280, 3), 90, dtype=numpy.uint8)).save(buffer, format="JPEG")
    for draft, decoded in ((False, (1280, 960)), (True, (640, 480))):
        image = Image.open(io.BytesIO(buffer.getvalue()))
        pipeline = ResizeCropNormalize().with_draft(draft)
        assert pipeline.prepare(image) == (1280, 960)  # the full size, for to_uint8
        image.load()
        assert image.size == decoded
        assert pipeline.to_uint8(image, (1280, 960)).shape == (3, 224, 224)


def test_with_draft_and_to_torchvision_round_trip():
    pipeline = ResizeCropNormalize(resize=(80, 90), crop=(64, 64), mean=(0.5,) * 3, std=(0.25,) * 3)
    assert pipeline.with_draft(False) is pipeline and pipeline.with_draft(True).draft
    assert pipeline_from(pipeline.to_torchvision()) == pipeline
    assert pipeline_from(pipeline) is pipeline
    assert pipeline_from(None) is None


def test_calling_it_converts_the_mode_first():
    gray = Image.new("L", (300, 300), 128)
    out = ResizeCropNormalize()(gray)
    assert out.shape == (3, 224, 224)
    assert torch.allclose(out[0], torch.full((224, 224), (128 / 255 - IMAGENET_MEAN[0]) / IMAGENET_STD[0]))
