"""handlerkit's ImageSegmenter: TorchServe's output on the fixture segmenter, its answers on the
sample images, per-request errors (the bad-input matrix in a child process), request formats, and
TorchServe's own handler on the same weights."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

import handlerkit as hk
from conftest import ts_imports
from fixtures.builder import segmenter as segmenter_fixture
from fixtures.builder.build import readme_text
from fixtures.builder.spec import FIXTURES_README, SAMPLES
from handlerkit.errors import HandlerkitError
from handlerkit.handlers.image_segmenter import ImageSegmenter

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT / "fixtures" / "models" / "image_segmenter"
IMAGES = ROOT / "fixtures" / "images"
BAD = ROOT / "fixtures" / "bad"
NAMES = [name for name, *_ in SAMPLES]  # circle.png ... star.jpg, one shape each


@pytest.fixture(scope="module")
def h() -> hk.Harness:
    return hk.Harness("image_segmenter", hk.MockContext.from_model_dir(MODEL_DIR))


@pytest.fixture(scope="module")
def masks() -> dict[str, torch.Tensor]:
    return segmenter_fixture.sample_masks()


def image(name: str) -> hk.Request:
    return hk.Request.from_file(IMAGES / name)


def classes(answer: list) -> torch.Tensor:
    """The class map [H, W] of one answer (its [class, prob] pairs)."""
    return torch.tensor(answer)[..., 0].long()


def same(a: list, b: list) -> bool:
    """The same classes, and probabilities up to the last bits (batches of other sizes may take
    other convolution kernels, which round differently)."""
    return torch.equal(classes(a), classes(b)) and torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)


# ---------------------------------------------------------------------------- the fixture model
def test_resolves_by_name_and_segments_every_sample_image(h, masks):
    run = h.run(hk.batch(*[image(name) for name in NAMES]))
    assert type(h.handler).__module__ == "handlerkit.handlers.image_segmenter"  # handlerkit's, not TorchServe's
    assert len(run.output) == len(NAMES)
    for name, answer in zip(NAMES, run.output):
        pixels = torch.tensor(answer)
        assert pixels.shape == (224, 224, 2), name  # TorchServe's [H][W][class, prob]
        assert torch.equal(pixels[..., 0], pixels[..., 0].round()) and pixels[..., 0].max() <= 5
        assert bool(((pixels[..., 1] > 1 / 6 - 1e-6) & (pixels[..., 1] <= 1 + 1e-6)).all())  # a max of 6 softmax values
        accuracy = float((classes(answer) == masks[name]).double().mean())
        assert accuracy >= 0.95, (name, accuracy)
        shape_class = int(masks[name].max())
        assert set(classes(answer).unique().tolist()) <= {0, shape_class}, name  # no other shape anywhere


def test_accuracy_record():
    record = json.loads((MODEL_DIR / "accuracy.json").read_text())
    assert record["held_out_pixel_accuracy"] >= 0.90
    assert record["n_held_out"] == segmenter_fixture.N_HELD_OUT and record["held_out_seed"] == segmenter_fixture.HELD_OUT_SEED
    assert record["held_out_seed"] not in (1, 2, record["train_seed"])  # images neither model was trained on


def test_fixture_files_match_the_builder():
    assert (MODEL_DIR / "model.py").read_text() == segmenter_fixture.MODEL_SOURCE
    assert (MODEL_DIR / "model-config.yaml").read_text() == segmenter_fixture.MODEL_CONFIG
    assert (MODEL_DIR / "MAR-INF" / "MANIFEST.json").read_text() == segmenter_fixture.manifest_json()
    assert json.loads((MODEL_DIR / "index_to_name.json").read_text()) == {
        "0": "__background__", "1": "circle", "2": "square", "3": "triangle", "4": "star", "5": "cross"}
    assert (ROOT / FIXTURES_README).read_text() == readme_text()
    assert sum(p.stat().st_size for p in MODEL_DIR.rglob("*") if p.is_file()) < 2_000_000
    state = torch.load(MODEL_DIR / "model.pt", weights_only=True)
    assert state["fc.weight"].shape == (5, 64) and state["where.weight"].shape == (2, 32, 3, 3)


def test_the_builders_check_tolerates_figures_but_not_settings():
    from fixtures.builder.build import _compare_accuracy

    committed = (MODEL_DIR / "accuracy.json").read_bytes()
    record = json.loads(committed)

    def rebuilt(**changes: Any) -> bytes:
        return json.dumps({**record, **changes}).encode()

    assert _compare_accuracy(rebuilt(held_out_pixel_accuracy=record["held_out_pixel_accuracy"] - 0.004), committed) is None
    assert "held_out_shape_pixel_accuracy" in _compare_accuracy(rebuilt(held_out_shape_pixel_accuracy=0.5), committed)
    assert "settings differ" in _compare_accuracy(rebuilt(epochs=6), committed)
    assert "settings differ" in _compare_accuracy(rebuilt(held_out_seed=5), committed)  # an int: a setting


def test_manifest_is_what_model_archiver_writes():
    pytest.importorskip("model_archiver")
    from model_archiver.manifest_components.manifest import Manifest
    from model_archiver.manifest_components.model import Model

    text = (MODEL_DIR / "MAR-INF" / "MANIFEST.json").read_text()
    archived = Manifest(runtime="python", model=Model(
        model_name="image_segmenter", serialized_file="model.pt", handler="image_segmenter",
        model_file="model.py", model_version="1.0", config_file="model-config.yaml",
    ))
    archived.manifest_dict["createdOn"] = json.loads(text)["createdOn"]
    assert text == str(archived)


# ---------------------------------------------------------------------------- TorchServe's own handler
@pytest.fixture(scope="module")
def theirs() -> hk.Harness:
    from ts.torch_handler.image_segmenter import ImageSegmenter as TsImageSegmenter

    with ts_imports(MODEL_DIR):
        harness = hk.Harness(TsImageSegmenter(), hk.MockContext.from_model_dir(MODEL_DIR))
        harness.initialize()
    return harness


@pytest.mark.torchserve
def test_torchserves_image_segmenter_gives_the_same_answers_on_the_same_weights(h, theirs):
    batch = hk.batch(*[image(name) for name in NAMES])
    reference = theirs.run(batch).output
    mine = h.run(batch).output
    assert torch.equal(torch.tensor(mine), torch.tensor(reference))  # the same pixels, bit for bit


@pytest.mark.torchserve
def test_one_corrupt_image_fails_alone_where_torchserve_fails_the_batch(h, theirs):
    names = NAMES + ["circle.png", "star.png"]  # 8 requests
    requests = [image(name) for name in names]
    requests[3] = hk.Request.from_file(BAD / "truncated.png")
    output = h.run(hk.batch(*requests)).output
    statuses = [r.code for r in h.context.responses()]
    assert statuses == [200, 200, 200, 400, 200, 200, 200, 200]
    assert output[3]["code"] == 400 and "truncated" in output[3]["error"] and output[3]["fix"]
    for index in (0, 1, 2, 4, 5, 6, 7):
        [alone] = h.run(hk.batch(image(names[index]))).output
        assert same(output[index], alone), index
    with pytest.raises(hk.StageError, match="truncated"):
        theirs.run(hk.batch(*requests))


# ---------------------------------------------------------------------------- requests
def test_every_request_format_gives_the_same_answer(h):
    png = (IMAGES / "circle.png").read_bytes()
    [reference] = h.run(hk.batch(hk.Request.from_bytes(png, "image/png"))).output
    pixels = ImageSegmenter.image_processing(Image.open(io.BytesIO(png))).tolist()  # the model input, as JSON
    rows = [{"body": png}, {"data": bytearray(png)}, {"body": base64.b64encode(png).decode()}, {"body": pixels}]
    for answer in h.handler.handle(rows, h.context):
        assert same(answer, reference)
    wire = h.run(hk.batch(hk.Request.form({"data": (png, "image/png")}), hk.Request.json(pixels))).output
    assert same(wire[0], reference) and same(wire[1], reference)


def test_check_passes(h):
    report = h.check(hk.batch(image("square.png"), hk.Request.from_bytes(b"", "image/png"), image("star.jpg")))
    assert report.ok, report
    assert [verdict for _, verdict in report.parity] == ["same alone and in the batch"] * 3
    assert [code for code, _ in report.statuses] == [200, 400, 200]


def test_a_batch_of_only_bad_requests_never_calls_the_model(h, monkeypatch):
    def boom(*args):
        raise AssertionError("the model ran")

    monkeypatch.setattr(h.handler, "model", boom)
    batch = hk.batch(hk.Request.from_file(BAD / "not_an_image.txt"), hk.Request.text("not base64!"))
    assert [item["code"] for item in h.run(batch).output] == [400, 400]


# ---------------------------------------------------------------------------- the bad-input matrix
# Each fixtures/bad file between two good images, in a child process: a decoder that crashes the
# process (torchvision.io.decode_image on short_pixels.png) cannot pass unseen. One child runs
# every case in turn and reports each as it finishes, so a crash names the case it died in.
_CHILD = r"""
import json, sys, warnings
from pathlib import Path
warnings.simplefilter("ignore")  # e.g. "declared text/plain but is not UTF-8": not the point here
import handlerkit as hk

