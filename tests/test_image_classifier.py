"""handlerkit's ImageClassifier: request formats, top-k, label maps, bad images with their index."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest
import torch
from conftest import LABELS, bomb_png, cnn_dir, png_bytes
from PIL import Image

import handlerkit as hk
from handlerkit.memory import MemoryTracker
from handlerkit.errors import ConfigError, ModelLoadError, RequestError
from handlerkit.handlers.image_classifier import ImageClassifier
from handlerkit.handlers.vision import VisionHandler, decode_image

FIXTURE_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "models" / "image_classifier"
FIXTURE_IMAGES = FIXTURE_DIR.parents[1] / "images"


def init(model_dir, **kwargs) -> tuple[ImageClassifier, hk.MockContext]:
    ctx = hk.MockContext(model_dir=model_dir, gpu_id=None, **kwargs)
    handler = ImageClassifier()
    handler.initialize(ctx)
    return handler, ctx


def run(handler: ImageClassifier, ctx: hk.MockContext, *requests: hk.Request) -> list:
    batch = hk.batch(*requests)
    batch.bind(ctx)
    return handler.handle(batch.data, ctx)


def test_classifies_a_png(cnn5_dir, png):
    handler, ctx = init(cnn5_dir)
    [out] = run(handler, ctx, hk.Request.from_bytes(png, "image/png"))
    assert set(out) == set(LABELS[:5])
    probs = list(out.values())
    assert probs == sorted(probs, reverse=True)
    assert sum(probs) == pytest.approx(1.0, abs=1e-5)
    assert handler.decisions.label_map == {
        "path": str(cnn5_dir / "index_to_name.json"), "found": True, "size": 5, "model_width": 5,
    }


def test_request_formats_give_the_same_output(cnn5_dir, png):
    handler, ctx = init(cnn5_dir)
    b64 = base64.b64encode(png).decode("ascii")
    wrapped = "\n".join(b64[i : i + 76] for i in range(0, len(b64), 76)) + "\n"  # as `base64` writes it
    pixels = handler.image_processing(Image.open(io.BytesIO(png))).tolist()
    rows = [
        {"body": png},  # bytes
        {"body": bytearray(png)},  # what the worker hands over for image/png
        {"data": bytearray(png)},  # a multipart form field named "data"
        {"body": b64},  # text/plain base64
        {"body": wrapped},
        {"body": pixels},  # a JSON list of floats already shaped like the model input
    ]
    outputs = [handler.handle([row], ctx)[0] for row in rows]
    for out in outputs[1:]:
        assert out.keys() == outputs[0].keys()
        assert list(out.values()) == pytest.approx(list(outputs[0].values()), abs=1e-6)
    # The same through wire-faithful requests, batched.
    wire = run(
        handler,
        ctx,
        hk.Request.from_bytes(png, "image/png"),
        hk.Request.form({"data": (png, "image/png")}),
        hk.Request.text(b64),
        hk.Request.json(pixels),
    )
    for out in wire:
        assert list(out.values()) == pytest.approx(list(outputs[0].values()), abs=1e-6)


def test_topk_is_capped_at_the_number_of_classes(tmp_path, png):
    handler, ctx = init(cnn_dir(tmp_path / "cnn3", 3))
    [out] = run(handler, ctx, hk.Request.from_bytes(png))
    assert set(out) == set(LABELS[:3])
    assert sum(out.values()) == pytest.approx(1.0, abs=1e-5)


def test_topk_from_the_model_config(cnn5_dir, png):
    handler, ctx = init(cnn5_dir, model_yaml_config={"handler": {"topk": 2}})
    assert handler.topk == handler.get_max_result_classes() == 2
    [top2] = run(handler, ctx, hk.Request.from_bytes(png))
    assert len(top2) == 2
    handler.initialize(hk.MockContext(model_dir=cnn5_dir, gpu_id=None))  # no topk any more
    assert handler.topk == 5
    [top5] = run(handler, ctx, hk.Request.from_bytes(png))
    assert list(top5)[:2] == list(top2)


@pytest.mark.parametrize("topk", [0, -1, "3", True, 2.5])
def test_bad_topk_is_a_config_error(cnn5_dir, topk):
    handler = ImageClassifier()
    with pytest.raises(ConfigError, match=r"(?s)handler\.topk must be a positive integer.*\n  fix: "):
        handler.initialize(hk.MockContext(model_dir=cnn5_dir, gpu_id=None, model_yaml_config={"handler": {"topk": topk}}))
    assert handler.initialized is False and handler.model is None


@pytest.mark.parametrize(
    "labels",
    [
        {str(i): ["n0000", name] for i, name in enumerate(LABELS[:5])},
        {"object_type_names": list(LABELS[:5])},
    ],
    ids=["list values", "object_type_names"],
)
def test_legacy_label_maps(tmp_path, png, labels):
    handler, ctx = init(cnn_dir(tmp_path / "m", 5, labels=labels))
    [out] = run(handler, ctx, hk.Request.from_bytes(png))
    assert set(out) == set(LABELS[:5])


def test_without_a_label_map_classes_are_indices(tmp_path, png):
    handler, ctx = init(cnn_dir(tmp_path / "m", 5, labels=None))
    [out] = run(handler, ctx, hk.Request.from_bytes(png))
    assert set(out) == {"0", "1", "2", "3", "4"}


@pytest.mark.parametrize("n_labels", [4, 6])
def test_label_map_of_the_wrong_size_fails_at_initialize(tmp_path, n_labels):
    model_dir = cnn_dir(tmp_path / "m", 5, labels=list(LABELS[:n_labels]))
    handler = ImageClassifier()
    with pytest.raises(ModelLoadError, match=rf"index_to_name\.json has {n_labels} labels but the model outputs 5 scores\n  fix: write one label per model output"):
        handler.initialize(hk.MockContext(model_dir=model_dir, gpu_id=None))
    assert handler.initialized is False and handler.model is None and handler.mapping is None


# ---------------------------------------------------------------------------------------------
# Bad images: a RequestError naming the request index
# ---------------------------------------------------------------------------------------------


def _truncated(png: bytes) -> bytes:
    return png[: len(png) // 2]


BAD_IMAGES = {
    "truncated png": (_truncated, r"request 1: the image is corrupt or truncated"),
    "not an image": (lambda png: b"this is not an image", r"request 1: the 20-byte body is not an image"),
    "empty body": (lambda png: b"", r"request 1: an empty body\n  fix: send the image as the request body"),
    "decompression bomb": (lambda png: bomb_png(20000), r"request 1: Image size \(400000000 pixels\) exceeds limit"),
}


@pytest.mark.parametrize("case", list(BAD_IMAGES))
def test_bad_image_names_the_request(cnn5_dir, png, case):
    make, pattern = BAD_IMAGES[case]
    handler, ctx = init(cnn5_dir)
    with pytest.raises(RequestError, match=pattern) as info:
        run(handler, ctx, hk.Request.from_bytes(png), hk.Request.from_bytes(make(png)))
    assert info.value.request_index == 1
    assert "fix" in str(info.value)


def test_bad_base64_and_missing_payload(cnn5_dir, png):
    handler, ctx = init(cnn5_dir)
    with pytest.raises(RequestError, match=r"request 0: the body is a str that is not base64") as info:
        handler.handle([{"body": "not base64 at all!"}], ctx)
    assert info.value.request_index == 0
    with pytest.raises(RequestError, match=r"request 1: no image under 'data' or 'body' \(got \['image'\]\)"):
        handler.handle([{"body": png}, {"image": png}], ctx)
    with pytest.raises(RequestError, match=r"request 0: a dict is not an image"):
        handler.handle([{"body": {"url": "http://example.com/cat.png"}}], ctx)


def test_images_of_different_sizes_after_preprocessing(tmp_path, png):
    handler, ctx = init(cnn_dir(tmp_path / "m", 5))
    handler.image_processing = lambda image: torch.zeros(3, image.size[1], image.size[0])
    with pytest.raises(RequestError, match=r"different shapes after preprocessing"):
        handler.handle([{"body": png}, {"body": png_bytes(32, 32)}], ctx)


class _SizeHandler(VisionHandler):
    """A VisionHandler whose preprocessing keeps only the image size (no 180 MB tensor).

    ``image_mode = None``: the 1-bit bomb stays 1-bit (RGB would be three bytes a pixel)."""

    image_mode = None

    @staticmethod
    def image_processing(image: Image.Image) -> torch.Tensor:
        return torch.tensor(image.size)


def test_limit_max_image_pixels_false_lets_a_bomb_through(tmp_path):
    # Just above twice PIL's limit (89,478,485 px): 13,400² = 179,560,000 px, so PIL raises
    # DecompressionBombError under the limit; decoded as 1-bit it is about 180 MB.
    side = 13400
    bomb = bomb_png(side)
    default_limit = Image.MAX_IMAGE_PIXELS
    handler = _SizeHandler()
    handler.device = torch.device("cpu")

    handler.context = hk.MockContext(model_dir=tmp_path, gpu_id=None)  # limit_max_image_pixels=True
    with pytest.raises(RequestError, match=r"request 0: Image size \(179560000 pixels\) exceeds limit"):
        handler.preprocess([{"body": bomb}])

    handler.context = hk.MockContext(model_dir=tmp_path, gpu_id=None, limit_max_image_pixels=False)
    with MemoryTracker() as memory:
        sizes = handler.preprocess([{"body": bomb}])
    assert sizes.tolist() == [[side, side]]
    assert Image.MAX_IMAGE_PIXELS == default_limit  # TorchServe sets None for the whole process
    if memory.cpu_peak_delta_bytes is not None:
        assert memory.cpu_peak_delta_bytes < 600 * 2**20, memory

    with pytest.raises(RequestError):
        decode_image(bomb, 0)  # and the limit is back for the next decode


def test_explain_gives_integrated_gradients(cnn5_dir, png):
    handler, ctx = init(cnn5_dir)
    [attributions] = run(handler, ctx, hk.Request.from_bytes(png).with_headers(explain="True"))
    assert torch.tensor(attributions).shape == (3, 224, 224)


def test_fixture_model_when_present():
    if not (FIXTURE_DIR / "model.pt").is_file():
        pytest.skip("fixtures/models/image_classifier is not built (python -m fixtures.builder)")
    ctx = hk.MockContext.from_model_dir(FIXTURE_DIR)
    handler = ImageClassifier()
    handler.initialize(ctx)
    mapping = json.loads((FIXTURE_DIR / "index_to_name.json").read_text())
    images = sorted(FIXTURE_IMAGES.glob("*.png"))
    assert images, f"no PNG in {FIXTURE_IMAGES}"
    for image in images:
        [out] = run(handler, ctx, hk.Request.from_file(image))
        best = next(iter(out))
        assert best in mapping.values()
        if image.stem in mapping.values():
            assert best == image.stem, (image.name, out)


@pytest.mark.parametrize("mode", ["L", "P", "RGBA", "CMYK", "I;16", "1"])
def test_any_image_mode_is_classified_like_its_rgb_version(cnn5_dir, mode):
    # TorchServe's ImageClassifier fails on these with a tensor shape error; handlerkit's
    # VisionHandler converts to RGB first.
    rgb = Image.new("RGB", (64, 64), (255, 255, 255))
    rgb.paste((0, 0, 0), (16, 16, 48, 48))
    converted = rgb.convert(mode)
    buf = io.BytesIO()
    converted.save(buf, format="TIFF" if mode == "CMYK" else "PNG")
    reference = io.BytesIO()
    converted.convert("RGB").save(reference, format="PNG")
    handler, ctx = init(cnn5_dir)
    [out] = run(handler, ctx, hk.Request.from_bytes(buf.getvalue()))
    [expected] = run(handler, ctx, hk.Request.from_bytes(reference.getvalue()))
    assert out.keys() == expected.keys()
    assert all(abs(out[k] - expected[k]) < 1e-6 for k in out)
