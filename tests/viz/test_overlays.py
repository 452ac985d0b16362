"""handlerkit/viz/overlays.py: masks and boxes drawn on the input image (or a dark canvas),
coloured by class with the legend's colours; background left clear; boxes bounded and ranked."""

from __future__ import annotations

import pytest
import torch

from handlerkit.viz.handler_view import HandlerView
from handlerkit.viz.overlays import (
    ALPHA,
    MAX_BOXES,
    MAX_CLASSES,
    PALETTE,
    colour,
    detections_panel,
    image_at,
    segmentation_panel,
)
from handlerkit.viz.panel import Context

GREY = torch.full((1, 3, 8, 8), 200, dtype=torch.uint8)  # the input image: uint8, drawn as it is
CANVAS = [40, 40, 40]


def rgb(hex_colour: str) -> list[int]:
    return [int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)]


def test_a_class_map_is_a_layer_in_the_legend_s_colours_over_the_grey_image_and_background_stays_clear():
    image = torch.zeros(1, 3, 8, 8, dtype=torch.uint8)
    image[0, 0], image[0, 1], image[0, 2] = 90, 150, 210  # a bluish photo: drawn in grey (150)
    classes = torch.zeros(1, 8, 8, dtype=torch.long)
    classes[0, 2:4, 2:4] = 1
    panel = segmentation_panel(classes, Context(HandlerView(), image=image), "s")
    base, layer = panel.data["grid"], panel.data["mask"]
    assert base[5, 5].tolist() == base[2, 2].tolist() == [150, 150, 150]
    assert layer[5, 5].tolist() == [0.0, 0.0, 0.0, 0.0]  # class 0: background without a mapping, clear
    assert layer[2, 2, :3].tolist() == pytest.approx([c / 255 for c in rgb(colour(1))]) and layer[2, 2, 3] == ALPHA
    assert panel.data["legend"] == [("1", colour(1))]
    assert panel.notes == ["uint8 pixels", "the input image in grey under the classes' colours"]


def test_scores_are_argmaxed_and_bool_masks_drawn_per_class_with_mapping_labels():
    scores = torch.zeros(1, 3, 8, 8)
    scores[0, 2, :4] = 1.0  # class 2 on the top half, class 0 below
    view = HandlerView(mapping={"0": "background", "1": "cat", "2": "dog"})
    panel = segmentation_panel(scores, Context(view, image=GREY), "s")
    assert panel.data["legend"] == [("dog", colour(2))]
    assert panel.data["mask"][0, 0, 3] == ALPHA and panel.data["mask"][7, 0, 3] == 0.0
    masks = torch.zeros(1, 3, 8, 8, dtype=torch.bool)
    masks[0, 1, :2] = masks[0, 2, :4] = True  # overlapping classes
    assert segmentation_panel(masks, Context(view, image=GREY), "m").data["legend"] == [("cat", colour(1)),
                                                                                          ("dog", colour(2))]


def test_without_an_input_image_a_dark_canvas_and_notes_that_say_so():
    panel = segmentation_panel(torch.zeros(1, 8, 8, dtype=torch.long), Context(HandlerView()), "s")
    assert panel.data["grid"][0, 0].tolist() == CANVAS
    assert panel.notes == ["no input image known: masks on a dark canvas (pass image=...)", "every pixel is background"]


def test_the_legend_holds_at_most_max_classes_the_largest_ones():
    classes = torch.arange(30).repeat_interleave(2).reshape(1, 6, 10)
    classes[0, 0, :] = 29  # class 29 covers the most pixels
    legend = segmentation_panel(classes, Context(HandlerView(), image=None), "s").data["legend"]
    assert [label for label, _ in legend] == [str(c) for c in [*range(5, 5 + MAX_CLASSES - 1), 29]]


def test_a_box_is_drawn_in_its_class_colour_on_a_canvas_that_holds_it():
    item = {"boxes": torch.tensor([[10.0, 10, 40, 40]]), "labels": torch.tensor([2]), "scores": torch.tensor([0.9])}
    panel = detections_panel([item], Context(HandlerView()), "d")
    picture = panel.data["grid"]  # one image: the canvas itself, 16 pixels beyond the farthest box
    assert picture.shape == (56, 56, 3)
    for y, x in ((10, 27), (27, 10), (27, 40), (40, 27)):  # the four edges
        assert picture[y, x].tolist() == rgb(colour(2))
    assert picture[37, 37].tolist() == CANVAS and picture[50, 50].tolist() == CANVAS  # inside and outside
    assert panel.notes == ["no input image known: boxes on a dark canvas (pass image=...)",
                           "1 boxes (at most 50 per image, highest scores)"]


def test_boxes_are_ranked_by_score_bounded_and_malformed_ones_dropped():
    """Without an image the canvas holds the boxes drawn: a far box shows on it only when kept."""
    small = [[0.0, 0, 4, 4]] * MAX_BOXES
    far = [20.0, 20, 30, 30]
    boxes = torch.tensor([*small, far, [float("nan"), 0, 1, 1]])
    for far_score, side in ((0.1, 4 + 16), (0.9, 30 + 16)):
        scores = torch.tensor([0.5] * MAX_BOXES + [far_score, 1.0])
        panel = detections_panel([{"boxes": boxes, "scores": scores}], Context(HandlerView()), "d")
        assert panel.data["grid"].shape[:2] == (side, side)
        assert panel.notes[-1] == f"{MAX_BOXES} boxes (at most {MAX_BOXES} per image, highest scores)"
    empty = detections_panel([{"boxes": torch.zeros(0, 4)}], Context(HandlerView(), image=GREY), "d")
    assert empty.notes == ["uint8 pixels", "no boxes"] and empty.data["grid"][0, 0].tolist() == [200, 200, 200]


def test_torchserve_s_named_boxes_take_colours_in_order_of_appearance():
    rows = [[{"cat": [2, 2, 20, 20], "score": 0.9}, {"dog": [30, 30, 50, 50], "score": 0.5}]]
    picture = detections_panel(rows, Context(HandlerView()), "d").data["grid"]
    assert picture[20, 10].tolist() == rgb(PALETTE[0]) and picture[50, 40].tolist() == rgb(PALETTE[1])


def test_image_at_finds_one_image_of_a_batch_or_list():
    assert image_at(GREY, 0).shape == (3, 8, 8) and image_at(GREY, 1) is None
    assert image_at([torch.zeros(1, 4, 4)], 0).shape == (1, 4, 4)
    assert image_at([torch.zeros(5, 4, 4)], 0) is None and image_at(None, 0) is None
