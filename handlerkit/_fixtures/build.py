"""Build every committed fixture from code: the shapes classifier, sample and bad images.

``python -m handlerkit._fixtures`` (from the repository root) writes ``fixtures/`` and
``handlerkit/assets/demo/``; ``--check`` rebuilds into a temporary directory and compares the
result with what is committed. Everything is seeded, so a rebuild on the same machine is
byte-identical; on another CPU the trained weights may differ in the last bits, which is why
``model.pt`` (and the accuracy it yields) is compared with a tolerance.

Pre-processing is TorchServe 0.12's ``ImageClassifier.image_processing``, torchvision
transforms v1: ``Resize(256) -> CenterCrop(224) -> ToTensor() -> Normalize(ImageNet)``. The
shapes images are 256 x 256, so ``Resize(256)`` is a copy. To keep memory small, training
caches the uint8 centre crops and applies ``ToTensor`` + ``Normalize`` per batch with the same
tensor operations; the builder checks that this gives bit-identical tensors to the real
transform before training.
"""

from __future__ import annotations

import importlib.util
import io
import json
import math
import struct
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from handlerkit._fixtures.shapes import CLASSES, iter_shapes, make_shape_image

# --- what is built ---------------------------------------------------------------------------

MODEL_NAME = "image_classifier"
MODEL_DIR = Path("fixtures/models") / MODEL_NAME
IMAGES_DIR = Path("fixtures/images")
BAD_DIR = Path("fixtures/bad")
DEMO_DIR = Path("handlerkit/assets/demo")
DEMO_IMAGES = ("circle.png", "star.jpg", "grace_hopper.jpg")

N_TRAIN, TRAIN_SEED = 2500, 1
N_HELD_OUT, HELD_OUT_SEED = 500, 2
TORCH_SEED = 0
EPOCHS, BATCH_SIZE, LEARNING_RATE = 10, 50, 5e-3
MIN_ACCURACY = 0.95
MIN_SAMPLE_CONFIDENCE = 0.9  # sample images must be unambiguous, not just right
NUM_THREADS = 2

# Sample images: (file name, class, rng seed, background). Seeds were picked once (distinct, so
# colours differ) for a shape well inside the 224 centre crop that the model gets right with
# probability > 0.98; the builder checks each is still predicted as its class.
SAMPLES = (
    ("circle.png", "circle", 100, "gradient"),
    ("square.png", "square", 107, "plain"),
    ("triangle.png", "triangle", 221, "gradient"),
    ("star.png", "star", 101, "plain"),
    ("cross.png", "cross", 105, "gradient"),
    ("star.jpg", "star", 102, "gradient"),
)
JPEG_QUALITY = 90

# model_archiver 0.12 writes createdOn with datetime.now(); a fixed value keeps builds equal.
MANIFEST_CREATED_ON = "01/01/2025 00:00:00"
ARCHIVER_VERSION = "0.12.0"

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

MODEL_SOURCE = '''\
"""A tiny CNN that classifies the synthetic "shapes" images.

Classes, in output order: circle, square, triangle, star, cross (see index_to_name.json).
Input: float [N, 3, 224, 224], pre-processed as TorchServe's ImageClassifier does:
Resize(256) -> CenterCrop(224) -> ToTensor() -> Normalize(ImageNet mean, std).
Output: logits [N, 5].

Written by `python -m handlerkit._fixtures`: edit MODEL_SOURCE in handlerkit/_fixtures/build.py
and rebuild rather than editing this file. TorchServe instantiates the one class defined here
with no arguments and loads model.pt into it.
"""

import torch
import torch.nn.functional as F
from torch import nn


def _conv_block(in_channels, out_channels, stride):
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


def _distance_from_border_colour(x):
    # Shape and background colours are random, so the net looks at how far each pixel is
    # from the mean colour of the image border (mostly background): [N, 3, H, W] -> [N, 1, H, W].
    border = torch.cat([x[:, :, 0], x[:, :, -1], x[:, :, :, 0], x[:, :, :, -1]], dim=2)
    background = border.mean(dim=2)[:, :, None, None]
    return (x - background).abs().sum(dim=1, keepdim=True)


class ShapesClassifier(nn.Module):
    num_classes = 5

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            _conv_block(1, 16, 1),  # 56 x 56
            _conv_block(16, 32, 2),  # 28 x 28
            _conv_block(32, 64, 2),  # 14 x 14
            _conv_block(64, 64, 2),  # 7 x 7
        )
        # The last registered module: handlers read its out_features as the label count.
        self.fc = nn.Linear(64, self.num_classes)

    def forward(self, x):
        # The shapes are large and flat, so a quarter of the resolution is plenty (224 -> 56).
        x = F.avg_pool2d(x, 4)
        x = _distance_from_border_colour(x)
        x = self.features(x)
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)
'''

