"""The gallery of handler kinds (``tests/gallery/``): six model dirs as users write them, each
opened with ``hk.Harness.open`` as a user would and

- stepped: ``initialize``, ``preprocess``, ``inference``, ``postprocess`` one at a time, agreeing
  with ``h.run`` on the same batch;
- checked: ``h.check(batch).ok`` and ``handlerkit.testing.assert_contract``;
- shown: ``hk.show`` of each stage draws what the data is (the panel ``viz.dispatch`` chose, and
  its bars, lines, cells and pixels counted);
- broken on purpose: a mistake that kind of handler meets, whose StageError names the stage and
  the request and whose fix fits the mistake.

Each kind's weights are its model.py's module built with a fixed seed (``gallery.model_dir``).
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from _viz import drawn_images, kinds, panels, texts
from gallery import HERE, KINDS, model_dir
from PIL import Image

import handlerkit as hk
from conftest import png_bytes
from handlerkit.errors import StageError
from handlerkit.testing import assert_contract

ROOT = Path(__file__).resolve().parents[2]
ON_TORCHSERVE = {"tabular", "signal", "strings"}  # written on ts.torch_handler.base_handler.BaseHandler

SPECIES = ("setosa", "versicolor", "virginica")
FEATURES = ([5.1, 3.5, 1.4, 0.2], [6.2, 2.9, 4.3, 1.3], [7.7, 3.0, 6.1, 2.3])
EVENTS = ("silence", "tone", "noise")
TAGS = ("DET", "NOUN", "VERB", "ADP", "ADJ")
SENTENCES = ("the cat sat on the mat", "a big dog ran")


def pcm(samples: torch.Tensor) -> bytes:
    """Float samples in [-1, 1] as int16 PCM bytes (what a recorder sends)."""
    return (samples * 32767).round().to(torch.int16).numpy().tobytes()


def tone(count: int = 2000, hertz: float = 440.0) -> torch.Tensor:
    t = torch.arange(count) / 8000
    return 0.4 * torch.sin(2 * math.pi * hertz * t)


def noise(count: int = 600) -> torch.Tensor:
    return 0.1 * torch.randn(count, generator=torch.Generator().manual_seed(1))


def batch_of(kind: str) -> hk.Batch:
    """A batch of each kind as its clients send it."""
    if kind == "tabular":
        return hk.batch(*(hk.Request.json({"features": f}) for f in FEATURES))
    if kind == "text":
        return hk.batch(
            hk.Request.text("the movie was great"),
            hk.Request.from_bytes(b"a boring and bad film", "application/octet-stream"),
        )
    if kind == "signal":
        octets = "application/octet-stream"
        return hk.batch(hk.Request.from_bytes(pcm(tone()), octets), hk.Request.from_bytes(pcm(noise()), octets))
    if kind == "image_to_image":
        photo = hk.Request.form({"data": ROOT / "fixtures" / "images" / "star.jpg"})
        return hk.batch(hk.Request.from_bytes(png_bytes(64, 48), "image/png"), photo)
    if kind == "multi_input":
        return hk.batch(
            hk.Request.json({"age": 35, "income": 52, "city": "lyon"}),
            hk.Request.form({"age": "61", "income": "20", "city": "brest"}),
        )
    return hk.batch(*(hk.Request.text(s) for s in SENTENCES))


def assert_answers(kind: str, h: hk.Harness, batch: hk.Batch, answers: list) -> None:
    """What each kind answers, one item per request."""
    assert isinstance(answers, list) and len(answers) == len(batch)
    for i, answer in enumerate(answers):
        if kind == "tabular":
            assert set(answer) == {"label", "probability"} and answer["label"] in SPECIES
            assert 1 / 3 <= answer["probability"] <= 1
        elif kind == "text":
            assert list(answer) == ["negative", "positive"] and sum(answer.values()) == pytest.approx(1, abs=2e-4)
        elif kind == "signal":
            assert set(answer) == {"event", "confidence"} and answer["event"] in EVENTS
        elif kind == "image_to_image":
            assert h.context.get_response_content_type(i) == "image/png"
            image = Image.open(io.BytesIO(answer))
            assert image.format == "PNG" and image.size == (32, 32) and image.mode == "RGB"
        elif kind == "multi_input":
            assert set(answer) == {"decision", "score"} and answer["decision"] in ("decline", "approve")
        else:
            words = [pair.rsplit("/", 1) for pair in answer.split(" ")]
            assert [w for w, _ in words] == SENTENCES[i].split() and all(tag in TAGS for _, tag in words)


def assert_same(a, b) -> None:
    """Stage values equal: tensors exactly, dicts by key, anything else by ==."""
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    else:
        assert a == b


def line_of(kind: str, text: str) -> int:
    """The number of the line of ``kind``'s handler.py that holds ``text``."""
    (number,) = [i for i, line in enumerate((HERE / kind / "handler.py").read_text().splitlines(), 1) if text in line]
    return number


