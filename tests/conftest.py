"""Shared fixtures: tiny model dirs written into temporary folders, and TorchServe helpers.

Every model here is built from code in a few milliseconds, except the exported formats
(ONNX ~3 s, AOTInductor ~10-30 s), which are session-scoped. Nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# ---------------------------------------------------------------------------------------------
# Model sources (written as model.py into model dirs)
# ---------------------------------------------------------------------------------------------

#: TorchServe's own unit-test model (ts/torch_handler/unit_tests/models/base_model.py).
ARGMAX_MODEL_PY = '''\
import torch


class ArgmaxModel(torch.nn.Module):
    def forward(self, *input):
        return torch.argmax(input[0], 1)
'''

#: argmax of a bias-free 2x2 Linear: with the identity as weights it is TorchServe's argmax
#: model, with a swap matrix the answers flip, which proves the state_dict was loaded.
ARGMAX_LINEAR_MODEL_PY = '''\
import torch


class ArgmaxLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(2, 2, bias=False)

    def forward(self, x):
        return torch.argmax(self.fc(x), 1)
'''

#: Linear(4, 3) + relu + Linear(3, 3). ``torch.relu`` (not nn.ReLU) so that torch's
#: ``relu_compile_error_TESTING_ONLY`` backend sees it and fails.
#: A forward with a deliberate graph break: ``.item()`` on line 11 of model.py.
BREAK_MODEL_PY = '''\
import torch


class Breaky(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        y = self.fc(x)
        if y.sum().item() > 0:
            y = y * 2
        return y
'''
BREAK_LINE = 11


MLP_MODEL_PY = '''\
import torch


class TinyMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 3)
        self.fc2 = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))
'''

#: A tiny image classifier: 3 x H x W -> NUM_CLASSES scores.
CNN_MODEL_PY = '''\
import torch

NUM_CLASSES = {num_classes}


class TinyCNN(torch.nn.Module):
    def __init__(self, num_classes=NUM_CLASSES):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, kernel_size=8, stride=8)
        self.pool = torch.nn.AdaptiveAvgPool2d(2)
        self.fc = torch.nn.Linear(16, num_classes)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv(x)))
        return self.fc(torch.flatten(x, 1))
'''

LABELS = ("circle", "square", "triangle", "star", "cross", "hexagon", "heart")


def load_model_class(model_py: Path) -> type:
    """The one nn.Module class of a model.py, imported under a private name."""
    import torch

    name = f"_hk_test_model_{abs(hash(str(model_py)))}"
    spec = importlib.util.spec_from_file_location(name, model_py)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    classes = [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, torch.nn.Module) and v.__module__ == name]
    assert len(classes) == 1, classes
    return classes[0]


def write_model_dir(
    path: Path,
    model_py: str | None,
    *,
    seed: int = 0,
    state_dict: dict | None = None,
    labels: Any = None,
    manifest: dict | None = None,
    config: str | None = None,
) -> Path:
    """Write model.py, model.pt (a seeded state_dict), index_to_name.json and MANIFEST.json.

    Returns the model dir. ``labels`` is written as index_to_name.json as given (a list becomes
    ``{"0": ..., "1": ...}``); ``manifest`` as MAR-INF/MANIFEST.json; ``config`` as
    model-config.yaml.
    """
    import torch

    path.mkdir(parents=True, exist_ok=True)
    if model_py is not None:
        (path / "model.py").write_text(model_py)
        if state_dict is None:
            torch.manual_seed(seed)
            state_dict = load_model_class(path / "model.py")().state_dict()
    if state_dict is not None:
        torch.save(state_dict, path / "model.pt")
    if labels is not None:
        mapping = {str(i): name for i, name in enumerate(labels)} if isinstance(labels, (list, tuple)) else labels
        (path / "index_to_name.json").write_text(json.dumps(mapping))
    if manifest is not None:
        (path / "MAR-INF").mkdir(exist_ok=True)
        (path / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest))
    if config is not None:
        (path / "model-config.yaml").write_text(config)
    return path


def eager_manifest(**extra: Any) -> dict:
    """A MAR-INF-less manifest for MockContext(manifest=...): model.py + model.pt."""
    return {"model": {"modelName": "tiny", "serializedFile": "model.pt", "modelFile": "model.py", **extra}}


# ---------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------


def png_bytes(width: int = 64, height: int = 48, seed: int = 0, mode: str = "RGB") -> bytes:
    """A small deterministic PNG (a gradient with a seeded offset)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = rng.integers(0, 255, size=3)
    pixels = np.stack([(x * 4 + base[0]) % 256, (y * 5 + base[1]) % 256, (x + y + base[2]) % 256], axis=-1)
    image = Image.fromarray(pixels.astype("uint8"), "RGB").convert(mode)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def bomb_png(side: int) -> bytes:
    """A valid 1-bit ``side`` x ``side`` all-black PNG: a few KB on disk, side² bytes decoded."""
    row = bytes(1 + math.ceil(side / 8))
    compressor = zlib.compressobj(9)
    idat = b"".join(compressor.compress(row) for _ in range(side)) + compressor.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")


