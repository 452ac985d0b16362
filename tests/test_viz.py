"""hk.show: the picture chosen for each kind of value, drawn from the real shapes classifier,
compared with golden images; bounded work on huge tensors; clear errors for bad input.

Golden images (tests/golden/*.png) are compared with matplotlib's ``compare_images`` (RMS
tolerance ``TOL``) under the Agg backend, a fixed style and font. Regenerate them, after a
change that is meant to alter the pictures, with::

    HANDLERKIT_REGEN_GOLDEN=1 python -m pytest -p no:nbval tests/test_viz.py -k golden

and look at every changed file before committing it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import matplotlib
import matplotlib.style
import matplotlib.text
import numpy as np
import pytest
import torch

import handlerkit as hk
from _strict import Strict
from handlerkit import viz
from handlerkit.errors import HandlerkitError
from handlerkit.results import StageResult

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parent.parent
CLASSIFIER = ROOT / "fixtures" / "models" / "image_classifier"
IMAGES = ROOT / "fixtures" / "images"
GOLDEN = Path(__file__).resolve().parent / "golden"
REGEN = os.environ.get("HANDLERKIT_REGEN_GOLDEN") == "1"
TOL = 2.0  # RMS over 0-255 pixel values
NAMES = ("circle.png", "star.jpg", "square.png", "triangle.png")


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def classifier() -> SimpleNamespace:
    """The shapes classifier run on four fixture images: harness, run, and what it computed."""
    h = hk.Harness("image_classifier", hk.MockContext.from_model_dir(str(CLASSIFIER)))
    run = h.run(hk.batch(*(hk.Request.from_file(str(IMAGES / name)) for name in NAMES)))
    pixels = run.stages["preprocess"].output
    probs = torch.softmax(run.stages["inference"].output, dim=1)
    return SimpleNamespace(h=h, run=run, pixels=pixels, probs=probs, handler=h.handler)


def shape_masks(pixels: torch.Tensor, handler) -> torch.Tensor:
    """[N, H, W] bool: the pixels far from the image border's colour (each image's shape)."""
    view = viz._view(None, handler)
    mean = torch.tensor(view.mean).view(1, 3, 1, 1)
    std = torch.tensor(view.std).view(1, 3, 1, 1)
    rgb = pixels * std + mean
    border = torch.cat([rgb[:, :, 0], rgb[:, :, -1], rgb[:, :, :, 0], rgb[:, :, :, -1]], dim=2).mean(2)
    return (rgb - border[:, :, None, None]).abs().sum(1) > 0.3


@contextlib.contextmanager
def golden_style() -> Iterator[None]:
    """matplotlib's default style with the bundled DejaVu fonts and its test-suite text settings."""
    rc = {"font.family": ["DejaVu Sans"], "font.monospace": ["DejaVu Sans Mono"], "text.hinting": "none",
          "savefig.dpi": 72}
    with matplotlib.style.context("default"), matplotlib.rc_context(rc):
        yield


def check_golden(name: str, make, tmp_path: Path) -> None:
    from matplotlib.testing.compare import compare_images

    with golden_style():
        fig = make()
        actual = tmp_path / f"{name}.png"
        fig.savefig(actual)
    expected = GOLDEN / f"{name}.png"
    if REGEN:
        GOLDEN.mkdir(exist_ok=True)
        shutil.copyfile(actual, expected)
        return
    if not expected.exists():
        pytest.fail(f"no golden image {expected}: run HANDLERKIT_REGEN_GOLDEN=1 python -m pytest -p no:nbval "
                    "tests/test_viz.py -k golden, look at it, commit it")
    difference = compare_images(str(expected), str(actual), tol=TOL)
    assert difference is None, difference


def kinds(obj, **kwargs) -> list[str]:
    options = {"handler": None, "image": None, "top_k": 5, "max_images": 16, **kwargs}
    return [p.kind for p in viz._panels(obj, options["handler"], options["image"], options["top_k"],
                                         options["max_images"])]