def opened(kind: str, tmp_path: Path, **kwargs) -> hk.Harness:
    return hk.Harness.open(model_dir(kind, tmp_path / kind, **kwargs))


def edited(kind: str, tmp_path: Path, *edits: tuple[str, str]) -> hk.Harness:
    """``kind``'s harness after the user's edits of handler.py (each ``(old, new)``)."""
    directory = model_dir(kind, tmp_path / kind)
    source = (directory / "handler.py").read_text()
    for old, new in edits:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    (directory / "handler.py").write_text(source)
    return hk.Harness.open(directory)


def each_kind(*kinds: str):
    """``kinds`` (default all) as parameters, those on TorchServe's BaseHandler marked so."""
    marked = [pytest.param(k, marks=pytest.mark.torchserve) if k in ON_TORCHSERVE else k for k in kinds or KINDS]
    return pytest.mark.parametrize("kind", marked)


def bar_axes(fig) -> list:
    """The axes holding bars, and per axes ``(labels top-down, widths)``."""
    return [
        ([t.get_text() for t in ax.get_yticklabels()], [round(p.get_width(), 3) for p in ax.patches])
        for ax in fig.get_axes()
        if ax.patches
    ]


def table_cells(fig) -> dict:
    (table,) = [t for ax in fig.get_axes() for t in ax.tables]
    return {key: cell.get_text().get_text() for key, cell in table.get_celld().items()}


# ---------------------------------------------------------------------------------------------
# Every kind: stepped, and checked
# ---------------------------------------------------------------------------------------------


@each_kind()
def test_stepping_the_stages_answers_as_run_does(kind, tmp_path):
    h = opened(kind, tmp_path)
    batch = batch_of(kind)
    assert h.initialize().ok
    pre = h.preprocess(batch)
    inf = h.inference()
    post = h.postprocess()
    assert post.problems == []
    assert_answers(kind, h, batch, post.output)
    run = h.run(batch)
    assert run.mode == "stages" and list(run.stages) == ["initialize", "preprocess", "inference", "postprocess"]
    assert_same(pre.output, run.stages["preprocess"].output)
    assert_same(inf.output, run.stages["inference"].output)
    assert post.output == run.output == run.stages["postprocess"].output


@each_kind()
def test_the_checks_and_the_contract_pass(kind, tmp_path):
    h = opened(kind, tmp_path)
    batch = batch_of(kind)
    report = h.check(batch)
    assert report.ok, report
    assert [verdict for _, verdict in report.parity] == ["same alone and in the batch"] * len(batch)
    run = assert_contract(h, batch)
    assert_answers(kind, h, batch, run.output)


# ---------------------------------------------------------------------------------------------
# tabular: JSON features in, {"label", "probability"} out, on TorchServe's BaseHandler
# ---------------------------------------------------------------------------------------------


