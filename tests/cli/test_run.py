"""``handlerkit run``: a model's handler on files, stage by stage; its answers, --json, and
the exit code 1 when the handler fails."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from _cli import CIRCLE, MODEL, SQUARE, STAR, cli, cli_json, handler_dir


def test_run_on_a_model_dir(capsys):
    code, out, _ = cli(capsys, "run", MODEL, SQUARE)
    assert code == 0
    assert out.startswith("handler ImageClassifier on cpu, model image_classifier\n")
    assert "square.png  square" in out


def test_run_without_files_runs_initialize_alone(tmp_path, capsys):
    code, out, _ = cli(capsys, "run", MODEL)
    assert code == 0 and out.splitlines()[1].startswith("initialize ok ")
    broken = tmp_path / "no_weights"
    shutil.copytree(MODEL, broken)
    (broken / "model.pt").unlink()
    code, data = cli_json(capsys, "run", broken)
    assert code == 1 and data["error"]["stage"] == "initialize" and "model.pt" in data["error"]["message"]


def test_run_json_is_the_only_thing_on_stdout(capsys):
    code, data = cli_json(capsys, "run", MODEL, CIRCLE, STAR)
    assert code == 0 and data["batch_size"] == 2 and data["requests"] == ["circle.png", "star.jpg"]
    assert [s["stage"] for s in data["stages"]] == ["initialize", "preprocess", "inference", "postprocess"]
    assert all(s["ok"] for s in data["stages"]) and data["problems"] == []
    top = [max(item, key=item.get) for item in data["output"]]
    assert top == ["circle", "star"]


def test_what_a_handler_prints_goes_to_stderr_under_json(tmp_path, capsys):
    model = handler_dir(tmp_path / "m", "def handle(data, context):\n    print('chatty handler')\n"
                        "    return ['ok' for _ in data or []]\n")
    request = tmp_path / "r.txt"
    request.write_text("hi")
    with pytest.warns(Warning, match="inferred the manifest"):
        code, out, err = cli(capsys, "run", model, request, "--json")
    assert code == 0 and json.loads(out)["output"] == ["ok"]
    assert "chatty handler" in err


TYPE_HANDLER = "def handle(data, context):\n    return [type(row['body']).__name__ for row in data or []]\n"


def test_requests_are_typed_by_extension_or_content_type(tmp_path, capsys):
    model = handler_dir(tmp_path / "m", TYPE_HANDLER)
    (tmp_path / "a.json").write_text('{"x": 1}')
    (tmp_path / "b.txt").write_text("hello")
    (tmp_path / "c.dat").write_text('[1, 2]')
    files = [tmp_path / "a.json", tmp_path / "b.txt", CIRCLE, tmp_path / "c.dat"]
    with pytest.warns(Warning, match="inferred the manifest"):
        _, guessed = cli_json(capsys, "run", model, *files)
    assert guessed["output"] == ["dict", "str", "bytearray", "bytearray"]
    with pytest.warns(Warning, match="inferred the manifest"):
        _, forced = cli_json(capsys, "run", model, tmp_path / "c.dat", "--content-type", "application/json")
    assert forced["output"] == ["list"]


def test_a_handler_returning_no_list_is_reported_with_exit_code_1(tmp_path, capsys):
    model = handler_dir(tmp_path / "m", "def handle(data, context):\n    return None\n")
    request = tmp_path / "request.txt"
    request.write_text("hello")
    with pytest.warns(Warning) as caught:
        code, out, _ = cli(capsys, "run", model, request, "--handler", "handler.py:handle")
    messages = [str(w.message) for w in caught]
    assert any("inferred the manifest" in m for m in messages)  # no MAR-INF/MANIFEST.json here
    assert any("must return a list" in m for m in messages)
    assert code == 1 and "contract problems" in out and out.rstrip().endswith("(all)    None")


def test_a_stage_that_raises_is_exit_code_1_with_the_stage_named(tmp_path, capsys):
    model = handler_dir(tmp_path / "m", "def handle(data, context):\n    if data:\n"
                        "        raise ValueError('no good')\n    return []\n")
    request = tmp_path / "r.txt"
    request.write_text("x")
    with pytest.warns(Warning, match="inferred the manifest"):
        code, out, err = cli(capsys, "run", model, request)
    assert code == 1 and out == ""
    assert err.startswith("handlerkit: error: ") and "no good" in err and "Traceback" not in err
    with pytest.warns(Warning, match="inferred the manifest"):
        code, data = cli_json(capsys, "run", model, request)
    assert code == 1 and data["error"]["stage"] == "handle" and "no good" in data["error"]["message"]


def test_run_awaits_an_async_handler_as_torchserves_async_worker(tmp_path, capsys):
    from _async_handlers import VLLM_STYLE, reversed_words, write_model_dir

    model_dir = write_model_dir(tmp_path, VLLM_STYLE)
    request = tmp_path / "prompt.json"
    request.write_text(json.dumps({"prompt": "served from the command line"}), encoding="utf-8")
    code, out, _ = cli(capsys, "run", model_dir, request)
    assert code == 0, out
    assert reversed_words("served from the command line") in out


def test_run_names_the_model_as_its_manifest_does_and_describes_bytes_answers(tmp_path, capsys):
    import base64

    from _new_users import image_filter_dir, png_bytes

    model = image_filter_dir(tmp_path / "blur_filter_v2")  # the manifest's modelName is "blur"
    image = tmp_path / "photo.png"
    image.write_bytes(png_bytes(24, 16))
    code, out, _ = cli(capsys, "run", model, image, image)
    assert code == 0 and out.startswith("handler BlurHandler on cpu, model blur\n")
    answers = out.split("\n\n")[-1].splitlines()
    assert re.fullmatch(r"request +answer", answers[0]) and "top predictions" not in out and "\\x89PNG" not in out
    assert re.fullmatch(r"photo\.png +PNG image, 24x16, \d+ B \(image/png\)", answers[2])
    code, data = cli_json(capsys, "run", model, image)
    [answer] = data["output"]
    assert code == 0 and data["model"] == "blur" and answer["content_type"] == "image/png"
    assert base64.b64decode(answer["base64"]).startswith(b"\x89PNG\r\n\x1a\n")
    assert '"base64": the bytes' in " ".join(cli(capsys, "run", "--help")[1].split())


def test_run_heads_a_ranked_list_as_an_answer(tmp_path, capsys):
    from _new_users import ranker_dir, ranker_request

    request = tmp_path / "user1.json"
    request.write_text(json.dumps(ranker_request(1, [3, 5])))
    code, out, _ = cli(capsys, "run", ranker_dir(tmp_path / "recs"), request)
    rows = out.split("\n\n")[-1].splitlines()
    assert code == 0 and re.fullmatch(r"request +answer", rows[0])
    assert re.fullmatch(r"user1\.json +\[\{'item_id': [35], 'score': .*\}\]", rows[2])


def test_bytes_answers_are_described_from_their_header_and_content_type():
    import io

    from _new_users import png_bytes, wav_bytes
    from PIL import Image

    from handlerkit.cli.run import describe_bytes

    jpeg = io.BytesIO()
    Image.new("RGB", (40, 30)).save(jpeg, format="JPEG")
    assert re.fullmatch(r"JPEG image, 40x30, \d+ B \(image/jpeg\)", describe_bytes(jpeg.getvalue(), "image/jpeg"))
    assert describe_bytes(png_bytes(8, 4)).startswith("PNG image, 8x4, ")  # no content type set
    assert describe_bytes(wav_bytes(440.0)) == "WAV audio, 1 channel(s), 8000 Hz, 1.00 s, 15.7 KiB"
    assert describe_bytes(b"hello", "text/plain") == "'hello', 5 B (text/plain)"
    assert describe_bytes(b"\x00\x01\x02", "application/octet-stream") == "bytes, 3 B (application/octet-stream)"
