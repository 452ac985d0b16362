"""handlerkit.handlers._decode: one request's image, step by step (payload, header, pixels, mode).
The same steps on the bad-input fixture files, in child processes, are test_vision_safety.py's."""

from __future__ import annotations

import base64
import io

import numpy
import pytest
from PIL import Image

from conftest import bomb_png, png_bytes
from handlerkit.errors import RequestError
from handlerkit.handlers._decode import convert_mode, image_bytes, load_image, open_image, pixel_limit


def test_image_bytes_takes_bytes_as_sent_and_base64_str_decoded():
    png = png_bytes()
    assert image_bytes(png, 0) is png
    assert image_bytes(bytearray(png), 0) == png
    assert image_bytes(memoryview(png), 0) == png
    wrapped = base64.encodebytes(png).decode()  # base64 tools wrap lines: the whitespace is dropped
    assert "\n" in wrapped and image_bytes(wrapped, 0) == png


@pytest.mark.parametrize(
    "payload, message",
    [
        (b"", "request 4: an empty body"),
        ("", "request 4: the body is empty"),
        ("data:image/png;base64,AAAA", "request 4: the body is a data URL, not base64 alone"),
        ("not base64!", "request 4: the body is a str that is not base64"),
        ({"url": "x"}, "request 4: a JSON object is not an image"),
        (3.5, "request 4: a JSON number is not an image"),
    ],
)
def test_image_bytes_refuses_what_is_no_image(payload, message):
    with pytest.raises(RequestError) as info:
        image_bytes(payload, 4)
    assert info.value.reason.startswith(message) and info.value.error_code == 400 and info.value.fix


def test_open_image_reads_the_header_only():
    image = open_image(png_bytes(64, 48), 0)
    assert image.size == (64, 48) and image.format == "PNG"
    with pytest.raises(RequestError) as info:
        open_image(b"not a png", 1)
    assert info.value.reason == "request 1: the 9-byte body is not an image PIL can read"


def test_too_many_pixels_is_413_from_the_header_unless_the_limit_is_lifted(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    big = png_bytes(40, 30)  # 1,200 pixels: over the limit, under twice it (PIL would only warn)
    with pytest.raises(RequestError) as info:
        open_image(big, 2)
    assert info.value.error_code == 413
    assert info.value.reason == "request 2: the image has 1,200 pixels (40 x 30), more than the limit of 1,000"
    assert "limit_max_image_pixels=false" in info.value.fix
    assert open_image(big, 2, limit_pixels=False).size == (40, 30)
    assert Image.MAX_IMAGE_PIXELS == 1000  # lifted for that one open only


def test_a_bomb_beyond_twice_the_limit_is_said_our_way():
    with pytest.raises(RequestError, match=r"^request 0: the image has 400,000,000 pixels, more than the limit of") as info:
        open_image(bomb_png(20000), 0)
    assert info.value.error_code == 413


def test_pixel_limit_puts_the_limit_back_even_when_the_block_raises():
    before = Image.MAX_IMAGE_PIXELS
    with pytest.raises(KeyError):
        with pixel_limit(False):
            assert Image.MAX_IMAGE_PIXELS is None
            raise KeyError("x")
    assert Image.MAX_IMAGE_PIXELS == before
    with pixel_limit(True):
        assert Image.MAX_IMAGE_PIXELS == before


def test_load_image_decodes_and_a_truncated_file_fails_alone():
    png = png_bytes(64, 48)
    assert load_image(open_image(png, 0), 0).getpixel((0, 0)) is not None
    truncated = open_image(png[: len(png) // 2], 3)  # the header is intact
    with pytest.raises(RequestError, match=r"^request 3: the image is corrupt or truncated \("):
        load_image(truncated, 3)


def row(image: Image.Image) -> list:
    return [image.getpixel((x, 0)) for x in range(image.width)]


def test_convert_mode_scales_16_bit_and_composites_transparency():
    wide = Image.fromarray(numpy.array([[0, 257, 65535]], dtype=numpy.uint16))
    assert wide.mode.startswith("I;16")
    assert row(convert_mode(wide, "L")) == [0, 1, 255]  # PIL's convert would clip 257 to 255
    rgba = Image.new("RGBA", (2, 1), (255, 0, 0, 0))
    rgba.putpixel((1, 0), (0, 0, 255, 255))
    assert row(convert_mode(rgba, "RGB")) == [(255, 255, 255), (0, 0, 255)]  # over white
    assert row(convert_mode(rgba, "RGB", (0, 0, 0))) == [(0, 0, 0), (0, 0, 255)]
    assert row(convert_mode(rgba, "RGB", None)) == [(255, 0, 0), (0, 0, 255)]  # alpha dropped
    rgb = Image.new("RGB", (1, 1))
    assert convert_mode(rgb, "RGB") is rgb and convert_mode(rgb, None) is rgb