@pytest.mark.torchserve
def test_tabular_is_shown_as_a_table_of_features_bars_of_species_and_a_table_of_answers(tmp_path):
    run = opened("tabular", tmp_path).run(batch_of("tabular"))
    assert kinds(run) == ["heatmap", "bars", "table"]
    (features,) = panels(run.stages["preprocess"])
    assert features.kind == "heatmap" and features.data["labels"] == [[f"{v:.3g}" for v in row] for row in FEATURES]
    fig = hk.show(run.stages["preprocess"])
    assert not any(name in texts(fig) for name in SPECIES)  # no class bars on input features
    assert sorted(t.get_text() for ax in fig.get_axes() for t in ax.texts) == sorted(
        f"{v:.3g}" for row in FEATURES for v in row
    )
    bars = bar_axes(hk.show(run.stages["inference"]))
    assert len(bars) == 3 and all(sorted(labels) == sorted(SPECIES) for labels, _ in bars)
    for (labels, widths), answer in zip(bars, run.output):  # the top bar is the answer
        assert labels[0] == answer["label"] and widths[0] == pytest.approx(answer["probability"], abs=1e-3)
    cells = table_cells(hk.show(run.stages["postprocess"]))
    assert [cells[(0, 0)], cells[(0, 1)]] == ["label", "probability"]
    assert [[cells[(r + 1, 0)], cells[(r + 1, 1)]] for r in range(3)] == [
        [a["label"], f"{a['probability']:g}"] for a in run.output
    ]


@pytest.mark.torchserve
def test_tabular_a_misspelt_field_is_the_clients_and_rows_of_different_lengths_their_combination(tmp_path):
    h = opened("tabular", tmp_path)
    misspelt = hk.batch(hk.Request.json({"features": FEATURES[0]}), hk.Request.json({"feature": FEATURES[1]}))
    with pytest.raises(StageError, match=r"preprocess failed in TabularHandler for request 1: KeyError: 'features'"):
        h.run(misspelt)
    error = h.results["preprocess"].error
    assert error.stage == "preprocess" and error.request_index == 1
    assert error.fix.startswith(
        "the client's payload lacks the key 'features' (did you mean 'feature'?): request 1 sent a JSON object with "
        "'feature'. Send 'features' in the request"
    )
    short = hk.batch(hk.Request.json({"features": FEATURES[0]}), hk.Request.json({"features": FEATURES[1][:3]}))
    with pytest.raises(StageError, match=r"for the batch: ValueError: expected sequence of length 4") as info:
        h.preprocess(short)
    assert info.value.request_index is None
    assert info.value.fix.startswith("each of the 2 requests passes preprocess alone, so it is their combination")
    assert info.value.fix.endswith(f"or make handler.py line {line_of('tabular', 'torch.tensor(')} pad them")


# ---------------------------------------------------------------------------------------------
# text: a sentence in, {label: probability} out, on handlerkit's BaseHandler
# ---------------------------------------------------------------------------------------------


def test_text_is_shown_as_its_words_and_bars_of_its_labels(tmp_path):
    run = opened("text", tmp_path).run(batch_of("text"))
    assert kinds(run) == ["html", "bars"]  # postprocess's {label: p} repeats the bars: left out
    (tokens,) = panels(run.stages["preprocess"])
    assert tokens.kind == "html" and tokens.notes == ["vocabulary: handler.vocab"]
    assert tokens.data["cells"] == [["the", "movie", "was", "great", "<pad>"], ["a", "boring", "and", "bad", "film"]]
    bars = bar_axes(hk.show(run.stages["inference"]))
    assert [sorted(labels) for labels, _ in bars] == [["negative", "positive"]] * 2
    (scores,) = panels(run.stages["postprocess"])
    assert scores.kind == "bars"
    for (labels, values), answer in zip(scores.data["samples"], run.output):
        assert dict(zip(labels, values)) == answer and values == sorted(values, reverse=True)