spec, model_dir, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
ctx = hk.MockContext.from_model_dir(model_dir)
handler = hk.Harness(spec, ctx).handler
handler.initialize(ctx)
images = Path(model_dir).parents[1] / "images"


def answer(requests):
    batch = hk.batch(*requests)
    batch.bind(ctx)
    return handler.handle(batch.data, ctx), [ctx.get_response_status(i)[0] for i in range(len(requests))]


def summary(item):  # small enough to send back: a segmenter's class counts, a detector's labels
    if isinstance(item, dict):
        return item
    if not item or isinstance(item[0], dict):
        return {"labels": [next(iter(d)) for d in item], "boxes": [next(iter(d.values())) for d in item]}
    counts = {}
    for row in item:
        for cls, _ in row:
            counts[int(cls)] = counts.get(int(cls), 0) + 1
    return {"classes": counts, "size": [len(item), len(item[0])]}


first, last = hk.Request.from_file(images / "circle.png"), hk.Request.from_file(images / "star.jpg")
alone = [answer([first])[0][0], answer([last])[0][0]]
for name, content_type in cases:
    output, status = answer([first, hk.Request.from_file(Path(model_dir).parents[1] / "bad" / name, content_type), last])
    print(json.dumps({"name": name, "status": status, "middle": summary(output[1]),
                      "neighbours": [summary(output[0]) == summary(alone[0]), summary(output[2]) == summary(alone[1])]}), flush=True)