# ---------------------------------------------------------------------------------------------
# TorchServe helpers
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def ts_imports(model_dir: Path | str) -> Iterator[None]:
    """What TorchServe's worker gives a model: its dir first on sys.path, its own ``model``.

    TorchServe's BaseHandler imports ``modelFile`` with ``importlib.import_module("model")``;
    in one test process several dirs have a model.py, so each must be isolated.
    """
    from handlerkit.worker.loading import model_dir_imports

    with model_dir_imports(model_dir):
        yield


@dataclass
class PredictResponse:
    """One request's part of the worker's predict response (create_predict_response)."""

    request_id: str
    content_type: str
    code: int
    phrase: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body.decode("utf-8"))


def decode_predict_response(msg: bytes | bytearray) -> tuple[int, str, list[PredictResponse]]:
    """Parse ``ts.protocol.otf_message_handler.create_predict_response`` output.

    Returns:
        (batch code, batch message, one PredictResponse per request).
    """
    buf = bytes(msg)
    pos = 0

    def integer() -> int:
        nonlocal pos
        (value,) = struct.unpack("!i", buf[pos : pos + 4])
        pos += 4
        return value

    def blob() -> bytes:
        nonlocal pos
        n = integer()
        data = buf[pos : pos + n]
        pos += n
        return data

    code = integer()
    message = blob().decode("utf-8")
    responses = []
    while True:
        n = integer()
        if n == -1:
            break
        request_id = buf[pos : pos + n].decode("utf-8")
        pos += n
        content_type = blob().decode("utf-8")
        status = integer()
        phrase = blob().decode("utf-8")
        headers = {}
        for _ in range(integer()):
            key = blob().decode("utf-8")
            headers[key] = blob().decode("utf-8")
        responses.append(PredictResponse(request_id, content_type, status, phrase, headers, blob()))
    if pos != len(buf):
        raise ValueError(f"trailing bytes in predict response: {len(buf) - pos}")
    return code, message, responses


def ts_metrics_cache(model_name: str, path: str | Path | None = None) -> Any:
    """The metrics cache TorchServe's worker builds (model_service_worker.py), from ``path`` or
    from the metrics.yaml TorchServe ships (:func:`ts_default_metrics_yaml`)."""
    import warnings

    from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # ts leaves the YAML file open
        cache = MetricsCacheYamlImpl(config_file_path=str(path or ts_default_metrics_yaml()))
    cache.initialize_cache()
    cache.model_name = model_name
    return cache


def ts_default_metrics_yaml() -> Path:
    """TorchServe's own metrics config (``ts/configs/metrics.yaml``): the worker's default."""
    import ts

    return Path(ts.__file__).parent / "configs" / "metrics.yaml"