def test_text_bytes_that_are_not_utf8_are_told_as_the_clients_encoding(tmp_path):
    h = opened("text", tmp_path)
    latin = hk.Request.from_bytes("un film génial".encode("latin-1"), "application/octet-stream")
    with pytest.raises(StageError, match=r"preprocess failed in SentimentHandler for request 1: UnicodeDecodeError"):
        h.run([hk.Request.text("the film was good"), latin])
    error = h.results["preprocess"].error
    assert error.request_index == 1 and error.location[2] == 'text = text.decode("utf-8")'
    assert error.fix == (
        "request 1's bytes do not decode (UnicodeDecodeError at handler.py line 24): the body is not UTF-8: send "
        "text with content-type text/plain; charset=utf-8, or decode with errors='replace'. A handler cannot trust "
        "what clients send: validate it in preprocess and refuse that request alone (self.refuse(index, message, "
        "fix=...), see handlerkit.handlers.PerRequestErrors)"
    )


# ---------------------------------------------------------------------------------------------
# signal: int16 PCM bytes in, a 1-D conv model, {"event", "confidence"} out (TorchServe's base)
# ---------------------------------------------------------------------------------------------


@pytest.mark.torchserve
def test_signal_is_shown_as_a_line_per_clip_and_bars_of_its_events(tmp_path):
    run = opened("signal", tmp_path).run(batch_of("signal"))
    assert kinds(run) == ["lines", "bars", "table"]
    (clips,) = panels(run.stages["preprocess"])
    assert clips.data["length"] == 1024 and [label for label, _, _ in clips.data["series"]] == ["[0, 0]", "[1, 0]"]
    fig = hk.show(run.stages["preprocess"])
    lines = [ax.lines for ax in fig.get_axes()]
    assert [len(drawn) for drawn in lines] == [1, 1]
    loud, quiet = (np.abs(drawn[0].get_ydata()) for drawn in lines)
    assert loud.max() == pytest.approx(0.4, abs=2e-3)  # the tone's amplitude, scaled from int16
    assert quiet[600:].max() == 0  # the short clip zero-padded to 1024 samples
    bars = bar_axes(hk.show(run.stages["inference"]))
    assert [labels[0] for labels, _ in bars] == [a["event"] for a in run.output]
    assert all(sorted(labels) == sorted(EVENTS) for labels, _ in bars)
    cells = table_cells(hk.show(run.stages["postprocess"]))
    assert [cells[(0, 0)], cells[(0, 1)]] == ["event", "confidence"] and len(cells) == 3 * 2 + 2


@pytest.mark.torchserve
def test_signal_an_odd_byte_count_is_the_clients_payload(tmp_path):
    h = opened("signal", tmp_path)
    clip = pcm(tone())
    octets = "application/octet-stream"
    with pytest.raises(StageError, match=r"for request 1: ValueError: buffer length \(3999 bytes\)"):
        h.run([hk.Request.from_bytes(clip, octets), hk.Request.from_bytes(clip[:-1], octets)])
    error = h.results["preprocess"].error
    assert error.stage == "preprocess" and error.request_index == 1
    assert error.fix.startswith(
        "request 1 fails preprocess alone where request 0 passes, so what it sent is what the handler cannot read"
    )
    line = line_of("signal", "torch.frombuffer")
    assert error.fix.endswith(f"or correct handler.py line {line} if it should be read")


@pytest.mark.torchserve
def test_signal_weights_of_another_model_py_are_told_at_initialize(tmp_path):
    """Weights saved from an earlier model.py with 8 filters, under TorchServe's BaseHandler."""
    wider = {
        "conv.weight": torch.zeros(8, 1, 16),
        "conv.bias": torch.zeros(8),
        "out.weight": torch.zeros(3, 8),
        "out.bias": torch.zeros(3),
    }
    h = opened("signal", tmp_path, state_dict=wider)
    with pytest.raises(
        StageError, match=r"initialize failed in SoundEventHandler: RuntimeError: Error\(s\) in loading"
    ):
        h.initialize()
    error = h.results["initialize"].error
    assert error.request_index is None and "size mismatch for conv.weight" in error.message
    assert error.fix == "ship the model.py the weights were trained with, or re-save the weights from it"


