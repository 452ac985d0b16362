"""The image handlers' safety matrix: every file of fixtures/bad, each in a child process.

``torchvision.io.decode_image`` (0.29) kills the process with a segmentation fault on some
malformed PNGs (``short_pixels.png`` is one), and no ``except`` can catch that. So each bad
input runs in a process of its own, between two good images: the test proves the process
survives, the bad request gets a clear error item and status (or, for an unusual but valid
image, the right class), and its neighbours are answered. The children fork from a
``forkserver`` that has imported torch and handlerkit once (a fresh process per case in
~0.1 s instead of ~2 s for a spawned interpreter; the server never ran torch, so forking it is safe).
"""

from __future__ import annotations

import io
import multiprocessing
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BAD = ROOT / "fixtures" / "bad"
IMAGES = ROOT / "fixtures" / "images"
MODEL_DIR = ROOT / "fixtures" / "models" / "image_classifier"

#: file -> (content type, or None to guess from the extension; status; pattern of the error)
REFUSED: dict[str, tuple[str | None, int, str]] = {
    "truncated.png": (None, 400, r"^the image is corrupt or truncated \(OSError: image file is truncated"),
    "truncated.jpg": (None, 400, r"^the image is corrupt or truncated \(OSError: image file is truncated"),
    "corrupt.png": (None, 400, r"^the image is corrupt or truncated \(OSError: broken data stream"),
    "short_pixels.png": (None, 400, r"^the image is corrupt or truncated \(OSError: image file is truncated"),
    "signature_only.png": (None, 400, r"^the 8-byte body is not an image PIL can read$"),
    "bomb.png": (None, 413, r"^the image has 400,000,000 pixels, more than the limit of 89,478,485$"),
    "huge_dims.jpg": (None, 413, r"^the image has 3,600,000,000 pixels, more than the limit of 89,478,485$"),
    "empty.bin": (None, 400, r"^an empty body$"),
    "not_an_image.txt": ("application/octet-stream", 400, r"^the 34-byte body is not an image PIL can read$"),
    "not_utf8.txt": ("application/octet-stream", 400, r"^the 47-byte body is not an image PIL can read$"),
    "not_base64.txt": (None, 400, r"^the body is a str that is not base64 \("),
    "data_url.txt": (None, 400, r"^the body is a data URL, not base64 alone$"),
    "wrong_shape.json": (None, 400, r"^a list of floats of shape \[1, 3\]; the model input is \[3, 224, 224\]$"),
    "ragged.json": (None, 400, r"^the JSON list is not a rectangular array of numbers \("),
    "object.json": (None, 400, r"^a JSON object is not an image$"),
}

#: file -> the class the fixture model must give it (None: any answer of five classes)
ANSWERED: dict[str, str | None] = {
    "alpha.png": "circle",  # transparent background composited over white
    "gray16.png": "square",  # full-range 16-bit grayscale, scaled to 8 bits (PIL's convert clips it white)
    "cmyk.jpg": "star",
    "grayscale.jpg": "cross",
    "palette_transparent.png": "triangle",
    "one_pixel.png": None,
}

PHRASES = {400: "Bad Request", 413: "Payload Too Large"}


def _request(path: Path, content_type: str | None) -> Any:
    import handlerkit as hk

    return hk.Request.from_file(path, content_type)


def _run_case(name: str, content_type: str | None) -> dict[str, Any]:
    """In the child: the bad file between two good images, through the built-in classifier."""
    import warnings

    import handlerkit as hk

    warnings.simplefilter("ignore")  # e.g. "declared text/plain but is not UTF-8": not the point here
    ctx = hk.MockContext.from_model_dir(MODEL_DIR)
    handler = hk.handlers.ImageClassifier()
    handler.initialize(ctx)
    batch = hk.batch(_request(IMAGES / "circle.png", None), _request(BAD / name, content_type), _request(IMAGES / "star.jpg", None))
    batch.bind(ctx)
    output = handler.handle(batch.data, ctx)
    return {"output": output, "status": [ctx.get_response_status(i) for i in range(3)]}


def _child(conn: Any, name: str, content_type: str | None) -> None:
    try:
        if name == "__segfault__":  # the canary: a crash must be seen as one
            os.kill(os.getpid(), signal.SIGSEGV)
        conn.send(("ok", _run_case(name, content_type)))
    except BaseException as exc:  # reported to the parent, which fails the test with it
        conn.send(("raised", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def _context() -> Any:
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "PIL.Image", "numpy", "handlerkit.handlers.image_classifier", __name__])
        return ctx
    return multiprocessing.get_context("spawn")


def in_child(name: str, content_type: str | None = None, timeout: float = 120) -> tuple[int | None, Any]:
    """(the child's exit code, what it sent back: ("ok", result) / ("raised", message) / None)."""
    ctx = _context()
    receive, send = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_child, args=(send, name, content_type))
    process.start()
    send.close()
    message = None
    if receive.poll(timeout):
        try:
            message = receive.recv()
        except EOFError:  # the child died before it could answer
            pass
    process.join(timeout)
    if process.exitcode is None:
        process.kill()
        process.join()
    return process.exitcode, message


def test_the_matrix_covers_every_bad_file():
    files = {p.name for p in BAD.iterdir()}
    assert files == set(REFUSED) | set(ANSWERED)
    assert len(files) >= 12


