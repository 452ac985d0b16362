"""hk.show(run) on new users' handlers (tests/_new_users.py) and the fixtures' detector: every
figure fits JupyterLab's output width, dict and tuple values drawn whole, a failed request's
error and fix in its panel, one colour per class across a run, a streamed run's texts as HTML."""

from __future__ import annotations

import html
import re

import numpy as np
import pytest
import torch
from _new_users import char_stream_dir, image_filter_dir, png_bytes, ranker_dir, ranker_request
from _viz import IMAGES, ROOT, panels, texts

import handlerkit as hk
from handlerkit.summaries import describe
from handlerkit.viz.overlays import PALETTE
from handlerkit.viz.shown import Shown

MAX_PX = 1200  # JupyterLab's output area at 100 %


def width_px(shown) -> float:
    fig = shown.figure if isinstance(shown, Shown) else shown
    return float(fig.get_size_inches()[0] * fig.dpi)


@pytest.fixture(scope="module")
def ranker(tmp_path_factory):
    h = hk.Harness.open(ranker_dir(tmp_path_factory.mktemp("recs")))
    lists = [(1, [3, 4, 5, 6]), (2, [7, 8]), (3, list(range(7)))]
    return h.run(hk.batch(*(hk.Request.json(ranker_request(u, items)) for u, items in lists)))


def test_a_multi_input_run_draws_every_named_tensor_once_its_mask_as_a_grid(ranker):
    drawn = [(p.kind, p.title) for p in panels(ranker)]
    assert [t for _, t in drawn[:3]] == [
        "preprocess output[0]: Tensor[3] int64 cpu: values",
        "preprocess output[1]: Tensor[3, 7] int64 cpu: tokens",
        "preprocess output[2]: Tensor[3, 7] bool cpu: mask (1 = True)",
    ]
    # inference returns (scores, item_ids, mask): the ids and mask it passed on are drawn once
    assert [t for _, t in drawn[3:]] == [
        "inference output[0]: Tensor[3, 7] float32 cpu",
        "postprocess output: list[3] of list[4|2|7] of dict(2 keys)",
    ]
    mask = panels(ranker)[2]
    assert mask.kind == "heatmap" and mask.data["labels"] == [
        ["1"] * 4 + ["0"] * 3, ["1"] * 2 + ["0"] * 5, ["1"] * 7]


def test_ranked_lists_are_a_table_with_every_score_and_their_lengths(ranker):
    assert describe(ranker.output) == "list[3] of list[4|2|7] of dict(2 keys)"
    shown = hk.show(ranker)
    assert isinstance(shown, Shown) and width_px(shown) <= MAX_PX
    page = shown._repr_html_()
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", page)]
    rows = [(r[0].strip("[]"), *r[1:]) for r in cells if len(r) == 4 and r[0].startswith("[")]
    assert len(rows) == 4 + 2 + 7
    for request, rank, item, score in rows:
        answer = ranker.output[int(request)][int(rank)]
        assert int(item) == answer["item_id"] and float(score) == pytest.approx(answer["score"], rel=5e-3, abs=5e-4)  # 3 digits
    assert "lengths [4, 2, 7]" in page


def test_a_failed_request_shows_its_error_and_fix_and_no_table_drops_them():
    h = hk.Harness("image_classifier", hk.MockContext.from_model_dir(str(ROOT / "fixtures" / "models" / "image_classifier")))
    run = h.run(hk.batch(hk.Request.from_file(str(IMAGES / "circle.png")), hk.Request.from_bytes(b"not an image", "image/png")))
    error = run.output[1]
    fig = hk.show(run)
    assert width_px(fig) <= MAX_PX and fig.get_suptitle() == "Run of 2 request(s): request 1 failed"
    card = [p for p in panels(run) if p.kind == "card"][-1]
    assert card.title == "postprocess output[1]: request 1 failed (400)"
    assert card.data["lines"][:2] == [f"error: {error['error']}", f"fix: {error['fix']}"]
    drawn = texts(fig)
    assert "not an image PIL can read" in drawn and "send a PNG/JPEG file" in drawn
    from handlerkit.viz.tables import json_table_panel

    wide = [{f"k{i}": i for i in range(6)}, {"code": 400, "error": "bad", "fix": "send a good one"}]
    table = json_table_panel(wide, "t")  # 9 keys, 6 columns: error and fix among them
    assert "error" in table.data["columns"] and "fix" in table.data["columns"]
    assert table.notes[0] == "first 6 of 9 keys"


def _palette_pixels(image: np.ndarray) -> set[str]:
    """The class colours drawn (at least 30 pixels of exactly that colour)."""
    flat = image.reshape(-1, image.shape[-1])[:, :3]
    found = set()
    for hex_colour in PALETTE:
        rgb = [int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)]
        if int((flat == rgb).all(1).sum()) >= 30:
            found.add(hex_colour)
    return found


def test_a_detector_run_gives_a_class_one_colour_in_every_panel():
    h = hk.Harness("object_detector", hk.MockContext.from_model_dir(str(ROOT / "fixtures" / "models" / "object_detector")))
    run = h.run(hk.batch(hk.Request.from_file(str(IMAGES / "circle.png")), hk.Request.from_file(str(IMAGES / "cross.png"))))
    inference, post = [p for p in panels(run) if p.kind == "overlay"]
    assert inference.title == "inference output: detections" and post.title == "postprocess output: detections"
    colours = _palette_pixels(inference.data["grid"])
    assert colours and colours == _palette_pixels(post.data["grid"])
    assert width_px(hk.show(run)) <= MAX_PX  # three stages: 1440 px before


def test_a_bytes_out_run_fits_the_output_width(tmp_path):
    h = hk.Harness.open(image_filter_dir(tmp_path / "blur"))
    run = h.run(hk.batch(hk.Request.from_bytes(png_bytes(seed=1), "image/png"), hk.Request.from_bytes(png_bytes(seed=2), "image/png")))
    fig = hk.show(run)
    assert width_px(fig) <= MAX_PX
    assert [p.kind for p in panels(run)] == ["images", "images", "images"]


def test_a_streamed_run_fits_with_short_labels_its_texts_as_html_and_its_first_chunk_time_once(tmp_path):
    h = hk.Harness.open(char_stream_dir(tmp_path / "chars"))
    run = h.run(hk.batch(hk.Request.text("hello"), hk.Request.text("abc")))
    shown = hk.show(run)
    assert isinstance(shown, Shown) and width_px(shown) <= MAX_PX
    drawn = texts(shown.figure)
    ids = [s.request_id for s in run.streams]
    assert all(len(i) > 12 and i not in drawn and f"{i[:8]}…" in drawn for i in ids)  # UUIDs, shortened
    assert len(re.findall(r"\d+\.\d ms", drawn)) == 1  # the first chunk came at once for both: said once
    page = html.unescape(shown._repr_html_())
    for stream, answer in zip(run.streams, run.output):
        letters = "".join(c.body.decode() for c in stream.chunks)  # a character a chunk: read as text
        cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", page)]
        assert any(row[-2:] == [letters, answer] for row in cells)
    assert "chunk texts, in order (a character each)" in page  # no '·' promised where none is drawn
    kinds = [p.kind for p in panels(run)]  # the timeline; chunk texts and prompts' ids as HTML
    assert kinds[0] == "timeline" and set(kinds[1:]) == {"html"} and "table" not in kinds