MODEL_CONFIG = """\
# TorchServe model config for the shapes classifier (fixtures/models/image_classifier).
# Written by `python -m handlerkit._fixtures`; edit handlerkit/_fixtures/build.py instead.
minWorkers: 1
maxWorkers: 1
batchSize: 4
maxBatchDelay: 50
responseTimeout: 120
# No `handler:` section: TorchServe's image_classifier reads no keys from it (its topk is a
# class attribute, 5, which matches the 5 classes). Add `handler: {profile: true}` to record
# per-stage ts_handler_<stage> metrics.
"""

# File -> description; the README table and the --check listing come from here.
DESCRIPTIONS = {
    f"{MODEL_DIR.name}/model.py": "`ShapesClassifier`, the only class in the file (no-arg constructor)",
    f"{MODEL_DIR.name}/model.pt": "its state_dict (`torch.load(..., weights_only=True)`)",
    f"{MODEL_DIR.name}/index_to_name.json": '`{"0": "circle", ...}`, 5 labels in output order',
    f"{MODEL_DIR.name}/model-config.yaml": "batchSize 4, one worker; no `handler:` keys",
    f"{MODEL_DIR.name}/MAR-INF/MANIFEST.json": "as model_archiver 0.12 writes it, fixed createdOn",
    f"{MODEL_DIR.name}/accuracy.json": "held-out accuracy, sample counts, seeds, versions",
    **{f"images/{name}": f"a {kind} the model classifies correctly ({background} background)"
       for name, kind, _, background in SAMPLES},
    "images/grace_hopper.jpg": "real photo (public domain, from matplotlib's sample data); "
                               "out of distribution for the shapes model",
    "bad/truncated.png": "circle.png cut in half: opens (header intact), fails on load()",
    "bad/truncated.jpg": "star.jpg cut in half: opens, fails on load()",
    "bad/corrupt.png": "valid signature and IHDR, an IDAT of garbage (valid CRC): opens, fails on "
                       "load(). torchvision.io.decode_image may crash on such files: use PIL",
    "bad/bomb.png": "1-bit 20000 x 20000 all-zero PNG (~49 KB): Image.open raises "
                    "DecompressionBombError under PIL's default MAX_IMAGE_PIXELS",
    "bad/not_utf8.txt": "Latin-1 text (0xE9 for é): bytes.decode('utf-8') raises",
    "bad/empty.bin": "0 bytes",
    "bad/not_an_image.txt": "plain UTF-8 text: Image.open raises UnidentifiedImageError",
}


class BuildError(RuntimeError):
    """A built fixture does not behave as documented (e.g. accuracy below the bar)."""


@dataclass
class BuildResult:
    accuracy: float
    seconds: float
    files: list[Path]  # relative to the output root


# --- small helpers ---------------------------------------------------------------------------