def test_a_crashing_child_is_seen_as_one():
    exitcode, message = in_child("__segfault__")
    assert exitcode == -signal.SIGSEGV and message is None


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_bad_input_is_refused_alone_and_the_process_survives(name):
    content_type, code, pattern = REFUSED[name]
    exitcode, message = in_child(name, content_type)
    assert exitcode == 0, f"{name}: the child process died (exit code {exitcode})"
    assert message is not None and message[0] == "ok", message
    result = message[1]
    good_before, error, good_after = result["output"]
    assert next(iter(good_before)) == "circle" and next(iter(good_after)) == "star"
    assert set(error) == {"code", "error", "fix"} and error["code"] == code, error
    assert re.search(pattern, error["error"]), error["error"]
    assert error["fix"]
    assert result["status"] == [(200, None), (code, PHRASES[code]), (200, None)]


@pytest.mark.parametrize("name", sorted(ANSWERED))
def test_unusual_image_is_answered_and_the_process_survives(name):
    exitcode, message = in_child(name)
    assert exitcode == 0, f"{name}: the child process died (exit code {exitcode})"
    assert message is not None and message[0] == "ok", message
    result = message[1]
    before, answer, after = result["output"]
    assert next(iter(before)) == "circle" and next(iter(after)) == "star"
    assert "code" not in answer and len(answer) == 5, answer
    assert sum(answer.values()) <= 1.0 + 1e-5
    if ANSWERED[name] is not None:
        assert next(iter(answer)) == ANSWERED[name], answer
    assert result["status"] == [(200, None)] * 3


# --------------------------------------------------------------------------------------------
# In-process: isolation in a full batch, and the pixel limit read from the header
# --------------------------------------------------------------------------------------------


def test_one_corrupt_image_in_a_batch_of_eight():
    import handlerkit as hk

    ctx = hk.MockContext.from_model_dir(MODEL_DIR)
    handler = hk.handlers.ImageClassifier()
    handler.initialize(ctx)
    names = ["circle.png", "square.png", "triangle.png", "star.png", "cross.png", "star.jpg", "circle.png"]
    requests = [hk.Request.from_file(IMAGES / n) for n in names]
    requests.insert(3, hk.Request.from_file(BAD / "corrupt.png"))
    batch = hk.batch(*requests)
    batch.bind(ctx)
    output = handler.handle(batch.data, ctx)
    assert len(output) == 8
    assert output[3]["code"] == 400 and "corrupt or truncated" in output[3]["error"]
    assert ctx.get_response_status(3) == (400, "Bad Request")
    for i, name in enumerate(names[:3] + [None] + names[3:]):
        if name is not None:
            assert next(iter(output[i])) == Path(name).stem, (i, output[i])
            assert ctx.get_response_status(i) == (200, None)
    assert sorted(handler.request_errors) == [3]


def test_a_bomb_is_refused_from_its_header_without_decoding(monkeypatch):
    import handlerkit as hk
    from handlerkit.handlers import _decode, vision

    decoded: list[Any] = []
    real_load = _decode.load_image
    monkeypatch.setattr(vision, "load_image", lambda image, index: decoded.append(image.size) or real_load(image, index))
    ctx = hk.MockContext.from_model_dir(MODEL_DIR)
    handler = hk.handlers.ImageClassifier()
    handler.initialize(ctx)
    batch = hk.batch(hk.Request.from_file(BAD / "bomb.png"), hk.Request.from_file(BAD / "huge_dims.jpg"), hk.Request.from_file(IMAGES / "circle.png"))
    batch.bind(ctx)
    output = handler.handle(batch.data, ctx)
    assert [item.get("code") for item in output[:2]] == [413, 413]
    assert next(iter(output[2])) == "circle"
    assert decoded == [(256, 256)]  # only the good image was decoded


def test_pixels_between_the_limit_and_twice_it_are_refused_too(monkeypatch):
    # PIL raises only above twice Image.MAX_IMAGE_PIXELS (it warns between); handlerkit refuses
    # everything above the limit, silently, before decoding.
    import warnings

    from PIL import Image

    import handlerkit as hk

    image = Image.new("RGB", (120, 100))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 8000)  # 12,000 pixels: between 1x and 2x
    ctx = hk.MockContext.from_model_dir(MODEL_DIR)
    handler = hk.handlers.ImageClassifier()
    handler.initialize(ctx)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        [item] = handler.handle([{"body": bytearray(buffer.getvalue())}], ctx)
    assert item["code"] == 413
    assert item["error"] == "the image has 12,000 pixels (120 x 100), more than the limit of 8,000"


def test_an_error_in_a_subclass_postprocess_points_at_the_subclass_line():
    """The subclass's postprocess is wrapped (error items put back); the StageError still names
    the line of the subclass that raised, not the wrapper's."""
    import handlerkit as hk
    from handlerkit.handlers import ImageClassifier

    class Broken(ImageClassifier):
        def postprocess(self, data):
            raise ValueError("no labels today")  # the line the error must name

    h = hk.Harness(Broken, hk.MockContext.from_model_dir(MODEL_DIR))
    with pytest.raises(hk.StageError) as caught:
        h.run(hk.batch(hk.Request.from_file(IMAGES / "circle.png")))
    error = caught.value
    assert error.stage == "postprocess"
    assert error.location is not None and os.path.samefile(error.location[0], __file__)
    assert error.location[2] == 'raise ValueError("no labels today")  # the line the error must name'
