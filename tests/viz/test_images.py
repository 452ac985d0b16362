"""handlerkit/viz/images.py: image grids de-normalised with the handler's transform, feature maps
scaled per channel, heat maps; every grid bounded."""

from __future__ import annotations

import numpy as np
import torch
from _viz import (
    IMAGES,
    ROOT,
    classifier,  # noqa: F401 (a fixture)
    panels,
)

from conftest import bomb_png, png_bytes
from handlerkit.viz.handler_view import HandlerView
from handlerkit.viz.images import (
    MAX_VALUE_COLS,
    MAX_VALUE_ROWS,
    decode_image,
    encoded_images_panel,
    features_panel,
    grid,
    heatmap_panel,
    images_panel,
    unit_images,
)
from handlerkit.viz.panel import MAX_SIDE, Context


def test_the_image_grid_is_de_normalised_with_the_handlers_transform(classifier):
    """The grid's pixels are the photo's (Resize, CenterCrop, ToTensor), not the normalised values."""
    from PIL import Image
    from torchvision import transforms

    panel = panels(classifier.run.stages["preprocess"])[0]
    assert "mean=[0.485, 0.456, 0.406]" in panel.notes[0] and "handler.image_processing" in panel.notes[0]
    photo = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor()])(
        Image.open(IMAGES / "circle.png").convert("RGB"))
    picture = panel.data["grid"]  # 2 x 2 images of 224 with 2-pixel padding
    drawn = torch.as_tensor(picture[2:226, 2:226]).permute(2, 0, 1).float()
    assert (drawn - photo).abs().max() < 1e-4


def test_without_a_handler_the_images_are_rescaled_and_say_so(classifier):
    panel = panels(classifier.pixels)[0]
    assert panel.kind == "images" and "no Normalize found on the handler" in panel.notes[-1]


def test_pixels_are_brought_to_unit_range_by_what_they_are():
    view = HandlerView()
    x, note = unit_images(torch.full((1, 3, 2, 2), 255, dtype=torch.uint8), view)
    assert note == "uint8 pixels" and torch.equal(x, torch.ones(1, 3, 2, 2))
    x, note = unit_images(torch.full((1, 1, 2, 2), 51.0), view)
    assert note == "0-255 values scaled to [0, 1]" and torch.allclose(x, torch.full((1, 1, 2, 2), 0.2))
    x, note = unit_images(torch.tensor([[[[-4.0, 6.0]]]]), view)
    assert torch.equal(x, torch.tensor([[[[0.0, 1.0]]]])) and "rescaled to its own range" in note
    x, note = unit_images(torch.tensor([[[[0.5, float("nan")]]]]), view)
    assert note == "values in [0, 1]" and torch.equal(x, torch.tensor([[[[0.5, 0.0]]]]))
    three = HandlerView(mean=[0.5] * 3, std=[0.5] * 3, normalize_at="handler.t")
    x, note = unit_images(torch.zeros(1, 1, 2, 2), three)  # one channel, a 3-channel Normalize
    assert note.startswith("not de-normalised: handler.t normalises 3 channels, the image has 1")


def test_the_grid_holds_at_most_max_images_and_max_side_pixels():
    ctx = Context(HandlerView(), max_images=4)
    panel = images_panel(torch.rand(10, 3, 2000, 100), ctx, "big")
    assert "first 4 of 10 images" in panel.notes and any(n.startswith("every ") for n in panel.notes)
    assert max(panel.data["grid"].shape[:2]) <= MAX_SIDE and panel.data["grid"].shape[2] == 3


def test_feature_maps_scale_each_channel_to_its_own_range_and_leave_nan_blank():
    x = torch.stack([torch.tensor([[0.0, 10.0], [5.0, 10.0]]), torch.tensor([[-1.0, float("nan")], [1.0, 0.0]])])
    panel = features_panel(x, Context(HandlerView()), "maps")
    picture = panel.data["grid"]  # 2 channels side by side, 2-pixel NaN padding
    assert picture.shape == (2 + 2 + 2, 2 * (2 + 2) + 2)
    np.testing.assert_allclose(picture[2:4, 2:4], [[0.0, 1.0], [0.5, 1.0]])
    second = picture[2:4, 6:8]
    assert np.isnan(second[0, 1]) and np.isnan(picture[0, 0])
    np.testing.assert_allclose(second[[0, 1, 1], [0, 0, 1]], [0.0, 1.0, 0.5])
    assert "each channel scaled to its own range" in panel.notes


