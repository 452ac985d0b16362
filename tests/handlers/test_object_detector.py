"""handlerkit's ObjectDetector: TorchServe's output on the fixture detector, its boxes on the sample
images, images of several sizes, per-request errors, the threshold, and TorchServe's own handler
on the same weights."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
from collections import deque
from pathlib import Path

import pytest
import torch
from PIL import Image
from torchvision.ops import box_iou

import handlerkit as hk
from conftest import png_bytes, ts_imports
from fixtures.builder import detector as detector_fixture
from fixtures.builder.spec import SAMPLES
from handlerkit.errors import ConfigError, HandlerkitError
from handlerkit.handlers.object_detector import ObjectDetector
from handlers.test_image_segmenter import bad_inputs_in_a_child

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT / "fixtures" / "models" / "object_detector"
IMAGES = ROOT / "fixtures" / "images"
BAD = ROOT / "fixtures" / "bad"
NAMES = [name for name, *_ in SAMPLES]  # 256 x 256, one shape each
PHOTO = "grace_hopper.jpg"  # 512 x 600


def harness(**handler_config) -> hk.Harness:
    if handler_config:
        ctx = hk.MockContext(model_dir=MODEL_DIR, gpu_id=None, model_yaml_config={"handler": handler_config})
        return hk.Harness("object_detector", ctx)
    return hk.Harness("object_detector", hk.MockContext.from_model_dir(MODEL_DIR))


@pytest.fixture(scope="module")
def h() -> hk.Harness:
    return harness()


def image(name: str) -> hk.Request:
    return hk.Request.from_file(IMAGES / name)


def boxes_of(answer: list[dict]) -> list[tuple[str, list[float], float]]:
    """(label, box, score) per detection of one answer, checking TorchServe's item layout."""
    out = []
    for item in answer:
        assert len(item) == 2 and list(item)[1] == "score", item  # {label: box, "score": s}, in that order
        label = next(iter(item))
        box = item[label]
        assert isinstance(box, list) and len(box) == 4 and all(isinstance(v, float) for v in box)
        out.append((label, box, item["score"]))
    return out


# ---------------------------------------------------------------------------- the fixture model
def test_resolves_by_name_and_finds_each_sample_shape(h):
    run = h.run(hk.batch(*[image(name) for name in NAMES]))
    assert type(h.handler).__module__ == "handlerkit.handlers.object_detector"
    truth = detector_fixture.sample_boxes()
    for name, answer in zip(NAMES, run.output):
        [(label, box, score)] = boxes_of(answer)
        kind, expected = truth[name]
        iou = float(box_iou(torch.tensor([box]), torch.tensor([expected], dtype=torch.float32))[0, 0])
        assert label == kind and iou >= 0.8 and 0.5 <= score <= 1, (name, label, iou, score)


def test_accuracy_record():
    record = json.loads((MODEL_DIR / "accuracy.json").read_text())
    assert record["held_out_detection_rate"] >= 0.95 and record["held_out_mean_iou"] >= 0.8
    assert record["held_out_min_iou"] >= 0.5 and record["held_out_false_boxes_per_image"] <= 0.05
    assert (record["n_held_out"], record["threshold"]) == (detector_fixture.N_HELD_OUT, 0.5)


def test_fixture_files_match_the_builder():
    assert (MODEL_DIR / "model.py").read_text() == detector_fixture.MODEL_SOURCE
    assert (MODEL_DIR / "model-config.yaml").read_text() == detector_fixture.MODEL_CONFIG
    assert json.loads((MODEL_DIR / "MAR-INF" / "MANIFEST.json").read_text())["model"]["handler"] == "object_detector"
    labels = json.loads((MODEL_DIR / "index_to_name.json").read_text())
    assert labels["0"] == "__background__" and labels["5"] == "cross" and len(labels) == 6
    segmenter_weights = MODEL_DIR.parent / "image_segmenter" / "model.pt"
    assert (MODEL_DIR / "model.pt").read_bytes() == segmenter_weights.read_bytes()
    assert sum(p.stat().st_size for p in MODEL_DIR.rglob("*") if p.is_file()) < 2_000_000