def drawn_images(fig) -> list[np.ndarray]:
    return [np.asarray(im.get_array()) for ax in fig.get_axes() for im in ax.get_images()]


def texts(fig) -> str:
    found = [t.get_text() for t in fig.findobj(matplotlib.text.Text)]
    found += [cell.get_text().get_text() for ax in fig.get_axes() for table in ax.tables
              for cell in table.get_celld().values()]
    return "\n".join(found)


# ---------------------------------------------------------------------------------------------
# Golden images, drawn from the real classifier
# ---------------------------------------------------------------------------------------------


def test_golden_run_of_the_classifier(classifier, tmp_path):
    """The preprocessed batch de-normalised (it looks like the photos), and the logits as bars."""
    assert kinds(classifier.run) == ["images", "bars"]  # postprocess repeats the bars: left out
    check_golden("run_classifier", lambda: viz.show(classifier.run), tmp_path)


def test_golden_feature_maps(classifier, tmp_path):
    model = classifier.handler.model
    seen = []
    hook = model.features[0].register_forward_hook(lambda module, args, out: seen.append(out))
    with torch.no_grad():
        model(classifier.pixels)
    hook.remove()
    assert kinds(seen[0]) == ["features"]
    check_golden("feature_maps", lambda: viz.show(seen[0], title="first conv block"), tmp_path)


def test_golden_histogram(classifier, tmp_path):
    values = classifier.pixels.flatten()
    assert kinds(values) == ["histogram"]
    check_golden("histogram", lambda: viz.show(values, title="preprocessed pixel values"), tmp_path)


def test_golden_segmentation(classifier, tmp_path):
    """Per-pixel scores over background + the five shapes: argmax, coloured over the input."""
    masks = shape_masks(classifier.pixels, classifier.handler)
    classes = classifier.probs.argmax(1)
    scores = torch.zeros(len(NAMES), 6, 224, 224)
    scores[:, 0] = 1.0
    for i, c in enumerate(classes.tolist()):
        scores[i, c + 1] = masks[i].float() * 2
    mapping = {"0": "__background__", **{str(int(k) + 1): v for k, v in classifier.handler.mapping.items()}}
    handler = SimpleNamespace(mapping=mapping, image_processing=classifier.handler.image_processing)
    result = StageResult("inference", input=classifier.pixels, output=scores, source=handler)
    assert kinds(result) == ["overlay"]
    fig = viz.show(result)
    assert {"circle", "star", "square", "triangle"} <= set(texts(fig).split())  # the legend
    check_golden("segmentation", lambda: viz.show(result), tmp_path)


def test_golden_detections(classifier, tmp_path):
    from torchvision.ops import masks_to_boxes

    boxes = masks_to_boxes(shape_masks(classifier.pixels, classifier.handler))
    top, classes = classifier.probs.max(1)
    output = [{"boxes": boxes[i:i + 1], "labels": classes[i:i + 1], "scores": top[i:i + 1]} for i in range(len(NAMES))]
    result = StageResult("inference", input=classifier.pixels, output=output, source=classifier.handler)
    assert kinds(result) == ["overlay"]
    check_golden("detections", lambda: viz.show(result), tmp_path)


def test_golden_tokens(tmp_path):
    words = "<pad> the a circle square star is drawn on plain gradient background".split()
    handler = SimpleNamespace(vocab={w: i for i, w in enumerate(words)})
    ids = torch.tensor([[1, 3, 6, 7, 8, 9, 11, 0], [2, 5, 6, 7, 8, 10, 11, 0]])
    assert kinds(ids, handler=handler) == ["table"]
    fig = viz.show(ids, handler=handler)
    assert "circle" in texts(fig) and "gradient" in texts(fig)
    check_golden("tokens", lambda: viz.show(ids, handler=handler), tmp_path)