def test_a_heat_map_keeps_the_tensor_s_shape_for_its_axes_and_subsamples():
    panel = heatmap_panel(torch.arange(12.0).reshape(3, 4), "m")
    assert panel.data["shape"] == (3, 4) and panel.data["values"][2, 3] == 11.0 and panel.notes == []
    panel = heatmap_panel(torch.zeros(3000, 10), "tall")
    assert panel.data["shape"] == (3000, 10) and panel.data["values"].shape == (1000, 4)
    assert panel.notes == ["every 3th row and column"] and "labels" not in panel.data


def test_a_feature_table_has_every_value_written_in_and_a_larger_one_none():
    panel = heatmap_panel(torch.tensor([[5.1, 3.5, 1.4, 0.2], [6.2, 2.9, 4.3, 1.3]]), "features")
    assert panel.data["labels"] == [["5.1", "3.5", "1.4", "0.2"], ["6.2", "2.9", "4.3", "1.3"]]
    assert panel.size[0] < 4.8 and panel.size[1] < 4.0  # sized to the table
    assert heatmap_panel(torch.tensor([[1, 0], [0, 1]]), "mask").data["labels"] == [["1", "0"], ["0", "1"]]
    assert heatmap_panel(torch.tensor([[1e-5, 123456.0]]), "m").data["labels"] == [["1e-05", "1.23e+05"]]
    edge = heatmap_panel(torch.zeros(MAX_VALUE_ROWS, MAX_VALUE_COLS), "edge")
    assert len(edge.data["labels"]) == MAX_VALUE_ROWS
    assert "labels" not in heatmap_panel(torch.zeros(MAX_VALUE_ROWS, MAX_VALUE_COLS + 1), "wide").data
    assert "labels" not in heatmap_panel(torch.zeros(MAX_VALUE_ROWS + 1, 2), "tall").data


def test_a_grid_of_different_sizes_pads_each_to_the_largest():
    images = [torch.full((3, 2, 2), 100, dtype=torch.uint8), torch.full((3, 4, 3), 200, dtype=torch.uint8)]
    out = grid(images)
    assert out.shape == (2 + 4 + 2, 2 + 2 * (3 + 2), 3)  # 2 columns of width 3, rows of height 4
    assert out[2, 2, 0] == 100 and out[5, 3, 0] == 0 and out[2, 7, 0] == 200 and out[0, 0, 0] == 255


def test_encoded_images_decode_as_the_handlers_decode_them_bounded_to_the_grid():
    from PIL import Image

    photo = (IMAGES / "star.jpg").read_bytes()
    picture, kind = decode_image(photo, 1000)
    expected = torch.from_numpy(np.array(Image.open(IMAGES / "star.jpg").convert("RGB"))).permute(2, 0, 1)
    assert kind == "JPEG" and torch.equal(picture, expected)
    small, _ = decode_image(photo, 64)  # JPEG's draft mode, then a thumbnail: at most 64 a side
    assert max(small.shape[1:]) <= 64 and small.shape[0] == 3
    grey, kind = decode_image((ROOT / "fixtures" / "bad" / "gray16.png").read_bytes(), 1000)
    assert kind == "PNG" and grey.shape[0] == 3 and grey.dtype == torch.uint8


def test_bytes_that_are_no_image_say_why():
    bad = ROOT / "fixtures" / "bad"
    assert decode_image(b"plain text", 100) == "10 bytes that PIL cannot read as an image"
    assert decode_image((bad / "truncated.png").read_bytes(), 100) == "a PNG image that is corrupt or truncated"
    assert decode_image(bomb_png(20_000), 100) == "an image with more pixels than PIL's limit, left undecoded"
    ctx = Context(HandlerView())
    card = encoded_images_panel([b"plain text"], ctx, "answer")
    assert card.kind == "card" and card.data["lines"][-1] == "No picture: 10 bytes that PIL cannot read as an image."
    none = encoded_images_panel([b"a", b"bc"], ctx, "answers")
    assert none.data["lines"][-1] == ("No picture: none of its items is an image ([0]: 1 byte that PIL cannot read "
                                      "as an image; [1]: 2 bytes that PIL cannot read as an image).")
    some = encoded_images_panel([b"a", png_bytes()], ctx, "answers")
    assert some.kind == "images"
    assert some.notes == ["decoded from PNG bytes", "[0]: 1 byte that PIL cannot read as an image"]