def test_manifest_is_what_model_archiver_writes():
    pytest.importorskip("model_archiver")
    from model_archiver.manifest_components.manifest import Manifest
    from model_archiver.manifest_components.model import Model

    text = (MODEL_DIR / "MAR-INF" / "MANIFEST.json").read_text()
    archived = Manifest(runtime="python", model=Model(
        model_name="object_detector", serialized_file="model.pt", handler="object_detector",
        model_file="model.py", model_version="1.0", config_file="model-config.yaml",
    ))
    archived.manifest_dict["createdOn"] = json.loads(text)["createdOn"]
    assert text == str(archived)


def _bfs_regions(mask: torch.Tensor) -> set[frozenset[tuple[int, int]]]:
    """The 8-connected regions of a bool mask, found the slow, obvious way."""
    seen, regions = set(), set()
    height, width = mask.shape
    for start in zip(*torch.nonzero(mask, as_tuple=True)):
        start = (int(start[0]), int(start[1]))
        if start in seen:
            continue
        region, queue = set(), deque([start])
        seen.add(start)
        while queue:
            y, x = queue.popleft()
            region.add((y, x))
            for dy in (-1, 0, 1):
                for dx in (-1, 0, 1):
                    p = (y + dy, x + dx)
                    if 0 <= p[0] < height and 0 <= p[1] < width and p not in seen and bool(mask[p]):
                        seen.add(p)
                        queue.append(p)
        regions.add(frozenset(region))
    return regions