def test_golden_error_card(tmp_path):
    h = hk.Harness(Strict, hk.MockContext.from_model_dir(str(CLASSIFIER)))
    bad = hk.batch(hk.Request.from_file(str(IMAGES / "circle.png")),
                   hk.Request.from_file(str(ROOT / "fixtures" / "bad" / "not_an_image.txt")))
    with pytest.raises(hk.StageError):
        h.run(bad)
    failed = h.results["preprocess"]
    assert kinds(failed) == ["card"]
    fig = viz.show(failed)
    assert "preprocess failed: RequestError" in texts(fig) and "fix: send the image bytes" in texts(fig)
    check_golden("error_card", lambda: viz.show(failed), tmp_path)


def test_golden_images_stay_small():
    assert sum(p.stat().st_size for p in GOLDEN.glob("*.png")) < 1_000_000


# ---------------------------------------------------------------------------------------------
# What the pictures read from the handler
# ---------------------------------------------------------------------------------------------


def test_the_image_grid_is_de_normalised_with_the_handlers_transform(classifier):
    """The grid's pixels are the photo's (Resize, CenterCrop, ToTensor), not the normalised values."""
    from PIL import Image
    from torchvision import transforms

    panel = viz._panels(classifier.run.stages["preprocess"], None, None, 5, 16)[0]
    assert "mean=[0.485, 0.456, 0.406]" in panel.notes[0] and "handler.image_processing" in panel.notes[0]
    photo = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor()])(
        Image.open(IMAGES / "circle.png").convert("RGB"))
    grid = panel.data["grid"]  # 2 x 2 images of 224 with 2-pixel padding
    drawn = torch.as_tensor(grid[2:226, 2:226]).permute(2, 0, 1).float()
    assert (drawn - photo).abs().max() < 1e-4


def test_without_a_handler_the_images_are_rescaled_and_say_so(classifier):
    panel = viz._panels(classifier.pixels, None, None, 5, 16)[0]
    assert panel.kind == "images" and "no Normalize found on the handler" in panel.notes[-1]


def test_bars_are_labelled_from_the_mapping_and_handler_overrides_it(classifier):
    fig = viz.show(classifier.run.stages["inference"], top_k=2)
    labels = [t.get_text() for ax in fig.get_axes() for t in ax.get_yticklabels()]
    assert labels[:2] == ["circle", "square"] and len(labels) == 2 * len(NAMES)
    own = SimpleNamespace(mapping={str(i): f"class {i}" for i in range(5)})
    fig = viz.show(classifier.run.stages["inference"].output, handler=own, top_k=1)
    assert [t.get_text() for ax in fig.get_axes() for t in ax.get_yticklabels()][0] == "class 0"
    # a Harness stands for its handler
    assert "circle" in texts(viz.show(classifier.run.stages["inference"].output, handler=classifier.h))


def test_handler_facts_are_found_where_torchserve_and_torchvision_keep_them():
    from torchvision import transforms
    from torchvision.transforms import v2

    from handlerkit._viz_handler import read_handler

    class V2Handler:
        preprocess_pipeline = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                                          v2.Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25])])

        @property
        def transform(self):  # never run: attributes are read statically
            raise AssertionError("a property ran")

    view = read_handler(V2Handler())
    assert (view.mean, view.std, view.normalize_at) == ([0.5] * 3, [0.25] * 3, "handler.preprocess_pipeline")
    ts_style = SimpleNamespace(image_processing=transforms.Compose([transforms.Normalize([0.1], [0.2])]),
                               mapping={"0": ["n0", "tench"]}, source_vocab=["<unk>", "hello"])
    view = read_handler(ts_style)
    assert view.mean == [0.1] and view.label(0) == "tench" and view.tokens([1, 7]) == ["hello", "<7?>"]

    class Tokenizer:  # Hugging Face's surface
        def convert_ids_to_tokens(self, ids):
            return [f"tok{i}" for i in ids]

    assert read_handler(SimpleNamespace(tokenizer=Tokenizer())).tokens([3]) == ["tok3"]
    assert read_handler(lambda data, context: data).mean is None  # a function handler has none