def _write(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.write_bytes(data)


def _json(obj: object) -> str:
    return json.dumps(obj, indent=2) + "\n"


def manifest_json() -> str:
    """MAR-INF/MANIFEST.json as ``torch-model-archiver`` 0.12 writes it for this model.

    Equivalent to ``torch-model-archiver --model-name image_classifier --version 1.0
    --model-file model.py --serialized-file model.pt --handler image_classifier
    --extra-files index_to_name.json --config-file model-config.yaml``: same keys, order and
    ``indent=2`` layout, no trailing newline, but a fixed ``createdOn``.
    """
    manifest = {
        "createdOn": MANIFEST_CREATED_ON,
        "runtime": "python",
        "model": {
            "modelName": MODEL_NAME,
            "serializedFile": "model.pt",
            "handler": "image_classifier",
            "modelFile": "model.py",
            "modelVersion": "1.0",
            "configFile": "model-config.yaml",
        },
        "archiverVersion": ARCHIVER_VERSION,
    }
    return json.dumps(manifest, indent=2)


def load_model_class(model_py: Path) -> type:
    """Import ``model_py`` by path and return the one class it defines (TorchServe's rule)."""
    spec = importlib.util.spec_from_file_location(f"_hk_fixture_model_{model_py.parent.name}", model_py)
    if spec is None or spec.loader is None:
        raise BuildError(f"cannot import {model_py}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    classes = [v for v in vars(module).values()
               if isinstance(v, type) and v.__module__ == module.__name__]
    if len(classes) != 1:
        raise BuildError(f"{model_py} must define exactly one class, found {len(classes)}")
    return classes[0]


def torchserve_transform():
    """TorchServe 0.12 ``ImageClassifier.image_processing``, verbatim."""
    from torchvision import transforms

    return transforms.Compose([
        transforms.Resize(256),
        transforms.CenterCrop(224),
        transforms.ToTensor(),
        transforms.Normalize(mean=list(IMAGENET_MEAN), std=list(IMAGENET_STD)),
    ])


# --- training --------------------------------------------------------------------------------


def _crops(n: int, seed: int):
    """uint8 [n, 224, 224, 3] centre crops (Resize(256) + CenterCrop(224)) and int64 labels."""
    import torch
    from torchvision import transforms

    crop = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224)])
    pixels = torch.empty((n, 224, 224, 3), dtype=torch.uint8)
    labels = torch.empty(n, dtype=torch.int64)
    for i, sample in enumerate(iter_shapes(n, seed)):
        pixels[i] = torch.from_numpy(np.array(crop(sample.image)))
        labels[i] = sample.label
    return pixels, labels


def _to_input(pixels):
    """ToTensor() + Normalize() on a batch of uint8 HWC crops, with torchvision's own ops."""
    import torch

    x = pixels.permute(0, 3, 1, 2).contiguous().to(dtype=torch.float32).div(255)
    mean = torch.as_tensor(IMAGENET_MEAN, dtype=torch.float32).view(-1, 1, 1)
    std = torch.as_tensor(IMAGENET_STD, dtype=torch.float32).view(-1, 1, 1)
    return x.sub_(mean).div_(std)


def _check_fast_path_matches_transform(n: int = 8) -> None:
    import torch

    transform = torchserve_transform()
    samples = list(iter_shapes(n, TRAIN_SEED))
    pixels, _ = _crops(n, TRAIN_SEED)
    expected = torch.stack([transform(s.image) for s in samples])
    if not torch.equal(_to_input(pixels), expected):
        raise BuildError("cached pre-processing differs from TorchServe's transform")


def _accuracy(model, pixels, labels) -> float:
    import torch

    model.eval()
    correct = 0
    with torch.inference_mode():
        for start in range(0, len(labels), 100):
            logits = model(_to_input(pixels[start:start + 100]))
            correct += int((logits.argmax(1) == labels[start:start + 100]).sum())
    return correct / len(labels)