#: A metrics YAML like pytorch/serve's examples/custom_metrics config: every type, anchors, a
#: metric with no dimensions, one with a single dimension and one with three.
CUSTOM_METRICS_YAML = """\
dimensions:
  - &model_name "ModelName"
  - &level "Level"
ts_metrics:
  gauge:
    - {name: QueueTime, unit: Milliseconds, dimensions: [*level, "Hostname"]}
model_metrics:
  counter:
    - {name: InferenceRequestCount, unit: count, dimensions: []}
    - {name: InitializeCallCount, unit: count, dimensions: [*model_name, *level]}
    - {name: PreprocessCallCount, unit: count, dimensions: [*model_name]}
  gauge:
    - {name: HandlerTime, unit: ms, dimensions: [*model_name, *level]}
    - {name: PredictionTime, unit: ms, dimensions: [*model_name, *level]}
    - {name: RequestBatchSize, unit: count, dimensions: ["ModelName"]}
    - {name: SizeOfImage, unit: kB, dimensions: [*model_name, *level]}
    - {name: HandlerMethodTime, unit: ms, dimensions: ["MethodName", *model_name, *level]}
  histogram:
    - {name: ExamplePercentMetric, unit: percent, dimensions: [*model_name, *level]}
"""


# ---------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------


def pytest_runtest_setup(item: pytest.Item) -> None:
    # TorchServe is a test-only dependency: its tests skip, not fail, where it is not installed.
    if item.get_closest_marker("torchserve") is not None and importlib.util.find_spec("ts") is None:
        pytest.skip("needs torchserve==0.12.0: pip install 'handlerkit[test]'")



@pytest.fixture
def argmax_dir(tmp_path: Path) -> Path:
    """TorchServe's argmax unit-test model: model.py + an (empty) state_dict."""
    return write_model_dir(tmp_path / "argmax", ARGMAX_MODEL_PY)


@pytest.fixture
def mlp_dir(tmp_path: Path) -> Path:
    """TinyMLP as model.py + state_dict (seed 0)."""
    return write_model_dir(tmp_path / "mlp", MLP_MODEL_PY)


def cnn_dir(path: Path, num_classes: int = 5, seed: int = 0, labels: Any = "default", **kwargs: Any) -> Path:
    """A TinyCNN model dir with ``num_classes`` outputs and (by default) one label each."""
    if labels == "default":
        labels = list(LABELS[:num_classes])
    return write_model_dir(path, CNN_MODEL_PY.format(num_classes=num_classes), seed=seed, labels=labels, **kwargs)


@pytest.fixture
def cnn5_dir(tmp_path: Path) -> Path:
    return cnn_dir(tmp_path / "cnn5", 5)


@pytest.fixture
def png() -> bytes:
    return png_bytes()


@pytest.fixture(scope="session")
def mlp_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """The eager TinyMLP (seed 0) and the dir holding its model.py + state_dict."""
    directory = write_model_dir(tmp_path_factory.mktemp("mlp_ref"), MLP_MODEL_PY)
    import torch

    model = load_model_class(directory / "model.py")()
    model.load_state_dict(torch.load(directory / "model.pt", weights_only=True))
    return model.eval(), directory


#: Each model format's serializedFile, and the model config it needs.
FORMAT_FILES: dict[str, tuple[str, dict]] = {
    "eager": ("model.pt", {}),
    "torchscript": ("model.pt", {}),
    "onnx": ("model.onnx", {}),
    "export": ("model.pt2", {}),
    "aoti": ("model.pt2", {}),
    "aoti-so": ("model.so", {"pt2": {"export": {"aot_compile": True}}}),
}


