"""hk.show, the package's front (``handlerkit/viz/__init__.py``): whole pictures drawn from the
real shapes classifier and compared with golden images; bounded work on huge tensors; clear
errors for bad input; matplotlib optional, never global, displayed in Jupyter. Each module of
the package has its own test module (``test_viz_<module>.py``).

Golden images (tests/golden/*.png) are compared with matplotlib's ``compare_images`` (RMS
tolerance ``TOL``) under the Agg backend, a fixed style and font. Regenerate them, after a
change that is meant to alter the pictures, with::

    HANDLERKIT_REGEN_GOLDEN=1 python -m pytest tests/viz/test_viz.py -k golden

and look at every changed file before committing it.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import matplotlib
import matplotlib.style
import numpy as np
import pytest
import torch
from _strict import Strict
from _viz import CLASSIFIER, IMAGES, NAMES, ROOT, classifier, drawn_images, kinds, panels, shape_masks, tabular, texts  # noqa: F401 (fixtures)

import handlerkit as hk
from handlerkit import viz
from handlerkit.errors import HandlerkitError
from handlerkit.recording.results import StageResult
from handlerkit.viz.shown import Shown

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
REGEN = os.environ.get("HANDLERKIT_REGEN_GOLDEN") == "1"
TOL = 2.0  # RMS over 0-255 pixel values


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
        pytest.fail(f"no golden image {expected}: run HANDLERKIT_REGEN_GOLDEN=1 python -m pytest "
                    "tests/viz/test_viz.py -k golden, look at it, commit it")
    difference = compare_images(str(expected), str(actual), tol=TOL)
    assert difference is None, difference


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


def test_golden_histogram(tmp_path):
    """Integers without a vocabulary: the four photos' 8-bit pixel values (floats in a row are a signal)."""
    from PIL import Image

    values = torch.cat([torch.from_numpy(np.array(Image.open(IMAGES / name).convert("RGB"))).flatten()
                        for name in NAMES])
    assert kinds(values) == ["histogram"]
    check_golden("histogram", lambda: viz.show(values, title="8-bit pixel values of the four photos"), tmp_path)


@pytest.mark.torchserve
def test_golden_tabular_run(tabular, tmp_path):
    """The issue's tabular handler: its input features as a table of values, the model's scores as
    bars labelled with the species, the answers as a table."""
    assert kinds(tabular.run) == ["heatmap", "bars", "table"]
    check_golden("tabular_run", lambda: viz.show(tabular.run), tmp_path)


def test_golden_signal(tmp_path):
    """Two audio-like rows ([N, 1, T]) of 8,000 samples: a line each, drawn from their min/max envelope."""
    t = torch.arange(8000, dtype=torch.float32) / 8000
    decaying = torch.sin(2 * math.pi * 6 * t) * torch.exp(-3 * t) + 0.1 * torch.sin(2 * math.pi * 400 * t)
    saw = 2 * (t * 5 % 1) - 1
    signals = torch.stack([decaying, saw]).unsqueeze(1)
    assert kinds(signals) == ["lines"]
    check_golden("signal", lambda: viz.show(signals, title="two signals"), tmp_path)


def test_golden_decoded_images(tmp_path):
    """What an image-to-image handler answers: encoded images (PNG and JPEG bytes), decoded."""
    answers = [(IMAGES / name).read_bytes() for name in NAMES]
    assert kinds(answers) == ["images"]
    check_golden("decoded_images", lambda: viz.show(answers), tmp_path)


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


def test_tokens_are_an_html_table():
    words = "<pad> the a circle square star is drawn on plain gradient background".split()
    handler = SimpleNamespace(vocab={w: i for i, w in enumerate(words)})
    ids = torch.tensor([[1, 3, 6, 7, 8, 9, 11, 0], [2, 5, 6, 7, 8, 10, 11, 0]])
    assert kinds(ids, handler=handler) == ["html"]  # selectable text, not a picture of it
    shown = viz.show(ids, handler=handler)
    assert isinstance(shown, Shown) and shown.figure is None
    assert "the · circle · is · drawn · on · plain · background · &lt;pad&gt;" in shown._repr_html_()


def test_golden_error_card(tmp_path):
    h = hk.Harness(Strict, hk.MockContext.from_model_dir(str(CLASSIFIER)))
    bad = hk.batch(hk.Request.from_file(str(IMAGES / "circle.png")),
                   hk.Request.from_file(str(ROOT / "fixtures" / "bad" / "not_an_image.txt")))
    with pytest.raises(hk.StageError):
        h.run(bad)
    failed = h.results["preprocess"]
    assert kinds(failed) == ["card"]
    fig = viz.show(failed)
    shown = texts(fig)
    assert "preprocess failed in Strict for request 1: RequestError" in shown and "fix: send the image bytes" in shown
    assert shown.count("preprocess failed") == 1  # said once: the title is the error's first line
    check_golden("error_card", lambda: viz.show(failed), tmp_path)


def test_golden_images_stay_small():
    assert sum(p.stat().st_size for p in GOLDEN.glob("*.png")) < 1_000_000


# ---------------------------------------------------------------------------------------------
# The front: hk.show and hk.summary are the package's, arguments, bad input, bounded work
# ---------------------------------------------------------------------------------------------