# ---------------------------------------------------------------------------------------------
# The picture chosen for each value
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda: torch.rand(2, 3, 32, 32), ["images"]),
        (lambda: torch.rand(1, 32, 32), ["images"]),
        (lambda: torch.randint(0, 255, (2, 3, 16, 16), dtype=torch.uint8), ["images"]),
        (lambda: torch.rand(2, 8, 16, 16), ["features"]),
        (lambda: torch.rand(8, 16, 16), ["features"]),
        (lambda: torch.randint(0, 3, (2, 16, 16)), ["overlay"]),
        (lambda: torch.rand(2, 16, 16) > 0.5, ["overlay"]),
        (lambda: torch.randn(2, 5), ["bars"]),
        (lambda: torch.randn(64, 64), ["heatmap"]),
        (lambda: torch.randint(0, 100, (2, 10)), ["table"]),
        (lambda: torch.randn(10), ["bars"]),
        (lambda: torch.randn(1000), ["histogram"]),
        (lambda: torch.rand(1000) > 0.5, ["bars"]),
        (lambda: torch.rand(2, 2, 3, 8, 8), ["images"]),
        (lambda: np.random.default_rng(0).random((2, 3, 8, 8)), ["images"]),
        (lambda: np.random.default_rng(0).random((8, 8, 3)).astype(">f4")[::-1].T, ["images"]),
        (lambda: torch.zeros(0, 3), ["card"]),
        (lambda: torch.tensor(1.5), ["card"]),
        (lambda: torch.empty(2, 3, 8, 8, device="meta"), ["card"]),
        (lambda: [torch.rand(3, 8, 8), torch.rand(3, 8, 8)], ["images"]),
        (lambda: {"logits": torch.randn(2, 5), "pixels": torch.rand(2, 3, 8, 8)}, ["bars", "images"]),
        (lambda: [{"circle": 0.9, "star": 0.1}], ["bars"]),
        (lambda: [[{"circle": [1, 2, 10, 12], "score": 0.9}], []], ["overlay"]),
        (lambda: {"boxes": torch.tensor([[1.0, 2, 10, 12]]), "labels": torch.tensor([1])}, ["overlay"]),
        (lambda: [[0.1, 0.9], [0.8, 0.2]], ["bars"]),
        (lambda: torch.randint(0, 255, (28, 28), dtype=torch.uint8), ["heatmap"]),
        (lambda: [[[torch.rand(3, 8, 8)]]], ["images"]),
    ],
    ids=["images", "one-image", "uint8-images", "features", "channels", "int-mask", "bool-mask", "logits",
         "heatmap", "token-ids", "short-1d", "histogram", "bool-1d", "5d", "numpy", "numpy-odd", "empty", "0-d", "meta",
         "list-of-images", "dict", "score-dicts", "torchserve-detections", "torchvision-detection", "number-lists",
         "grey-uint8", "nested-lists"],
)
def test_the_picture_for_each_kind_of_value(make, expected):
    value = make()
    assert kinds(value) == expected
    fig = viz.show(value)
    fig.canvas.draw()  # rendering too must not raise
    assert fig.get_axes()


def test_a_segmentation_is_recognised_by_the_mapping_or_the_input_size(classifier):
    scores = torch.randn(len(NAMES), 5, 224, 224)
    assert kinds(StageResult("inference", input=classifier.pixels, output=scores)) == ["overlay"]
    assert kinds(scores, handler=classifier.handler) == ["overlay"]  # 5 classes = the mapping's width
    assert kinds(torch.randn(2, 7, 16, 16)) == ["features"]