def train(model_cls: type, log: Callable[[str], None]):
    """Train ``model_cls()`` on the shapes data; return (model, held-out accuracy)."""
    import torch
    import torch.nn.functional as F

    _check_fast_path_matches_transform()
    t0 = time.perf_counter()
    train_x, train_y = _crops(N_TRAIN, TRAIN_SEED)
    test_x, test_y = _crops(N_HELD_OUT, HELD_OUT_SEED)
    log(f"  generated {N_TRAIN} + {N_HELD_OUT} images in {time.perf_counter() - t0:.1f} s")

    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(NUM_THREADS)
    torch.use_deterministic_algorithms(True)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(TORCH_SEED)
            model = model_cls()
            generator = torch.Generator().manual_seed(TORCH_SEED)
            optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
            steps = EPOCHS * math.ceil(N_TRAIN / BATCH_SIZE)
            schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, LEARNING_RATE, total_steps=steps)
            for epoch in range(EPOCHS):
                t0 = time.perf_counter()
                model.train()
                order = torch.randperm(N_TRAIN, generator=generator)
                total = 0.0
                for start in range(0, N_TRAIN, BATCH_SIZE):
                    index = order[start:start + BATCH_SIZE]
                    loss = F.cross_entropy(model(_to_input(train_x[index])), train_y[index])
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    schedule.step()
                    total += loss.item() * len(index)
                log(f"  epoch {epoch + 1}/{EPOCHS}: loss {total / N_TRAIN:.4f} "
                    f"({time.perf_counter() - t0:.1f} s)")
            accuracy = _accuracy(model, test_x, test_y)
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch.set_num_threads(threads)
    return model, accuracy


# --- bad inputs ------------------------------------------------------------------------------


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def _png(width: int, height: int, bit_depth: int, colour_type: int, idat: bytes) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat)
            + _png_chunk(b"IEND", b""))


def bomb_png(side: int = 20000) -> bytes:
    """A valid 1-bit ``side`` x ``side`` all-black PNG; tiny on disk, huge when decoded."""
    row = bytes(1 + math.ceil(side / 8))  # filter byte 0 + packed zero bits
    compressor = zlib.compressobj(9)
    idat = b"".join(compressor.compress(row) for _ in range(side)) + compressor.flush()
    return _png(side, side, 1, 0, idat)


def corrupt_png() -> bytes:
    """Signature and IHDR of a 64 x 64 RGB image, then an IDAT of random (non-zlib) bytes."""
    garbage = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    return _png(64, 64, 8, 2, garbage)


