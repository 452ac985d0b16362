"""handlerkit's ImageClassifier: request formats, top-k, label maps, bad requests answered alone, the fast preprocessing."""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

import numpy
import pytest
import torch
from PIL import Image
from torchvision import transforms

import handlerkit as hk
from conftest import LABELS, bomb_png, cnn_dir, png_bytes
from handlerkit.errors import ConfigError, ModelLoadError, RequestError
from handlerkit.handlers._decode import convert_mode
from handlerkit.handlers._pipeline import ResizeCropNormalize, pipeline_from
from handlerkit.handlers.image_classifier import ImageClassifier
from handlerkit.handlers.vision import VisionHandler, decode_image
from handlerkit.worker.memory import MemoryTracker

FIXTURE_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "models" / "image_classifier"
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
# Bad images: an error item and a 4xx status for that request, answers for the others
# ---------------------------------------------------------------------------------------------


def _truncated(png: bytes) -> bytes:
    return png[: len(png) // 2]


BAD_IMAGES = {
    "truncated png": (_truncated, 400, r"^the image is corrupt or truncated \(OSError: "),
    "not an image": (lambda png: b"this is not an image", 400, r"^the 20-byte body is not an image PIL can read$"),
    "empty body": (lambda png: b"", 400, r"^an empty body$"),
    "decompression bomb": (lambda png: bomb_png(20000), 413, r"^the image has 400,000,000 pixels, more than the limit of 89,478,485$"),
}


@pytest.mark.parametrize("case", list(BAD_IMAGES))
def test_bad_image_gets_an_error_item_and_the_others_an_answer(cnn5_dir, png, case):
    make, code, pattern = BAD_IMAGES[case]
    handler, ctx = init(cnn5_dir)
    good, bad, again = run(handler, ctx, hk.Request.from_bytes(png), hk.Request.from_bytes(make(png)), hk.Request.from_bytes(png))
    assert set(good) == set(LABELS[:5]) and good == again
    assert set(bad) == {"code", "error", "fix"} and bad["code"] == code
    assert re.search(pattern, bad["error"]), bad["error"]
    assert bad["fix"].startswith("send ")
    phrase = {400: "Bad Request", 413: "Payload Too Large"}[code]
    assert [ctx.get_response_status(i) for i in range(3)] == [(200, None), (code, phrase), (200, None)]
    error = handler.request_errors[1]
    assert isinstance(error, RequestError) and error.request_index == 1 and error.error_code == code


def test_bad_base64_and_missing_payload(cnn5_dir, png):
    handler, ctx = init(cnn5_dir)
    [item] = handler.handle([{"body": "not base64 at all!"}], ctx)
    assert item["code"] == 400 and item["error"].startswith("the body is a str that is not base64")
    good, missing = handler.handle([{"body": png}, {"image": png}], ctx)
    assert set(good) == set(LABELS[:5])
    assert missing == {
        "code": 400,
        "error": "no image under 'data' or 'body' (got ['image'])",
        "fix": "send the image as the request body or as a form field named 'data'",
    }
    [item] = handler.handle([{"body": {"url": "http://example.com/cat.png"}}], ctx)
    assert item["error"] == "a JSON object is not an image"


def test_every_request_bad_never_calls_the_model(cnn5_dir):
    handler, ctx = init(cnn5_dir)
    calls = []
    model = handler.model
    handler.model = lambda x: calls.append(x.shape) or model(x)
    out = handler.handle([{"body": b""}, {"body": b"junk"}], ctx)
    assert [item["code"] for item in out] == [400, 400]
    assert calls == []
    assert handler.preprocess([{"body": b""}]).shape == (0, 3, 224, 224)


def test_a_torchserve_style_postprocess_gets_the_errors_put_back(cnn5_dir, png):
    class Plain(ImageClassifier):
        def postprocess(self, data):  # one item per readable request, as TorchServe's handlers write it
            return data.argmax(1).tolist()

    ctx = hk.MockContext(model_dir=cnn5_dir, gpu_id=None)
    handler = Plain()
    handler.initialize(ctx)
    out = handler.handle([{"body": png}, {"body": b"junk"}, {"body": png}], ctx)
    assert isinstance(out[0], int) and out[0] == out[2]
    assert out[1]["code"] == 400


def test_explain_answers_each_readable_request(cnn5_dir, png):
    handler, ctx = init(cnn5_dir)
    batch = hk.batch(hk.Request.from_bytes(png).with_headers(explain="True"), hk.Request.from_bytes(b"junk"))
    batch.bind(ctx)
    attributions, error = handler.handle(batch.data, ctx)
    assert torch.tensor(attributions).shape == (3, 224, 224)
    assert error["code"] == 400
    only_bad = hk.batch(hk.Request.from_bytes(b"junk").with_headers(explain="True"))
    only_bad.bind(ctx)
    assert [item["code"] for item in handler.handle(only_bad.data, ctx)] == [400]


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
    assert handler.preprocess([{"body": bomb}]).shape == (0,)  # nothing readable
    assert handler.request_errors[0].error_code == 413
    assert handler.request_errors[0].reason == "request 0: the image has 179,560,000 pixels, more than the limit of 89,478,485"

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
    if mode == "I;16":  # a real 16-bit image uses the full range: 255 -> 65535 (PIL's convert would clip)
        gray = numpy.asarray(rgb.convert("L")).astype("<u2") * 257
        converted, reference_image = Image.frombytes("I;16", rgb.size, gray.tobytes()), rgb.convert("L").convert("RGB")
    else:
        converted = rgb.convert(mode)
        reference_image = converted.convert("RGB")
    buf = io.BytesIO()
    converted.save(buf, format="TIFF" if mode == "CMYK" else "PNG")
    reference = io.BytesIO()
    reference_image.save(reference, format="PNG")
    handler, ctx = init(cnn5_dir)
    [out] = run(handler, ctx, hk.Request.from_bytes(buf.getvalue()))
    [expected] = run(handler, ctx, hk.Request.from_bytes(reference.getvalue()))
    assert out.keys() == expected.keys()
    assert all(abs(out[k] - expected[k]) < 1e-6 for k in out)


def test_transparency_is_composited_over_white(cnn5_dir):
    rgba = Image.new("RGBA", (64, 64), (0, 0, 0, 0))  # transparent black
    rgba.paste((200, 0, 0, 255), (16, 16, 48, 48))
    white = Image.new("RGB", (64, 64), (255, 255, 255))
    white.paste((200, 0, 0), (16, 16, 48, 48))
    handler, ctx = init(cnn5_dir)
    pixels = [handler.image_processing(convert_mode(image, "RGB")) for image in (rgba, white)]
    assert torch.equal(pixels[0], pixels[1])
    assert not torch.equal(pixels[0], handler.image_processing(rgba.convert("RGB")))  # PIL's: black background


# ---------------------------------------------------------------------------------------------
# The fast preprocessing: TorchServe's tensors, computed another way
# ---------------------------------------------------------------------------------------------

TORCHSERVE_TRANSFORM = transforms.Compose([
    transforms.Resize(256),
    transforms.CenterCrop(224),
    transforms.ToTensor(),
    transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
])
ONE_LEVEL = 1 / 255 / 0.224 + 1e-6  # one uint8 step after the ImageNet normalisation


def _photo(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = numpy.random.default_rng(seed)
    y, x = numpy.mgrid[0:height, 0:width]
    smooth = numpy.stack([x * 255 // width, y * 255 // height, (x + y) * 255 // (width + height)], axis=-1)
    return Image.fromarray(numpy.clip(smooth + rng.normal(0, 20, smooth.shape), 0, 255).astype(numpy.uint8))


def test_the_fast_path_gives_torchserve_tensors():
    pipeline = pipeline_from(TORCHSERVE_TRANSFORM)
    assert pipeline == ImageClassifier.image_processing
    for path in sorted(FIXTURE_IMAGES.iterdir()):  # 256x256 and a 512x600 photo: bit for bit
        with Image.open(path) as image:
            rgb = image.convert("RGB")
        assert torch.equal(pipeline(rgb), TORCHSERVE_TRANSFORM(rgb)), path.name
    for size in [(1, 1), (64, 48), (300, 200), (257, 256)]:  # upscales and crops go through PIL: bit for bit
        image = _photo(*size)
        assert torch.equal(pipeline(image), TORCHSERVE_TRANSFORM(image)), size
    image = _photo(1280, 960)  # a downscale, by torch's uint8 kernel: PIL's but for a one-step rounding
    diff = (pipeline(image) - TORCHSERVE_TRANSFORM(image)).abs()
    assert float(diff.max()) <= ONE_LEVEL
    assert int((diff > 1e-6).sum()) < 0.01 * diff.numel()


@pytest.mark.parametrize(
    ("transform", "expected"),
    [
        (transforms.Compose([transforms.ToTensor(), transforms.Normalize([0.5], [0.5])]),
         ResizeCropNormalize(resize=None, crop=None, mean=(0.5,) * 3, std=(0.5,) * 3)),
        (transforms.Compose([transforms.Resize((100, 120)), transforms.ToTensor()]),
         ResizeCropNormalize(resize=(100, 120), crop=None, mean=None, std=None)),
        (transforms.Compose([transforms.CenterCrop(300), transforms.ToTensor()]),
         ResizeCropNormalize(resize=None, crop=(300, 300), mean=None, std=None)),
        (transforms.Compose([transforms.Resize(256, interpolation=transforms.InterpolationMode.BICUBIC), transforms.ToTensor()]), None),
        (transforms.Compose([transforms.RandomCrop(224), transforms.ToTensor()]), None),
        (transforms.Compose([transforms.Resize(256), transforms.ToTensor(), transforms.Lambda(lambda x: x)]), None),
        (lambda image: image, None),
    ],
    ids=["normalize only", "resize to a size", "crop with padding", "bicubic", "random crop", "extra step", "function"],
)
def test_which_torchvision_pipelines_run_the_fast_way(transform, expected):
    assert pipeline_from(transform) == expected
    if expected is not None:
        image = _photo(64, 48)  # upscaled, cropped with padding: bit for bit
        assert torch.equal(expected(image), transform(image))


def test_a_subclass_with_torchserves_compose_runs_the_fast_way(tmp_path):
    class Subclass(ImageClassifier):
        image_processing = transforms.Compose(
            [transforms.Resize(80), transforms.CenterCrop(64), transforms.ToTensor(), transforms.Normalize([0.5] * 3, [0.25] * 3)]
        )

    class PerImage(Subclass):
        def _pipeline(self):  # the general path, image by image
            return None

    model_dir = cnn_dir(tmp_path / "m", 5)
    outputs = []
    for cls in (Subclass, PerImage):
        handler = cls()
        handler.initialize(hk.MockContext(model_dir=model_dir, gpu_id=None))
        assert (handler._pipeline() is None) == (cls is PerImage)
        x = handler.preprocess([{"body": png_bytes(160, 120, seed=s)} for s in range(3)])
        assert x.shape == (3, 3, 64, 64)
        outputs.append(x)
    assert torch.equal(outputs[0], outputs[1])


def test_decode_threads_do_not_change_the_answers(cnn5_dir):
    images = [png_bytes(300, 200, seed=s) for s in range(5)]
    answers = []
    for threads in (1, 3):
        handler, ctx = init(cnn5_dir, model_yaml_config={"handler": {"decode_threads": threads}})
        assert handler.decode_threads == threads
        answers.append(run(handler, ctx, *(hk.Request.from_bytes(i) for i in images)))
    assert answers[0] == answers[1]


def test_jpeg_draft_is_opt_in_and_changes_pixels_a_little(cnn5_dir):
    buffer = io.BytesIO()
    _photo(1280, 960).save(buffer, format="JPEG", quality=90)
    request = {"body": bytearray(buffer.getvalue())}
    exact, ctx = init(cnn5_dir)
    draft, _ = init(cnn5_dir, model_yaml_config={"handler": {"jpeg_draft": True}})
    assert exact.jpeg_draft is False and draft.jpeg_draft is True
    assert any("jpeg_draft" in note for note in draft.decisions.notes)
    a, b = exact.preprocess([request]), draft.preprocess([request])
    assert a.shape == b.shape == (1, 3, 224, 224)
    assert not torch.equal(a, b) and float((a - b).abs().mean()) < 0.1


def test_fast_resize_is_opt_in_and_moves_some_pixels_by_one_level(cnn5_dir):
    buffer = io.BytesIO()
    _photo(1280, 960).save(buffer, format="PNG")
    request = {"body": bytearray(buffer.getvalue())}
    exact, _ = init(cnn5_dir)
    fast, _ = init(cnn5_dir, model_yaml_config={"handler": {"fast_resize": True}})
    assert exact.fast_resize is False and fast.fast_resize is True
    assert any("fast_resize" in note for note in fast.decisions.notes)
    assert not any("fast_resize" in note for note in exact.decisions.notes)
    a, b = exact.preprocess([request]), fast.preprocess([request])
    levels = ((a - b) * torch.tensor((0.229, 0.224, 0.225)).reshape(1, 3, 1, 1) * 255).abs()
    assert a.shape == b.shape == (1, 3, 224, 224) and not torch.equal(a, b)
    assert float(levels.max()) < 1.01  # one grey level at most


@pytest.mark.parametrize(
    ("key", "value"), [("decode_threads", 0), ("decode_threads", "2"), ("jpeg_draft", "yes"), ("fast_resize", 1)]
)
def test_bad_vision_settings_are_config_errors(cnn5_dir, key, value):
    with pytest.raises(ConfigError, match=rf"handler\.{key} must be"):
        init(cnn5_dir, model_yaml_config={"handler": {key: value}})


def test_copies_and_pickles_leave_the_decode_threads_behind(cnn5_dir, png):
    import copy
    import pickle

    handler, ctx = init(cnn5_dir, model_yaml_config={"handler": {"decode_threads": 2}})
    expected = handler.handle([{"body": png}, {"body": png}], ctx)
    assert handler._executor is not None
    for clone in (copy.copy(handler), copy.deepcopy(handler), pickle.loads(pickle.dumps(handler))):
        assert clone._executor is None
        assert clone.handle([{"body": png}, {"body": png}], ctx) == expected


def test_tensors_and_pil_images_from_data(cnn5_dir, png):
    handler, ctx = init(cnn5_dir)
    image = Image.open(io.BytesIO(png))
    pixels = handler.image_processing(image)
    from_bytes, from_image, from_tensor = handler.handle([{"body": png}, {"body": image}, {"body": pixels}], ctx)
    assert from_bytes == from_image
    assert list(from_tensor.values()) == pytest.approx(list(from_bytes.values()), abs=1e-6)
    [wrong] = handler.handle([{"body": torch.zeros(3, 2)}], ctx)
    assert wrong["error"] == "a list of floats of shape [3, 2]; the model input is [3, 224, 224]"


def test_a_mode_pil_cannot_convert_fails_alone(cnn5_dir, png, monkeypatch):
    from handlerkit.handlers import vision

    def convert(image, mode, background):
        if image.size == (32, 32):
            raise ValueError("conversion not supported")
        return image.convert(mode)

    monkeypatch.setattr(vision, "convert_mode", convert)
    handler, ctx = init(cnn5_dir)
    good, bad = handler.handle([{"body": png}, {"body": png_bytes(32, 32)}], ctx)
    assert set(good) == set(LABELS[:5])
    assert bad["code"] == 400 and bad["error"] == "a RGB image cannot be converted to RGB (conversion not supported)"