def test_the_run_stage_picture_uses_the_input_image(classifier):
    masks = shape_masks(classifier.pixels, classifier.handler).long()
    result = StageResult("postprocess", output=masks, source=SimpleNamespace())  # no mapping: 0 is background
    panel = viz._panels(result, None, None, 5, 16)[0]
    assert any("no input image known" in n for n in panel.notes)
    panel = viz._panels(result, None, classifier.pixels, 5, 16)[0]  # image=
    assert not any("no input image known" in n for n in panel.notes)
    assert panel.data["legend"] == [("1", "#ff7f0e")]
    named = viz._panels(result, classifier.handler, None, 5, 16)[0]  # its mapping names class 0: drawn too
    assert named.data["legend"] == [("circle", "#1f77b4"), ("square", "#ff7f0e")]


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["text", 3, None, b"bytes", object()], ids=["str", "int", "None", "bytes", "object"])
def test_a_value_without_tensors_is_a_clear_error(value):
    with pytest.raises(HandlerkitError, match=r"show\(\) draws tensors, StageResults, Runs .*: got ") as info:
        viz.show(value)
    assert info.value.fix and "h.run(batch)" in info.value.fix


def test_a_list_without_tensors_says_so():
    with pytest.raises(HandlerkitError, match=r"got list\[2\] of str, which holds no tensor"):
        viz.show(["a", "b"])
    deep: list = []
    for _ in range(5000):  # deeper than Python's recursion limit
        deep = [deep, 1]
    with pytest.raises(HandlerkitError, match="which holds no tensor"):
        viz.show(deep)


def test_bad_arguments_are_type_and_value_errors():
    with pytest.raises(TypeError, match="top_k must be an int"):
        viz.show(torch.ones(2), top_k=1.5)
    with pytest.raises(ValueError, match="max_images must be at least 1"):
        viz.show(torch.ones(2), max_images=0)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.tensor([[1.0, float("nan")], [float("inf"), -float("inf")]]),
        lambda: torch.full((2, 3, 8, 8), float("nan")),
        lambda: torch.full((100,), float("inf")),
        lambda: torch.tensor([[float("nan"), 1.0, 2.0]]),
        lambda: torch.zeros(2, 3, 8, 8),
        lambda: torch.ones(4, 4, 4, 4, dtype=torch.int32),
        lambda: torch.tensor([[1 + 1j, 2j]]),
        lambda: torch.eye(6).to_sparse(),
        lambda: {"boxes": torch.tensor([[10.0, 10, 2, 2], [float("nan"), 0, 1, 1]]),
                 "scores": torch.tensor([0.5, 0.4])},
        lambda: {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.int64)},
        lambda: torch.tensor([[36, 1]]),  # "$" as a token: no mathtext
    ],
    ids=["nan-inf-matrix", "nan-images", "all-inf", "nan-logits", "zero-images", "int-4d", "complex", "sparse",
         "bad-boxes", "no-boxes", "dollar"],
)
def test_odd_values_draw_without_errors_from_matplotlib(make):
    handler = SimpleNamespace(vocab={chr(i): i for i in range(128)})
    fig = viz.show(make(), handler=handler)
    fig.canvas.draw()


def test_a_huge_tensor_draws_a_bounded_number_of_pixels_and_values():
    from handlerkit._viz_prepare import HIST_BINS, HIST_SAMPLE, MAX_SIDE

    big = viz.show(torch.rand(4000, 4000))
    assert max(max(a.shape[:2]) for a in drawn_images(big)) <= MAX_SIDE
    volume = viz.show(torch.rand(4, 64, 256, 256))  # 16M values: 16 channels of sample 0
    assert max(max(a.shape[:2]) for a in drawn_images(volume)) <= MAX_SIDE
    panel = viz._panels(torch.rand(3 * 10**6), None, None, 5, 16)[0]
    assert len(panel.data["counts"]) == HIST_BINS and panel.data["counts"].sum() <= HIST_SAMPLE
    video = viz._panels(torch.rand(2, 30, 3, 64, 64), None, None, 5, 4)[0]  # 5-d, max_images=4
    assert video.kind == "images" and any("of a 5-d tensor" in n for n in video.notes)
    assert video.data["grid"].shape[:2] == (2 * 66 + 2, 2 * 66 + 2)  # 4 images of 64, padded
    logits = viz.show(StageResult("inference", output=torch.randn(100, 50_000)), top_k=3)  # a vocabulary's scores
    assert sum(len(ax.patches) for ax in logits.get_axes()) == 8 * 3  # 8 rows at most