def test_the_models_connected_regions_are_right(tmp_path):
    (tmp_path / "detector_model.py").write_text(detector_fixture.MODEL_SOURCE)
    spec = importlib.util.spec_from_file_location("_hk_detector_model", tmp_path / "detector_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    generator = torch.Generator().manual_seed(0)
    spiral = torch.zeros(15, 15, dtype=torch.bool)  # one long region: many rounds without jumping
    spiral[1, 1:14] = spiral[1:14, 13] = spiral[13, 1:14] = spiral[3:14, 1] = spiral[3, 1:12] = spiral[3:12, 11] = True
    for mask in [spiral, *(torch.rand(24, 31, generator=generator) < p for p in (0.3, 0.45, 0.6))]:
        ids = module._regions(mask)
        found = {frozenset(map(tuple, torch.nonzero(ids == i).tolist())) for i in ids[mask].unique().tolist()}
        assert found == _bfs_regions(mask)
        assert bool((ids[~mask] == 0).all())


# ---------------------------------------------------------------------------- TorchServe's own handler
@pytest.fixture(scope="module")
def theirs() -> hk.Harness:
    from ts.torch_handler.object_detector import ObjectDetector as TsObjectDetector

    with ts_imports(MODEL_DIR):
        harness = hk.Harness(TsObjectDetector(), hk.MockContext.from_model_dir(MODEL_DIR))
        harness.initialize()
    return harness


@pytest.mark.torchserve
def test_torchserves_object_detector_gives_the_same_answers_on_the_same_weights(h, theirs):
    batch = hk.batch(*[image(name) for name in NAMES])  # one size: TorchServe can stack them
    assert h.run(batch).output == theirs.run(batch).output


@pytest.mark.torchserve
def test_images_of_several_sizes_where_torchserve_fails(h, theirs):
    batch = hk.batch(image("circle.png"), image(PHOTO), image("star.jpg"))
    h.preprocess(batch)
    model_input = h.results["preprocess"].output
    assert isinstance(model_input, list) and [tuple(t.shape) for t in model_input] == [(3, 256, 256), (3, 600, 512), (3, 256, 256)]
    output = h.run(batch).output
    assert output[0] == h.run(hk.batch(image("circle.png"))).output[0]
    assert output[2] == h.run(hk.batch(image("star.jpg"))).output[0]
    for label, box, _ in boxes_of(output[1]):  # out of distribution: whatever it finds lies on the photo
        assert 0 <= box[0] < box[2] <= 512 and 0 <= box[1] < box[3] <= 600
    with pytest.raises(hk.StageError, match="stack expects each tensor to be equal size"):
        theirs.run(batch)


@pytest.mark.torchserve
def test_one_corrupt_image_fails_alone_where_torchserve_fails_the_batch(h, theirs):
    names = NAMES + ["circle.png", "star.png"]  # 8 requests
    requests = [image(name) for name in names]
    requests[5] = hk.Request.from_file(BAD / "truncated.jpg")
    output = h.run(hk.batch(*requests)).output
    assert [r.code for r in h.context.responses()] == [200] * 5 + [400] + [200] * 2
    assert output[5]["code"] == 400 and "truncated" in output[5]["error"] and output[5]["fix"]
    for index in (0, 1, 2, 3, 4, 6, 7):
        assert output[index] == h.run(hk.batch(image(names[index]))).output[0], index
    with pytest.raises(hk.StageError, match="truncated"):
        theirs.run(hk.batch(*requests))


# ---------------------------------------------------------------------------- requests
def test_every_request_format_gives_the_same_answer(h):
    png = (IMAGES / "triangle.png").read_bytes()
    [reference] = h.run(hk.batch(hk.Request.from_bytes(png, "image/png"))).output
    assert [label for label, _, _ in boxes_of(reference)] == ["triangle"]
    pixels = h.handler.image_processing(Image.open(io.BytesIO(png))).tolist()  # ToTensor's output, as JSON
    rows = [{"body": png}, {"data": bytearray(png)}, {"body": base64.b64encode(png).decode()}, {"body": pixels}]
    assert h.handler.handle(rows, h.context) == [reference] * 4
    wire = h.run(hk.batch(hk.Request.form({"data": (png, "image/png")}), hk.Request.json(pixels))).output
    assert wire == [reference, reference]


def test_to_tensor_is_torchvisions():
    from torchvision import transforms

    for mode in ("RGB", "L"):
        picture = Image.open(io.BytesIO(png_bytes(40, 30, seed=3))).convert(mode)
        assert torch.equal(ObjectDetector.image_processing(picture), transforms.ToTensor()(picture))


def test_bad_requests_fail_alone(h):
    batch = hk.batch(
        image("square.png"),
        hk.Request.json([[0.5, 0.5, 0.5]]),  # floats, but not [channels, height, width]
        hk.Request.from_bytes(b"", "image/png"),
        hk.Request.text("not base64 at all!"),
        hk.Request.json([[[0.5, 0.5], [0.5]]]),  # ragged
        image("cross.png"),
    )
    output = h.run(batch).output
    assert [r.code for r in h.context.responses()] == [200, 400, 400, 400, 400, 200]
    assert all(output[i]["error"] and output[i]["fix"] for i in (1, 2, 3, 4))
    assert [boxes_of(output[0])[0][0], boxes_of(output[5])[0][0]] == ["square", "cross"]
    # Lists alone: each is checked as an image, [channels, height, width] of any size.
    output = h.run(hk.batch(hk.Request.json([[0.5, 0.5, 0.5]]), hk.Request.json(torch.zeros(3, 40, 50).tolist()))).output
    assert "is not an image [channels, height, width]" in output[0]["error"] and output[1] == []


def test_every_bad_input_fails_alone_and_the_process_survives():
    answered = bad_inputs_in_a_child("object_detector", MODEL_DIR)  # the matrix of tests/handlers/test_vision_safety.py
    truth = detector_fixture.sample_boxes()
    sources = {"alpha.png": "circle.png", "gray16.png": "square.png", "palette_transparent.png": "triangle.png",
               "cmyk.jpg": "star.jpg", "grayscale.jpg": "cross.png"}  # what each was made from
    for name, source in sources.items():
        kind, expected = truth[source]
        labels, boxes = answered[name]["labels"], answered[name]["boxes"]
        iou = float(box_iou(torch.tensor(boxes[:1]), torch.tensor([expected], dtype=torch.float32))[0, 0])
        assert set(labels) == {kind} and iou >= 0.8, (name, labels, iou)
        # The palette image keeps background bands next to one the transparent colour turned white,
        # unlike any training background: the model boxes that band too (at the time of writing).
        assert len(labels) == 1 or name == "palette_transparent.png", (name, labels)
    assert answered["one_pixel.png"]["labels"] == []  # one flat colour: nothing to find


def test_check_passes(h):
    report = h.check(hk.batch(image("square.png"), hk.Request.from_bytes(b"", "image/png"), image(PHOTO)))
    assert report.ok, report
    assert [verdict for _, verdict in report.parity] == ["same alone and in the batch"] * 3
    assert [code for code, _ in report.statuses] == [200, 400, 200]


def test_a_batch_of_only_bad_requests_never_calls_the_model(h, monkeypatch):
    def boom(*args):
        raise AssertionError("the model ran")

    monkeypatch.setattr(h.handler, "model", boom)
    batch = hk.batch(hk.Request.from_file(BAD / "truncated.png"), hk.Request.json({"url": "x"}))
    assert [item["code"] for item in h.run(batch).output] == [400, 400]


# ---------------------------------------------------------------------------- threshold and labels
def test_threshold_from_the_config():
    square = image("square.png")  # its box scores about 0.84
    [[(label, _, score)]] = [boxes_of(a) for a in harness(threshold=0.5).run(hk.batch(square)).output]
    assert label == "square" and 0.5 < score < 0.99
    assert harness(threshold=0.99).run(hk.batch(square)).output == [[]]
    strict = harness(threshold=1)
    strict.initialize()
    assert strict.handler.threshold == 1.0 and any("threshold 1.0" in note for note in strict.handler.decisions.notes)


@pytest.mark.parametrize("threshold", [-0.1, 1.5, "0.5", True, None])
def test_a_bad_threshold_is_a_config_error(threshold):
    with pytest.raises(hk.StageError, match="handler.threshold must be a number from 0 to 1") as info:
        harness(threshold=threshold).initialize()
    assert isinstance(info.value.original, ConfigError)


def _detections(*labels: int, scores=None) -> list[dict[str, torch.Tensor]]:
    k = len(labels)
    return [{"boxes": torch.arange(4.0 * k).view(k, 4), "labels": torch.tensor(labels),
             "scores": torch.tensor(scores if scores is not None else [0.9] * k)}]


def test_labels_are_named_by_the_map_and_numbers_otherwise():
    handler = ObjectDetector()
    handler.mapping = {"0": "__background__", "1": "circle"}
    [answer] = handler.postprocess(_detections(1, 7, 1, scores=[0.9, 0.8, 0.2]))
    assert answer == [{"circle": [0.0, 1.0, 2.0, 3.0], "score": pytest.approx(0.9)},
                      {"7": [4.0, 5.0, 6.0, 7.0], "score": pytest.approx(0.8)}]  # TorchServe's: KeyError
    handler.mapping = None
    assert [next(iter(item)) for item in handler.postprocess(_detections(3, 1))[0]] == ["3", "1"]


@pytest.mark.parametrize(
    ("output", "got"),
    [(torch.zeros(1, 6), "got Tensor[1, 6]"),
     ([{"boxes": torch.zeros(0, 4), "labels": torch.zeros(0)}], "(first: ['boxes', 'labels'])"),
     ({"boxes": torch.zeros(0, 4)}, "got dict(1 keys)")],
)
def test_a_model_output_of_another_kind_names_what_came(output, got):
    with pytest.raises(HandlerkitError, match="one dict per image with tensors 'boxes'") as info:
        ObjectDetector().postprocess(output)
    assert got in str(info.value) and info.value.fix


def test_explanations_are_refused_clearly(h):
    with pytest.raises(hk.StageError, match="detection model has no single score per class"):
        h.run(hk.batch(image("circle.png").with_headers(explain="True")))