# ---------------------------------------------------------------------------------------------
# image_to_image: an image in, a PNG out (image/png), on handlerkit's BaseHandler
# ---------------------------------------------------------------------------------------------


def test_image_to_image_is_shown_as_images_and_its_png_answers_decoded(tmp_path):
    run = opened("image_to_image", tmp_path).run(batch_of("image_to_image"))
    assert kinds(run) == ["images", "images", "images"]
    (grid,) = drawn_images(hk.show(run.stages["preprocess"]))
    pixels = run.stages["preprocess"].output  # [2, 3, 32, 32] in [0, 1]: two cells side by side, 2 pixels apart
    assert grid.shape == (36, 70, 3)
    assert np.allclose(grid[2:34, 2:34], pixels[0].permute(1, 2, 0).numpy())
    assert np.allclose(grid[2:34, 36:68], pixels[1].permute(1, 2, 0).numpy())
    (answers,) = panels(run.stages["postprocess"])
    assert answers.notes == ["decoded from PNG bytes"]
    (grid,) = drawn_images(hk.show(run.stages["postprocess"]))
    for i, left in enumerate((2, 36)):  # bytes out drawn as the images they are
        assert np.array_equal(grid[2:34, left : left + 32], np.asarray(Image.open(io.BytesIO(run.output[i]))))


def test_image_to_image_bytes_that_are_no_image_are_told_as_the_clients_body(tmp_path):
    h = opened("image_to_image", tmp_path)
    page = hk.Request.from_bytes(b"<html>404 not found</html>", "image/png")
    with pytest.raises(StageError, match=r"preprocess failed in ImageFilterHandler for request 1: Unidentified"):
        h.run([hk.Request.from_bytes(png_bytes(), "image/png"), page])
    error = h.results["preprocess"].error
    assert error.request_index == 1 and error.location[1] == line_of("image_to_image", "Image.open(")
    assert error.fix == (
        f"request 1's bytes do not decode (UnidentifiedImageError at handler.py line {error.location[1]}): the "
        "request body is not an image: send PNG/JPEG bytes as the body or the 'data' field. A handler cannot trust "
        "what clients send: validate it in preprocess and refuse that request alone (self.refuse(index, message, "
        "fix=...), see handlerkit.handlers.PerRequestErrors)"
    )


# ---------------------------------------------------------------------------------------------
# multi_input: named fields (JSON or form) in, a model taking a dict, {"decision", "score"} out
# ---------------------------------------------------------------------------------------------


def test_multi_input_is_shown_field_by_field_and_bars_of_its_decisions(tmp_path):
    run = opened("multi_input", tmp_path).run(batch_of("multi_input"))
    assert kinds(run) == ["heatmap", "bars", "bars", "table"]  # every field of the model's dict
    numbers, cities = panels(run.stages["preprocess"])  # one panel per field of the model's dict
    assert numbers.title.startswith("preprocess output['numbers']") and numbers.kind == "heatmap"
    assert numbers.data["labels"] == [["0.35", "0.52"], ["0.61", "0.2"]]
    assert cities.title.startswith("preprocess output['city']") and cities.kind == "bars"  # a value per request
    assert "decline" not in texts(hk.show(run.stages["preprocess"]))
    bars = bar_axes(hk.show(run.stages["inference"]))
    assert [labels[0] for labels, _ in bars] == [a["decision"] for a in run.output]
    cells = table_cells(hk.show(run.stages["postprocess"]))
    assert [cells[(0, 0)], cells[(0, 1)]] == ["decision", "score"]
    assert [cells[(r + 1, 1)] for r in range(2)] == [f"{a['score']:g}" for a in run.output]


