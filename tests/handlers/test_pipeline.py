"""handlerkit.handlers._pipeline: ResizeCropNormalize's geometry and arithmetic (its tensors against
TorchServe's torchvision pipeline are test_image_classifier.py's)."""

from __future__ import annotations

import io

import numpy
import pytest
import torch
from PIL import Image

from handlerkit.handlers._pipeline import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ResizeCropNormalize,
    _axis,
    _box_axis,
    _vertical_first,
    pipeline_from,
    resize_crop,
)


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
        pipeline = ResizeCropNormalize().with_options(draft=draft)
        assert pipeline.prepare(image) == (1280, 960)  # the full size, for to_uint8
        image.load()
        assert image.size == decoded
        assert pipeline.to_uint8(image, (1280, 960)).shape == (3, 224, 224)


def test_with_options_and_to_torchvision_round_trip():
    pipeline = ResizeCropNormalize(resize=(80, 90), crop=(64, 64), mean=(0.5,) * 3, std=(0.25,) * 3)
    assert pipeline.with_options(draft=False, fast_resize=False) is pipeline
    assert pipeline.with_options(draft=True).draft and not pipeline.with_options(draft=True).fast_resize
    assert pipeline.with_options(fast_resize=True).fast_resize
    assert pipeline_from(pipeline.to_torchvision()) == pipeline
    assert pipeline_from(pipeline) is pipeline
    assert pipeline_from(None) is None


def test_calling_it_converts_the_mode_first():
    gray = Image.new("L", (300, 300), 128)
    out = ResizeCropNormalize()(gray)
    assert out.shape == (3, 224, 224)
    assert torch.allclose(out[0], torch.full((224, 224), (128 / 255 - IMAGENET_MEAN[0]) / IMAGENET_STD[0]))


def _photo(width, height, seed):
    """Noise over a gradient: a resize rounds many of its pixels differently on any slip."""
    rng = numpy.random.default_rng(seed)
    y, x = numpy.mgrid[0:height, 0:width]
    pixels = numpy.stack([x * 255 / max(width, 1), y * 255 / max(height, 1), (x * y) % 256], axis=-1)
    return Image.fromarray(numpy.clip(pixels + rng.normal(0, 20, pixels.shape), 0, 255).astype(numpy.uint8))


@pytest.mark.parametrize(
    "size",
    [(1280, 960), (960, 1280), (333, 777), (260, 1000), (2001, 1499), (257, 301), (1000, 61), (7, 5), (150, 200),
     (300, 256), (5000, 300), (300, 40000), (641, 479), (1023, 767)],
)
def test_resize_crop_is_pils_whole_resize_then_crop_bit_for_bit(size):
    image = _photo(*size, seed=size[0] * 7 + size[1])
    pipeline = ResizeCropNormalize()
    rw, rh = pipeline.resized_size(*size)
    (x0, xn, _), (y0, yn, _) = _axis(rw, 224), _axis(rh, 224)
    region = (x0, y0, x0 + xn, y0 + yn)
    expected = image.resize((rw, rh), Image.Resampling.BILINEAR).crop(region)
    assert numpy.array_equal(numpy.asarray(resize_crop(image, (rw, rh), region)), numpy.asarray(expected))


def test_the_box_is_used_only_where_pils_coefficients_come_out_the_same():
    assert _box_axis(960, 256, 16, 224) == (60.0, 900.0)  # scale 3.75: every centre exact
    assert _box_axis(1280, 341, 58, 224) is None  # 1280/341 is no short binary fraction
    assert _box_axis(960, 256, 0, 256) is None and _box_axis(256, 256, 16, 224) is None  # nothing to gain
    # PIL 13 goes vertically first when the height shrinks by more than twice the width: a box
    # that changes that decision would change the rounding, so it is not used then.
    assert _vertical_first((333, 777), (256, 597)) and not _vertical_first((333, 777), (224, 597))
    assert not _vertical_first((1280, 960), (341, 256)) and not _vertical_first((10, 10), (20, 20))


def test_resize_crop_without_the_order_check_would_differ(monkeypatch):
    """The test above can fail: a box that flips PIL 13's order of passes changes pixels."""
    import handlerkit.handlers._pipeline as module

    image = _photo(333, 777, seed=3)
    rw, rh = ResizeCropNormalize().resized_size(333, 777)
    region = (16, 186, 240, 410)
    expected = numpy.asarray(image.resize((rw, rh), Image.Resampling.BILINEAR).crop(region))
    assert numpy.array_equal(numpy.asarray(resize_crop(image, (rw, rh), region)), expected)
    monkeypatch.setattr(module, "_vertical_first", lambda source, out: False)
    assert not numpy.array_equal(numpy.asarray(resize_crop(image, (rw, rh), region)), expected)


def test_the_default_is_torchvisions_pixels_and_fast_resize_is_not():
    from torchvision import transforms

    image = _photo(1280, 960, seed=1)
    pipeline = ResizeCropNormalize()
    expected = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.PILToTensor()])(image)
    assert torch.equal(pipeline.to_uint8(image), expected)
    fast = pipeline.with_options(fast_resize=True).to_uint8(image)
    differ = (fast.int() - expected.int()).abs()
    assert 0 < int(differ.gt(0).sum()) < expected.numel() // 20 and int(differ.max()) == 1


def test_normalize_into_fills_a_row_of_the_batch_as_normalize_does():
    pixels = torch.randint(0, 256, (3, 5, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    rows = numpy.full((2, 3, 5, 4), numpy.nan, dtype=numpy.float32)
    ResizeCropNormalize().normalize_into(pixels, rows[1])
    assert numpy.isnan(rows[0]).all()
    assert torch.equal(torch.from_numpy(rows[1]), ResizeCropNormalize().normalize([pixels])[0])