"""


def bad_inputs_in_a_child(spec: str, model_dir: Path) -> dict[str, Any]:
    """Every fixtures/bad file through handler ``spec`` in one child process: name -> its result."""
    from handlers.test_vision_safety import ANSWERED, REFUSED

    cases = [(name, REFUSED[name][0] if name in REFUSED else None) for name in sorted(set(REFUSED) | set(ANSWERED))]
    child = subprocess.run([sys.executable, "-c", _CHILD, spec, str(model_dir), json.dumps(cases)],
                           capture_output=True, text=True, timeout=300, cwd=ROOT)
    results = {line["name"]: line for line in map(json.loads, child.stdout.splitlines())}
    done = len(results)
    assert child.returncode == 0, f"the child died (exit code {child.returncode}) after {done} case(s), in {cases[done:][:1]}: {child.stderr[-2000:]}"
    assert len(results) == len(cases)
    for name, (_, code, _) in REFUSED.items():
        middle = results[name]["middle"]
        assert results[name]["status"] == [200, code, 200] and middle["code"] == code, (name, results[name])
        assert middle["error"] and middle["fix"], name
    for name in ANSWERED:
        assert results[name]["status"] == [200, 200, 200] and "code" not in results[name]["middle"], (name, results[name])
    assert all(result["neighbours"] == [True, True] for result in results.values())
    return {name: results[name]["middle"] for name in ANSWERED}


def test_every_bad_input_fails_alone_and_the_process_survives():
    answered = bad_inputs_in_a_child("image_segmenter", MODEL_DIR)
    shapes = {"alpha.png": 1, "gray16.png": 2, "palette_transparent.png": 3, "cmyk.jpg": 4, "grayscale.jpg": 5}
    for name, shape in shapes.items():
        counts = {int(k): v for k, v in answered[name]["classes"].items()}
        assert answered[name]["size"] == [224, 224] and max(counts, key=counts.get) == 0, name  # mostly background
        assert set(counts) == {0, shape} and counts[shape] > 2000, (name, counts)
    assert answered["one_pixel.png"]["size"] == [224, 224]


# ---------------------------------------------------------------------------- the model's output
def test_a_plain_logits_tensor_is_taken_too():
    logits = torch.tensor([[[[0.0, 2.0]], [[1.0, 0.0]]]])  # [1, 2 classes, 1, 2]
    [answer] = ImageSegmenter().postprocess(logits)
    first, second = (torch.softmax(torch.tensor(pair), 0).max().item() for pair in ([0.0, 1.0], [2.0, 0.0]))
    assert answer == [[[1.0, pytest.approx(first)], [0.0, pytest.approx(second)]]]
    assert ImageSegmenter().postprocess({"out": logits, "aux": logits}) == [answer]  # torchvision's FCN adds "aux"


@pytest.mark.parametrize(
    ("output", "got"),
    [({"logits": torch.zeros(1, 2, 3, 3)}, "a dict with keys ['logits']"),
     ({"out": torch.zeros(2, 3)}, "'out' = Tensor[2, 3]"),
     ([torch.zeros(1, 2, 3, 3)], "list[1] of Tensor")],
)
def test_a_model_output_of_another_kind_names_what_came(output, got):
    with pytest.raises(HandlerkitError, match=r"return \{'out': logits \[N, classes, H, W\]\}") as info:
        ImageSegmenter().postprocess(output)
    assert got in str(info.value) and info.value.fix


def test_explanations_are_refused_clearly(h):
    with pytest.raises(hk.StageError, match="segmentation model has no single score per class"):
        h.run(hk.batch(image("circle.png").with_headers(explain="True")))