def test_multi_input_a_field_left_out_is_told_as_the_clients_form_or_json(tmp_path):
    h = opened("multi_input", tmp_path)
    full = hk.Request.json({"age": 35, "income": 52, "city": "lyon"})
    with pytest.raises(StageError, match=r"preprocess failed in LoanHandler for request 1: KeyError: 'city'") as info:
        h.run([full, hk.Request.form({"age": "61", "income": "20"})])
    assert info.value.request_index == 1
    assert info.value.fix.startswith(
        "the client's form lacks the field 'city': request 1 sent the fields 'age', 'income'. "
        "Send 'city' as a form field"
    )
    with pytest.raises(StageError, match=r"for request 1: KeyError: 'city'") as info:
        h.run([full, hk.Request.json({"age": 35, "income": 52})])
    assert info.value.fix.startswith(
        "the client's payload lacks the key 'city': request 1 sent a JSON object with 'age', 'income'"
    )
    with pytest.raises(
        StageError, match=r"for request 1: ValueError: could not convert string to float: 'sixty'"
    ) as info:
        h.run([full, hk.Request.form({"age": "sixty", "income": "20", "city": "nice"})])
    assert info.value.fix.startswith("request 1 fails preprocess alone where request 0 passes")


# ---------------------------------------------------------------------------------------------
# strings: a sentence in, "word/TAG …" out as a plain string, on TorchServe's BaseHandler
# ---------------------------------------------------------------------------------------------


@pytest.mark.torchserve
def test_strings_are_shown_as_a_table_of_strings(tmp_path):
    run = opened("strings", tmp_path).run(batch_of("strings"))
    (tokens,) = panels(run.stages["preprocess"])
    assert tokens.data["cells"] == [SENTENCES[0].split(), ["a", "big", "dog", "ran", "<pad>", "<pad>"]]
    assert kinds(run) == ["html", "heatmap", "table"]
    (ax, _) = hk.show(run.stages["inference"]).get_axes()  # [2 sentences, 6 words, 5 tags]: a row per word
    assert [t.get_text() for t in ax.get_xticklabels()] == list(TAGS) and len(ax.texts) == 2 * 6 * 5
    assert ax.get_ylabel() == "row (index of the leading dims [2, 6])"
    cells = table_cells(hk.show(run.stages["postprocess"]))
    assert cells[(0, 0)] == "value" and [cells[(r + 1, 0)] for r in range(2)] == run.output


@pytest.mark.torchserve
def test_strings_joined_into_one_string_break_the_contract_at_postprocess(tmp_path):
    joined = ("        return [\n", '        return "\\n".join(\n'), ("        ]\n", "        )\n")
    h = edited("strings", tmp_path, *joined)  # one string of every answer, a line each
    batch = batch_of("strings")
    with pytest.warns(
        hk.HandlerkitWarning, match=r"postprocess: must return a list with one item per request, got str"
    ):
        h.initialize(), h.preprocess(batch), h.inference()
        post = h.postprocess()
    assert [(p.stage, p.request_index, p.severity) for p in post.problems] == [("postprocess", None, "error")]
    assert post.problems[0].fix.startswith("return a list with one str per request (the answers themselves")
    with pytest.raises(
        AssertionError,
        match=r"(?s)broke TorchServe's contract on a batch of 2 request\(s\).*"
        r"1\. postprocess, the whole batch: must return a list with one item per request, got str",
    ):
        assert_contract(h, batch)


@pytest.mark.torchserve
def test_strings_a_sentence_sent_as_raw_bytes_is_the_clients_payload(tmp_path):
    h = opened("strings", tmp_path)
    raw = hk.Request.from_bytes(b"a dog ran", "application/octet-stream")  # curl --data-binary, no text/plain
    with pytest.raises(StageError, match=r"for request 1: TypeError: unhashable type: 'bytearray'"):
        h.run([hk.Request.text("the cat sat"), raw])
    error = h.results["preprocess"].error
    assert error.stage == "preprocess" and error.request_index == 1
    assert error.fix.startswith("request 1 fails preprocess alone where request 0 passes")