def test_a_failing_stage_shows_its_error_and_a_run_with_nothing_to_draw_a_card():
    from handlerkit.results import Run

    run = Run(output=["a"], stages={"postprocess": StageResult("postprocess", output=["a"])}, batch_size=1)
    assert kinds(run) == ["card"]
    assert kinds(StageResult("postprocess", output="done")) == ["card"]


# ---------------------------------------------------------------------------------------------
# matplotlib: optional, never global, displayed in Jupyter
# ---------------------------------------------------------------------------------------------


def test_import_handlerkit_imports_neither_matplotlib_nor_ipywidgets():
    code = (
        "import sys, handlerkit, handlerkit.viz, handlerkit.results\n"
        "from handlerkit._summary import summary\n"
        "import torch; summary(torch.ones(2))\n"
        "print(sorted(m for m in ('matplotlib', 'ipywidgets', 'torchvision') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=str(ROOT))
    assert out.stdout.strip() == "[]"


def test_show_without_matplotlib_names_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"hk.show needs matplotlib: pip install 'handlerkit\[notebook\]'"):
        viz.show(torch.ones(2))


def test_figures_stay_out_of_pyplot_and_leave_rcparams_alone():
    import matplotlib.pyplot as plt

    before = (list(plt.get_fignums()), dict(matplotlib.rcParams))
    fig = viz.show(torch.rand(2, 3, 8, 8))
    assert isinstance(fig, matplotlib.figure.Figure)
    assert (list(plt.get_fignums()), dict(matplotlib.rcParams)) == before


def test_a_returned_figure_displays_as_png_in_a_fresh_kernel():
    """matplotlib-inline registers its Figure formatter only when pyplot loads the backend."""
    import nbclient
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(
        "import sys, torch\nfrom handlerkit.viz import show\nfig = show(torch.rand(2, 3, 8, 8))\n"
        "assert 'matplotlib.pyplot' not in sys.modules\nfig")]
    client = nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    outputs = notebook.cells[0].outputs
    assert [o["output_type"] for o in outputs] == ["execute_result"] and "image/png" in outputs[0]["data"]


def test_an_unforeseen_failure_names_what_came(monkeypatch):
    from handlerkit import _viz_prepare

    def broken(*args, **kwargs):
        raise RuntimeError("a torch op refused")

    monkeypatch.setattr(_viz_prepare, "histogram_panel", broken)
    message = r"could not draw Tensor\[1000\] float32 cpu: RuntimeError: a torch op"
    with pytest.raises(HandlerkitError, match=message) as info:
        viz.show(torch.randn(1000))
    assert isinstance(info.value.__cause__, RuntimeError)


def test_the_text_classifier_run_shows_its_tokens_and_scores():
    """EmbeddingBag input (ids + offsets) as one row per request, read with the handler's vocabulary."""
    model_dir = ROOT / "fixtures" / "models" / "text_classifier"
    h = hk.Harness("text_classifier", hk.MockContext.from_model_dir(str(model_dir)))
    run = h.run(hk.batch(hk.Request.text("the cat sat on the mat"), hk.Request.text("rain and wind today")))
    assert kinds(run) == ["table", "bars"]
    table = viz._panels(run.stages["preprocess"], None, None, 5, 16)[0]
    assert table.data["cells"][0][0] == "the" and len(table.data["cells"]) == 2
    assert "vocabulary: handler.source_vocab" in table.notes
    labels = texts(viz.show(run))
    assert set(h.handler.mapping.values()) <= set(labels.split())
