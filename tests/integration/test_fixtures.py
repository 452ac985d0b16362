"""The committed fixtures behave as fixtures/README.md says, and the shapes generator is sound.

Nothing here trains: the builder itself is checked by `python -m fixtures.builder --check`
(from the repository root; about a minute).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image, UnidentifiedImageError
from torchvision import transforms
from torchvision.ops import masks_to_boxes

from fixtures.builder import build, inputs, spec
from fixtures.builder.shapes import CLASSES, make_shape_image, make_shapes_dataset

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"
MODEL_DIR = FIXTURES / "models" / "image_classifier"
DEMO = ROOT / "handlerkit" / "assets" / "demo"
PIL_DEFAULT_MAX_IMAGE_PIXELS = int(1024 * 1024 * 1024 // 4 // 3)

# TorchServe 0.12 ImageClassifier.image_processing, verbatim.
TORCHSERVE_TRANSFORM = transforms.Compose([
    transforms.Resize(256),
    transforms.CenterCrop(224),
    transforms.ToTensor(),
    transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
])

SAMPLE_IMAGES = [(name, kind) for name, kind, _, _ in spec.SAMPLES]


@pytest.fixture(scope="module")
def model_module():
    spec = importlib.util.spec_from_file_location("fixture_image_classifier_model", MODEL_DIR / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def model(model_module):
    model = model_module.ShapesClassifier()
    model.load_state_dict(torch.load(MODEL_DIR / "model.pt", weights_only=True))
    return model.eval()


# --- the model directory ---------------------------------------------------------------------


def test_model_py_defines_exactly_one_class(model_module):
    classes = [v for v in vars(model_module).values()
               if isinstance(v, type) and v.__module__ == model_module.__name__]
    assert [c.__name__ for c in classes] == ["ShapesClassifier"]


def test_model_is_small_and_ends_in_the_label_layer(model):
    assert (MODEL_DIR / "model.pt").stat().st_size < 1_000_000
    assert model.num_classes == 5
    last = list(model.modules())[-1]
    assert isinstance(last, torch.nn.Linear) and last.out_features == 5


def test_index_to_name_matches_the_output_width(model):
    mapping = json.loads((MODEL_DIR / "index_to_name.json").read_text())
    assert mapping == {str(i): name for i, name in enumerate(CLASSES)}
    with torch.inference_mode():
        assert model(torch.zeros(2, 3, 224, 224)).shape == (2, len(mapping))


@pytest.mark.parametrize(("name", "kind"), SAMPLE_IMAGES)
def test_sample_image_is_predicted_as_its_class(model, name, kind):
    with Image.open(FIXTURES / "images" / name) as image:
        assert image.mode == "RGB"  # TorchServe's vision handlers do not convert
        x = TORCHSERVE_TRANSFORM(image)[None]
    with torch.inference_mode():
        probs = torch.softmax(model(x), dim=1)[0]
    assert CLASSES[int(probs.argmax())] == kind
    assert float(probs.max()) >= spec.MIN_SAMPLE_CONFIDENCE


def test_grace_hopper_is_a_real_photo_the_model_accepts(model):
    with Image.open(FIXTURES / "images" / "grace_hopper.jpg") as image:
        assert image.mode == "RGB" and image.format == "JPEG"
        x = TORCHSERVE_TRANSFORM(image)[None]
    with torch.inference_mode():
        assert model(x).shape == (1, 5)


def test_manifest_is_what_model_archiver_writes():
    pytest.importorskip("model_archiver")
    from model_archiver.manifest_components.manifest import Manifest
    from model_archiver.manifest_components.model import Model

    text = (MODEL_DIR / "MAR-INF" / "MANIFEST.json").read_text()
    archived = Manifest(runtime="python", model=Model(
        model_name="image_classifier", serialized_file="model.pt", handler="image_classifier",
        model_file="model.py", model_version="1.0", config_file="model-config.yaml",
    ))
    archived.manifest_dict["createdOn"] = json.loads(text)["createdOn"]
    assert text == str(archived)


def test_model_config():
    config = yaml.safe_load((MODEL_DIR / "model-config.yaml").read_text())
    assert config == {"minWorkers": 1, "maxWorkers": 1, "batchSize": 4, "maxBatchDelay": 50,
                      "responseTimeout": 120}


def test_accuracy_record():
    record = json.loads((MODEL_DIR / "accuracy.json").read_text())
    assert record["held_out_accuracy"] >= 0.95
    assert record["n_held_out"] == spec.N_HELD_OUT


def test_small_files_match_the_builder():
    """Everything that needs no training is regenerated here and compared byte for byte."""
    assert (MODEL_DIR / "model.py").read_text() == spec.MODEL_SOURCE
    assert (MODEL_DIR / "model-config.yaml").read_text() == spec.MODEL_CONFIG
    assert (MODEL_DIR / "index_to_name.json").read_text() == spec.index_to_name_json()
    assert (MODEL_DIR / "MAR-INF" / "MANIFEST.json").read_text() == spec.manifest_json()
    assert (FIXTURES / "README.md").read_text() == build.readme_text()
    images = inputs.sample_images()
    for name, data in images.items():
        assert (FIXTURES / "images" / name).read_bytes() == data, name
        assert (ROOT / spec.image_path(name)).read_bytes() == data, name
    for name, data in inputs.bad_inputs(images).items():
        assert (FIXTURES / "bad" / name).read_bytes() == data, name


def test_fixture_paths_are_symlinks_into_the_demo_assets():
    """git keeps one copy: the model dir and the demo images link into handlerkit/assets/demo."""
    assert spec.links() == {
        Path("fixtures/models/image_classifier"): "../../handlerkit/assets/demo/image_classifier",
        Path("fixtures/images/circle.png"): "../../handlerkit/assets/demo/images/circle.png",
        Path("fixtures/images/star.jpg"): "../../handlerkit/assets/demo/images/star.jpg",
        Path("fixtures/images/grace_hopper.jpg"): "../../handlerkit/assets/demo/images/grace_hopper.jpg",
    }
    for link, target in spec.links().items():
        path = ROOT / link
        assert path.is_symlink() and os.readlink(path) == target, link
        assert path.resolve() == (ROOT / link.parent / target).resolve()
        assert path.resolve().is_relative_to(DEMO.resolve()) and path.exists(), link
    assert MODEL_DIR.resolve() == (DEMO / "image_classifier").resolve()
    # The demo assets are real files (the wheel ships them), and only the documented ones.
    assert all(not p.is_symlink() for p in DEMO.rglob("*"))
    assert sorted(p.name for p in (DEMO / "images").iterdir()) == sorted(spec.DEMO_IMAGES)
    assert sorted(p.relative_to(DEMO / "image_classifier").as_posix()
                  for p in (DEMO / "image_classifier").rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts) == sorted(
        name.split("/", 1)[1] for name in spec.DESCRIPTIONS if name.startswith("image_classifier/"))


def test_link_helpers_replace_copies_and_refuse_real_dirs(tmp_path):
    """The builder turns a stale copy into the symlink, and --check tells copies from links."""
    link, target = Path("fixtures/images/circle.png"), "../../handlerkit/assets/demo/images/circle.png"
    (tmp_path / spec.DEMO_IMAGES_DIR).mkdir(parents=True)
    (tmp_path / spec.DEMO_IMAGES_DIR / "circle.png").write_bytes(b"png")
    (tmp_path / link.parent).mkdir(parents=True)
    (tmp_path / link).write_bytes(b"png")  # a copy, as before the symlinks
    assert build._link_problem(tmp_path / link, target) == (
        f"expected a symlink to {target}, found a regular file or directory")
    build._link(tmp_path / link, target)
    assert os.readlink(tmp_path / link) == target and (tmp_path / link).read_bytes() == b"png"
    assert build._link_problem(tmp_path / link, target) is None
    assert build._link_problem(tmp_path / link, "elsewhere.png") == f"links to {target}, expected elsewhere.png"
    (tmp_path / spec.MODEL_LINK).mkdir(parents=True)
    with pytest.raises(spec.BuildError, match=r"models/image_classifier is a directory, expected a "
                                              r"symlink to \.\./\.\./handlerkit/assets/demo/image_classifier"):
        build._refuse_real_dirs(tmp_path)


def test_fixture_sizes_stay_small():
    files = {p.resolve() for d in (FIXTURES, DEMO) for p in d.rglob("*") if p.is_file()}
    assert sum(p.stat().st_size for p in files) < 3_000_000


# --- bad inputs ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["truncated.png", "truncated.jpg", "corrupt.png"])
def test_broken_image_opens_but_fails_to_decode(name):
    with Image.open(FIXTURES / "bad" / name) as image:  # the header parses
        with pytest.raises(OSError, match="truncated|broken data stream"):
            image.load()


def test_bomb_raises_under_pils_default_limit(monkeypatch):
    # TorchServe's vision handlers set MAX_IMAGE_PIXELS = None process-wide; restore the default.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", PIL_DEFAULT_MAX_IMAGE_PIXELS)
    path = FIXTURES / "bad" / "bomb.png"
    assert path.stat().st_size < 100_000
    with pytest.raises(Image.DecompressionBombError):
        Image.open(path)


def test_text_and_empty_inputs():
    data = (FIXTURES / "bad" / "not_utf8.txt").read_bytes()
    with pytest.raises(UnicodeDecodeError):
        data.decode("utf-8")
    assert "café" in data.decode("latin-1")
    assert (FIXTURES / "bad" / "empty.bin").stat().st_size == 0
    for name in ("not_an_image.txt", "empty.bin"):
        with pytest.raises(UnidentifiedImageError):
            Image.open(FIXTURES / "bad" / name)


# --- the shapes generator --------------------------------------------------------------------


def test_dataset_is_deterministic_and_per_index():
    first, again = make_shapes_dataset(10, seed=7), make_shapes_dataset(10, seed=7)
    for a, b in zip(first, again):
        assert np.array_equal(np.asarray(a.image), np.asarray(b.image))
        assert np.array_equal(a.mask, b.mask) and a.box == b.box and a.label == b.label
    # Sample i does not depend on how many are drawn; another seed draws other images.
    prefix = make_shapes_dataset(3, seed=7)
    assert all(np.array_equal(np.asarray(a.image), np.asarray(b.image)) for a, b in zip(prefix, first))
    other = make_shapes_dataset(3, seed=8)
    assert not np.array_equal(np.asarray(other[0].image), np.asarray(first[0].image))
    assert [s.kind for s in first] == [CLASSES[i % 5] for i in range(10)]


@pytest.mark.parametrize("background", ["plain", "gradient", "noise"])
@pytest.mark.parametrize("kind", CLASSES)
def test_mask_and_box_match_the_drawn_shape(kind, background):
    image, mask, box = make_shape_image(kind, np.random.default_rng(3), background=background)
    pixels = np.asarray(image)
    assert image.mode == "RGB" and image.size == (256, 256)
    assert mask.dtype == bool and mask.shape == (256, 256)
    area = int(mask.sum())
    assert 0.02 * mask.size < area < 0.5 * mask.size
    x0, y0, x1, y1 = box
    assert mask[y0:y1 + 1, x0:x1 + 1].sum() == area  # every mask pixel is inside the box
    assert mask[y0].any() and mask[y1].any() and mask[:, x0].any() and mask[:, x1].any()
    assert list(box) == masks_to_boxes(torch.from_numpy(mask)[None])[0].int().tolist()
    # The shape is painted in one colour, exactly through the mask.
    assert len(np.unique(pixels[mask], axis=0)) == 1
    shape_colour = pixels[mask][0]
    assert not (pixels[~mask] == shape_colour).all(axis=1).any()


def test_unknown_shape_is_rejected():
    with pytest.raises(ValueError, match="unknown shape 'hexagon'"):
        make_shape_image("hexagon", np.random.default_rng(0))