def bad_inputs(images: dict[str, bytes]) -> dict[str, bytes]:
    """``fixtures/bad`` file name -> content (truncations are of the given sample images)."""
    png, jpg = images["circle.png"], images["star.jpg"]
    return {
        "truncated.png": png[: len(png) // 2],
        "truncated.jpg": jpg[: len(jpg) // 2],
        "corrupt.png": corrupt_png(),
        "bomb.png": bomb_png(),
        "not_utf8.txt": "Crème brûlée, café, naïve: Latin-1, not UTF-8.\n".encode("latin-1"),
        "empty.bin": b"",
        "not_an_image.txt": b"This is plain text, not an image.\n",
    }


def verify_bad_inputs(bad: dict[str, bytes]) -> None:
    """Check each bad input fails the way fixtures/README.md says it does."""
    from PIL import UnidentifiedImageError

    def fails_to_load(data: bytes) -> bool:
        try:
            with Image.open(io.BytesIO(data)) as image:
                image.load()
        except (OSError, SyntaxError, ValueError):
            return True
        return False

    problems = []
    limit = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = int(1024 * 1024 * 1024 // 4 // 3)  # PIL's default
    try:
        for name in ("truncated.png", "truncated.jpg", "corrupt.png"):
            try:
                Image.open(io.BytesIO(bad[name])).close()  # the header must still parse
            except (OSError, SyntaxError) as exc:
                problems.append(f"{name} does not even open: {exc}")
                continue
            if not fails_to_load(bad[name]):
                problems.append(f"{name} decodes without error")
        try:
            Image.open(io.BytesIO(bad["bomb.png"]))
            problems.append("bomb.png does not raise DecompressionBombError")
        except Image.DecompressionBombError:
            pass
    finally:
        Image.MAX_IMAGE_PIXELS = limit
    if len(bad["bomb.png"]) >= 100_000:
        problems.append(f"bomb.png is {len(bad['bomb.png'])} bytes, expected < 100 KB")
    try:
        bad["not_utf8.txt"].decode("utf-8")
        problems.append("not_utf8.txt is valid UTF-8")
    except UnicodeDecodeError:
        pass
    try:
        Image.open(io.BytesIO(bad["not_an_image.txt"]))
        problems.append("not_an_image.txt opens as an image")
    except UnidentifiedImageError:
        pass
    if problems:
        raise BuildError("bad inputs misbehave: " + "; ".join(problems))


# --- images ----------------------------------------------------------------------------------


def sample_images() -> dict[str, bytes]:
    """``fixtures/images`` file name -> encoded bytes for the drawn samples (no model needed)."""
    out = {}
    for name, kind, seed, background in SAMPLES:
        image, _, _ = make_shape_image(kind, np.random.default_rng(seed), background=background)
        buffer = io.BytesIO()
        if name.endswith(".jpg"):
            image.save(buffer, format="JPEG", quality=JPEG_QUALITY)
        else:
            image.save(buffer, format="PNG")
        out[name] = buffer.getvalue()
    return out


def grace_hopper_bytes() -> bytes:
    import matplotlib.cbook

    return Path(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)).read_bytes()


def verify_predictions(model, images: dict[str, bytes], log: Callable[[str], None]) -> None:
    """Each sample image, decoded from its bytes, must be predicted as its class."""
    import torch

    transform = torchserve_transform()
    model.eval()
    wrong = []
    for name, kind, _, _ in SAMPLES:
        with Image.open(io.BytesIO(images[name])) as image:
            x = transform(image)[None]
        with torch.inference_mode():
            probs = torch.softmax(model(x), 1)[0]
        predicted = CLASSES[int(probs.argmax())]
        log(f"  {name}: {predicted} ({float(probs.max()):.3f})")
        if predicted != kind or float(probs.max()) < MIN_SAMPLE_CONFIDENCE:
            wrong.append(f"{name} predicted {predicted} ({float(probs.max()):.3f})")
    if wrong:
        raise BuildError(
            f"sample images must be predicted as their class with p >= {MIN_SAMPLE_CONFIDENCE}: "
            + ", ".join(wrong) + "; pick other seeds in SAMPLES"
        )


# --- README ----------------------------------------------------------------------------------


def readme() -> str:
    rows = "\n".join(f"| `{name}` | {text} |" for name, text in DESCRIPTIONS.items())
    return f"""\
# fixtures

Small, real, deterministic data for tests, notebooks and `handlerkit demo`. Everything here
(and `handlerkit/assets/demo/`) is written by the builder; do not edit by hand.

```
python -m handlerkit._fixtures            # rebuild (from the repository root; ~1 min on 2 CPUs)
python -m handlerkit._fixtures --check    # rebuild in a temp dir and compare with these files
```

The **shapes** dataset (`handlerkit._fixtures.shapes`) draws one circle, square, triangle, star
or cross per 256 x 256 RGB image with PIL, keeping each shape's mask and box, so the same data
can train a classifier, a segmenter and a detector. `models/image_classifier` is a tiny CNN
trained on {N_TRAIN} of them for TorchServe's `image_classifier` handler (pre-processing
`Resize(256) -> CenterCrop(224) -> ToTensor() -> Normalize(ImageNet)`). The builder fails
unless the model reaches {MIN_ACCURACY:.0%} on {N_HELD_OUT} other images (`accuracy.json` has the
figure) and predicts every sample image's class with p >= {MIN_SAMPLE_CONFIDENCE}. Rebuilds are
byte-identical on the same machine; on another CPU `model.pt` may differ in the last bits, so
`--check` compares it with a tolerance.

Paths are relative to `fixtures/models/` for the model and to `fixtures/` otherwise:

| file | what it is |
| --- | --- |
{rows}

`handlerkit/assets/demo/` holds byte-identical copies of `models/image_classifier/` and of
`images/{{{", ".join(DEMO_IMAGES)}}}` so the installed package can run a demo.

Note: TorchServe's vision handlers set `PIL.Image.MAX_IMAGE_PIXELS = None` (process-wide) when
`limit_max_image_pixels` is false; `bomb.png` only raises under PIL's default limit.
"""


# --- the build -------------------------------------------------------------------------------


def build(out_root: Path | str = ".", log: Callable[[str], None] = print) -> BuildResult:
    """Write all fixtures and demo assets under ``out_root``; raise BuildError if one is off.

    Everything is built in a staging directory first, so a failed build changes nothing.
    """
    root = Path(out_root)
    log(f"building fixtures for {root.resolve()}")
    with tempfile.TemporaryDirectory(prefix="handlerkit-fixtures-") as staging:
        result = _build_into(Path(staging), log)
        for relative in result.files:
            _write(root / relative, (Path(staging) / relative).read_bytes())
    log(f"wrote {len(result.files)} files in {result.seconds:.1f} s")
    return result


def _build_into(root: Path, log: Callable[[str], None]) -> BuildResult:
    import torch

    start = time.perf_counter()
    written: list[Path] = []

    def put(relative: Path, data: bytes | str) -> None:
        _write(root / relative, data)
        written.append(relative)

    model_dir = MODEL_DIR
    put(model_dir / "model.py", MODEL_SOURCE)
    put(model_dir / "index_to_name.json", _json({str(i): name for i, name in enumerate(CLASSES)}))
    put(model_dir / "model-config.yaml", MODEL_CONFIG)
    put(model_dir / "MAR-INF" / "MANIFEST.json", manifest_json())

    log("training the shapes classifier")
    model_cls = load_model_class(root / model_dir / "model.py")
    model, accuracy = train(model_cls, log)
    log(f"held-out accuracy: {accuracy:.4f} ({N_HELD_OUT} images)")
    if accuracy < MIN_ACCURACY:
        raise BuildError(f"held-out accuracy {accuracy:.4f} is below {MIN_ACCURACY}")
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    put(model_dir / "model.pt", buffer.getvalue())
    put(model_dir / "accuracy.json", _json({
        "held_out_accuracy": round(accuracy, 4),
        "n_held_out": N_HELD_OUT,
        "held_out_seed": HELD_OUT_SEED,
        "n_train": N_TRAIN,
        "train_seed": TRAIN_SEED,
        "torch_seed": TORCH_SEED,
        "epochs": EPOCHS,
        "torch": torch.__version__.split("+")[0],
    }))

    # Reload what was written, as a handler would, before judging the sample images.
    reloaded = model_cls()
    reloaded.load_state_dict(torch.load(root / model_dir / "model.pt", weights_only=True))
    log("sample images")
    images = sample_images()
    verify_predictions(reloaded, images, log)
    images["grace_hopper.jpg"] = grace_hopper_bytes()
    for name, data in images.items():
        put(IMAGES_DIR / name, data)

    log("bad inputs")
    bad = bad_inputs(images)
    verify_bad_inputs(bad)
    for name, data in bad.items():
        put(BAD_DIR / name, data)

    put(Path("fixtures/README.md"), readme())

    log("demo assets")
    for relative in [p for p in written if p.parts[:3] == MODEL_DIR.parts]:
        put(DEMO_DIR / MODEL_NAME / relative.relative_to(MODEL_DIR), (root / relative).read_bytes())
    for name in DEMO_IMAGES:
        put(DEMO_DIR / "images" / name, images[name])

    return BuildResult(accuracy, time.perf_counter() - start, written)


# --- --check ---------------------------------------------------------------------------------


def _compare_state_dicts(built: bytes, committed: bytes) -> str | None:
    import torch

    a = torch.load(io.BytesIO(built), weights_only=True)
    b = torch.load(io.BytesIO(committed), weights_only=True)
    if a.keys() != b.keys():
        return f"different keys: {sorted(a.keys() ^ b.keys())}"
    for key in a:
        if a[key].shape != b[key].shape or a[key].dtype != b[key].dtype:
            return f"{key}: {a[key].dtype}{list(a[key].shape)} vs {b[key].dtype}{list(b[key].shape)}"
        if a[key].is_floating_point() and not torch.allclose(a[key], b[key], rtol=1e-3, atol=1e-4):
            diff = float((a[key] - b[key]).abs().max())
            return f"{key} differs by up to {diff:.3g}"
        if not a[key].is_floating_point() and not torch.equal(a[key], b[key]):
            return f"{key} differs"
    return None


def _compare_accuracy(built: bytes, committed: bytes) -> str | None:
    a, b = json.loads(built), json.loads(committed)
    a_rest = {k: v for k, v in a.items() if k not in ("held_out_accuracy", "torch")}
    b_rest = {k: v for k, v in b.items() if k not in ("held_out_accuracy", "torch")}
    if a_rest != b_rest:
        return f"settings differ: {a_rest} vs {b_rest}"
    if abs(a["held_out_accuracy"] - b["held_out_accuracy"]) > 0.01:
        return f"accuracy {a['held_out_accuracy']} vs committed {b['held_out_accuracy']}"
    return None


def check(out_root: Path | str = ".", log: Callable[[str], None] = print) -> int:
    """Rebuild in a temporary directory and compare with ``out_root``; return an exit code."""
    root = Path(out_root)
    with tempfile.TemporaryDirectory(prefix="handlerkit-fixtures-") as tmp:
        log("rebuilding in a temporary directory")
        result = _build_into(Path(tmp), log)
        problems = []
        tolerant: dict[str, Callable[[bytes, bytes], str | None]] = {
            "model.pt": _compare_state_dicts,
            "accuracy.json": _compare_accuracy,
        }
        for relative in result.files:
            committed = root / relative
            if not committed.is_file():
                problems.append(f"{relative}: missing")
                continue
            built, old = (Path(tmp) / relative).read_bytes(), committed.read_bytes()
            if built == old:
                continue
            compare = tolerant.get(relative.name)
            problem = compare(built, old) if compare else "bytes differ"
            if problem:
                problems.append(f"{relative}: {problem}")
            else:
                log(f"{relative}: differs within tolerance")
    log(f"rebuilt {len(result.files)} files in {result.seconds:.1f} s")
    if problems:
        log(f"{len(problems)} fixture(s) differ from a fresh build:")
        for problem in problems:
            log(f"  {problem}")
        log("rebuild with `python -m handlerkit._fixtures` and review the diff")
        return 1
    log("fixtures match a fresh build")
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m handlerkit._fixtures",
        description="Build handlerkit's fixtures/ and handlerkit/assets/demo/ from code.",
    )
    parser.add_argument("--out-root", type=Path, default=Path("."),
                        help="directory that receives fixtures/ and handlerkit/assets/ "
                             "(default: the current directory, i.e. run from the repo root)")
    parser.add_argument("--check", action="store_true",
                        help="rebuild in a temp dir and compare with the files under --out-root")
    args = parser.parse_args(argv)
    try:
        if args.check:
            return check(args.out_root)
        build(args.out_root)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


__all__ = ["build", "check", "main", "BuildError", "BuildResult", "manifest_json",
           "load_model_class", "torchserve_transform", "sample_images", "bad_inputs",
           "verify_bad_inputs"]