def format_context(fmt: str, directory: Path) -> Any:
    """A MockContext for a dir written by :func:`build_format_dir` (a MAR-INF-less manifest)."""
    import handlerkit as hk

    serialized, config = FORMAT_FILES[fmt]
    model = {"modelName": f"tiny-{fmt}", "serializedFile": serialized}
    if fmt == "eager":
        model["modelFile"] = "model.py"
    return hk.MockContext(model_dir=directory, gpu_id=None, manifest={"model": model}, model_yaml_config=config)


def build_format_dir(root: Path, fmt: str, reference: Any, reference_dir: Path) -> Path:
    """``reference`` (TinyMLP) written in format ``fmt`` by handlerkit.formats.export_model."""
    import torch

    from handlerkit.formats import export_model

    directory = root / fmt
    directory.mkdir()
    if fmt == "eager":
        write_model_dir(directory, MLP_MODEL_PY, state_dict=torch.load(reference_dir / "model.pt", weights_only=True))
    else:
        export_model(reference, (torch.randn(2, 4),), directory / FORMAT_FILES[fmt][0], fmt)
    return directory


@pytest.fixture(scope="session")
def fast_format_dirs(tmp_path_factory: pytest.TempPathFactory, mlp_reference: tuple[Any, Path]) -> dict[str, Path]:
    """eager, torchscript, onnx and export dirs of TinyMLP (about 3 s, once per session)."""
    root = tmp_path_factory.mktemp("formats")
    return {fmt: build_format_dir(root, fmt, *mlp_reference) for fmt in ("eager", "torchscript", "onnx", "export")}


@pytest.fixture(scope="session")
def aoti_format_dirs(tmp_path_factory: pytest.TempPathFactory, mlp_reference: tuple[Any, Path]) -> dict[str, Path]:
    """AOTInductor packages of TinyMLP: 10-30 s of C++ compilation each; for ``slow`` tests."""
    root = tmp_path_factory.mktemp("formats_aoti")
    return {fmt: build_format_dir(root, fmt, *mlp_reference) for fmt in ("aoti", "aoti-so")}


@pytest.fixture
def restore_fp32_precision() -> Iterator[None]:
    """Undo TF32 settings a test's handler made (the new fp32_precision API only)."""
    import torch

    saved = (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
    yield
    torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision = saved


@pytest.fixture
def two_model_dirs(tmp_path: Path) -> tuple[Path, Path]:
    """Two model dirs, ``dir_A`` and ``dir_B``, each with its own ``model.py`` and ``handler.py``
    (``_module_dirs.make_model_dir``): a bare ``import model`` must find the right one."""
    from _module_dirs import make_model_dir

    return make_model_dir(tmp_path, "A"), make_model_dir(tmp_path, "B")


@pytest.fixture
def restores_imports() -> Iterator[None]:
    """The test leaves ``sys.path`` as it found it and no ``model_dir_imports`` block open; the
    modules it imported from model dirs are forgotten afterwards."""
    import sys

    from handlerkit.worker import isolation

    path_before = list(sys.path)
    yield
    isolation.clear_module_cache()
    assert sys.path == path_before
    assert not isolation._active


@pytest.fixture
def custom_metrics_yaml(tmp_path: Path) -> Path:
    """:data:`CUSTOM_METRICS_YAML` written to a file."""
    path = tmp_path / "metrics.yaml"
    path.write_text(CUSTOM_METRICS_YAML)
    return path


__all__ = [
    "ARGMAX_MODEL_PY",
    "BREAK_LINE",
    "BREAK_MODEL_PY",
    "ARGMAX_LINEAR_MODEL_PY",
    "MLP_MODEL_PY",
    "CNN_MODEL_PY",
    "FORMAT_FILES",
    "LABELS",
    "PredictResponse",
    "bomb_png",
    "build_format_dir",
    "format_context",
    "cnn_dir",
    "decode_predict_response",
    "eager_manifest",
    "load_model_class",
    "png_bytes",
    "ts_default_metrics_yaml",
    "ts_imports",
    "ts_metrics_cache",
    "CUSTOM_METRICS_YAML",
    "write_model_dir",
]