def test_hk_show_and_summary_are_the_packages_public_names():
    assert hk.show is viz.show and hk.summary is viz.summary
    assert viz.__all__ == ["show", "summary"]
    assert hk.summary(torch.ones(2)).startswith("Tensor[2] float32")


def test_a_run_is_titled_with_its_batch_size_and_a_title_overrides_it(classifier):
    assert viz.show(classifier.run).get_suptitle() == f"Run of {len(NAMES)} request(s)"
    assert viz.show(classifier.run, title="four shapes").get_suptitle() == "four shapes"
    assert viz.show(classifier.pixels).get_suptitle() == "Tensor[4, 3, 224, 224] float32 cpu"  # the panel's own


@pytest.mark.parametrize(
    "value, why",
    [
        (3, "3 is a single number"),
        (None, "the value is None"),
        (b"bytes", "5 bytes that PIL cannot read as an image"),
        (object(), "a value of type object is not a tensor, an array, image bytes, text or JSON data"),
        ([], "it is empty"),
        ({"a": object()}, "none of its items is a tensor, an array, image bytes, text or JSON data"),
        (torch.tensor(1.5), "a single value has nothing to plot (it is above)"),
    ],
    ids=["int", "None", "bytes", "object", "empty-list", "dict-of-objects", "0-d"],
)
def test_a_value_without_a_picture_is_its_summary_card_saying_why(value, why):
    fig = viz.show(value)
    (panel,) = panels(value)
    assert panel.kind == "card" and panel.data["lines"][-1] == f"No picture: {why}."
    assert panel.data["lines"][:-1] == hk.summary(value).splitlines()
    assert f"No picture: {why}." in texts(fig)


def test_a_list_of_strings_is_a_table_and_a_structure_too_deep_a_card():
    assert kinds(["a", "b"]) == ["table"]
    deep: list = []
    for _ in range(5000):  # deeper than Python's recursion limit
        deep = [deep, 1]
    (panel,) = panels(deep)
    assert panel.kind == "card" and panel.data["lines"][-1].startswith("No picture: none of its items")
    viz.show(deep).canvas.draw()


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
    if isinstance(fig, Shown):  # a token table is HTML: "$" escaped there, never mathtext
        assert "$" in fig._repr_html_() and fig.figure is None
        return
    fig.canvas.draw()


def test_a_huge_tensor_draws_a_bounded_number_of_pixels_and_values():
    from handlerkit.viz.histogram import HIST_BINS, HIST_SAMPLE
    from handlerkit.viz.lines import MAX_POINTS
    from handlerkit.viz.panel import MAX_SIDE

    big = viz.show(torch.rand(4000, 4000))
    assert max(max(a.shape[:2]) for a in drawn_images(big)) <= MAX_SIDE
    volume = viz.show(torch.rand(4, 64, 256, 256))  # 16M values: 16 channels of sample 0
    assert max(max(a.shape[:2]) for a in drawn_images(volume)) <= MAX_SIDE
    panel = panels(torch.randint(0, 1000, (3 * 10**6,)))[0]
    assert len(panel.data["counts"]) == HIST_BINS and panel.data["counts"].sum() <= HIST_SAMPLE
    signal = viz.show(torch.rand(3 * 10**6))  # one line of at most MAX_POINTS points
    assert [len(line.get_xdata()) for ax in signal.get_axes() for line in ax.lines] == [MAX_POINTS]
    video = panels(torch.rand(2, 30, 3, 64, 64), max_images=4)[0]  # 5-d, max_images=4
    assert video.kind == "images" and any("of a 5-d tensor" in n for n in video.notes)
    assert video.data["grid"].shape[:2] == (2 * 66 + 2, 2 * 66 + 2)  # 4 images of 64, padded
    words = SimpleNamespace(mapping={str(i): f"w{i}" for i in range(50_000)})  # a vocabulary's scores
    logits = viz.show(StageResult("inference", output=torch.randn(100, 50_000), source=words), top_k=3)
    assert sum(len(ax.patches) for ax in logits.get_axes()) == 8 * 3  # 8 rows at most
    unlabelled = viz.show(StageResult("inference", output=torch.randn(100, 50_000)))  # no mapping: a heat map
    assert max(max(a.shape[:2]) for a in drawn_images(unlabelled)) <= MAX_SIDE


def test_an_unforeseen_failure_names_what_came(monkeypatch):
    from handlerkit.viz import tensors

    def broken(*args, **kwargs):
        raise RuntimeError("a torch op refused")

    monkeypatch.setattr(tensors, "lines_panel", broken)
    message = r"could not draw Tensor\[1000\] float32 cpu: RuntimeError: a torch op"
    with pytest.raises(HandlerkitError, match=message) as info:
        viz.show(torch.randn(1000))
    assert isinstance(info.value.__cause__, RuntimeError)


# ---------------------------------------------------------------------------------------------
# matplotlib: optional, never global, displayed in Jupyter
# ---------------------------------------------------------------------------------------------


def test_import_handlerkit_imports_neither_matplotlib_nor_ipywidgets():
    code = (
        "import sys, handlerkit, handlerkit.viz, handlerkit.recording.results\n"
        "from handlerkit.summaries import summary\n"
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
