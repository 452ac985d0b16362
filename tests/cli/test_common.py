"""What every model command shares (:mod:`handlerkit.cli._common`): opening a model dir or a
.mar (exit code 2 for what is no model), the request files, ``--threads``, and errors that name
the user's file, an archive's member and a handler's line."""

from __future__ import annotations

import json
import os
import warnings
import zipfile

import pytest
from _cli import CIRCLE, EAGER, IMAGES, MODEL, SQUARE, assert_usage_error, cli, cli_json, copied_model
from _tabular import FEATURES, tabular_dir


def test_a_missing_input_file_is_one_line_and_exit_code_2(capsys):
    code, out, err = cli(capsys, "run", MODEL, "missing.png", "gone.json")
    assert_usage_error(code, out, err)
    assert err == "handlerkit: error: no such file: missing.png, gone.json\n"


def test_a_missing_model_is_exit_code_2(capsys, tmp_path):
    code, out, err = cli(capsys, "check", tmp_path / "nowhere", SQUARE)
    assert_usage_error(code, out, err, f"no such model dir or .mar: {tmp_path / 'nowhere'}")


@pytest.mark.parametrize("command", ["run", "check", "time", "compile"])
def test_a_dir_that_is_no_model_dir_is_exit_code_2(capsys, command):
    code, out, err = cli(capsys, command, IMAGES, SQUARE)  # the arguments swapped: a common slip
    assert_usage_error(code, out, err, f"{IMAGES} is not a model dir: it has no MAR-INF/MANIFEST.json")


def test_an_empty_dir_is_no_model_dir(capsys, tmp_path):
    assert_usage_error(*cli(capsys, "inspect", tmp_path), "is not a model dir")


def test_a_mar_that_is_not_a_zip_is_exit_code_2(capsys, tmp_path):
    fake = tmp_path / "model.mar"
    fake.write_bytes(b"not a zip at all")
    assert_usage_error(*cli(capsys, "run", fake, SQUARE), "model.mar is not a model archive: the file is not a zip")
    assert_usage_error(*cli(capsys, "inspect", fake), "model.mar is not a model archive")
    assert_usage_error(*cli(capsys, "run", SQUARE, SQUARE), "square.png' is not a directory, nor a model archive")  # an image as the model


def test_a_malformed_manifest_is_exit_code_2(capsys, tmp_path):
    model = tmp_path / "m"
    (model / "MAR-INF").mkdir(parents=True)
    (model / "MAR-INF" / "MANIFEST.json").write_text("{not json")
    assert_usage_error(*cli(capsys, "run", model, SQUARE), "is not valid JSON", "(fix: ")
    assert_usage_error(*cli(capsys, "inspect", model), "is not valid JSON")


def test_a_handler_that_cannot_be_found_is_exit_code_2(capsys):
    code, out, err = cli(capsys, "run", MODEL, SQUARE, "--handler", "no_such_handler.py")
    assert_usage_error(code, out, err, "no_such_handler.py")


@pytest.mark.parametrize("command", ["time", "compile", "formats"])
def test_threads_must_be_a_positive_integer(capsys, command):
    for bad in ("0", "-2", "two"):
        assert_usage_error(
            *cli(capsys, command, MODEL, CIRCLE, "--threads", bad),
            f"argument --threads: expected a positive integer: got '{bad}'",
        )


@pytest.mark.parametrize("command", ["time", "compile", "formats"])
def test_threads_run_the_command_on_n_threads_and_the_load_warning_names_the_option(
    tmp_path, request, capsys, monkeypatch, command
):
    import torch

    from handlerkit.errors import HandlerkitWarning

    monkeypatch.setattr(os, "getloadavg", lambda: (6.0, 6.0, 6.0))  # a busy machine of two cores
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    model = copied_model(tmp_path, request, EAGER.format(dynamic="false")) if command == "compile" else MODEL
    extra = ["--formats", "eager"] if command == "formats" else []
    before = torch.get_num_threads()
    warning = (
        "torch runs 2 intra-op threads on 2 core(s) while the 1-minute load is 6.0: its threads wait for busy "
        "cores, and small ops take many times their work; time on a quieter machine, or run with --threads 1 "
        "for a small model"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", HandlerkitWarning)  # said once: in the report, not on stderr too
        code, out, err = cli(capsys, command, model, CIRCLE, "--repeat", "3", "--warmup", "0", "--threads", "2", *extra)
    assert code == 0 and torch.get_num_threads() == before  # put back after the run
    assert " ".join(out.split()).count(warning) == 1 and "torch: 2 intra-op" in out and "intra-op" not in err
    code, data = cli_json(capsys, command, model, CIRCLE, "--repeat", "3", "--warmup", "0", "--threads", "1", *extra)
    assert code == 0 and data["conditions"]["intra_op_threads"] == 1 and data["conditions"]["warning"] is None
    assert torch.get_num_threads() == before


def test_a_zip_slip_mar_is_refused_and_nothing_is_written(tmp_path, capsys):
    evil = tmp_path / "inner" / "evil.mar"
    evil.parent.mkdir()
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("MAR-INF/MANIFEST.json", (MODEL / "MAR-INF" / "MANIFEST.json").read_text())
        zf.writestr("../escaped.txt", "gotcha")
    for argv in (["run", evil, SQUARE], ["inspect", evil]):
        assert_usage_error(*cli(capsys, *argv), "../escaped.txt")
    assert not list(tmp_path.rglob("escaped.txt"))


def test_errors_name_the_request_file_and_a_mars_members_by_their_names_in_it(tmp_path, capsys):
    good, misspelt = tmp_path / "good.json", tmp_path / "misspelt.json"
    good.write_text(json.dumps({"features": FEATURES}))
    misspelt.write_text(json.dumps({"feature": FEATURES}))
    _, built = cli_json(capsys, "archive", tabular_dir(tmp_path / "tabular", base="handlerkit"), "-o", tmp_path / "store")
    mar = built["path"]

    code, out, err = cli(capsys, "run", mar, good, misspelt)
    assert code == 1 and out == ""
    assert err.startswith(f"handlerkit: error: preprocess failed in TabularHandler for {misspelt}: KeyError: 'features'\n")
    assert f"\n  at {mar}/handler.py:8: " in err and "handlerkit-mar-" not in err  # the unpacked dir is gone
    assert f"{misspelt} sent a JSON object with 'feature'" in err

    code, data = cli_json(capsys, "check", mar, good, misspelt)
    assert code == 1 and [(p["request"], p["file"]) for p in data["problems"]] == [(1, str(misspelt))]
    assert data["problems"][0]["message"].startswith(f"preprocess failed in TabularHandler for {misspelt}: ")


def test_an_initialize_error_in_a_mar_names_the_file_in_the_archive(tmp_path, capsys):
    model = tabular_dir(tmp_path / "tabular", base="handlerkit", outputs=2)  # weights that do not fit
    _, built = cli_json(capsys, "archive", model, "-o", tmp_path / "store")
    code, out, err = cli(capsys, "run", built["path"])
    assert code == 1 and out == ""
    assert f"ModelLoadError: the state_dict in {built['path']}/model.pt does not fit TabNet" in err
    assert "handlerkit-mar-" not in err


def test_a_fix_from_the_command_line_says_to_run_the_command_again(tmp_path, capsys):
    model = tmp_path / "raises"
    model.mkdir()
    (model / "handler.py").write_text(
        "class Raises:\n"
        "    def initialize(self, context):\n"
        "        pass\n\n"
        "    def handle(self, data, context):\n"
        "        raise RuntimeError('the frobnicator broke')\n"
    )
    request = tmp_path / "x.json"
    request.write_text("{}")
    code, out, err = cli(capsys, "run", model, request, "--handler", "handler.py")
    assert code == 1 and "RuntimeError: the frobnicator broke" in err
    assert "correct it there, then run the command again" in err and "h.reload()" not in err


def _broken_audio_dir(path, old, new):
    from _new_users import audio_dir

    model = audio_dir(path)
    source = (model / "handler.py").read_text()
    assert old in source
    (model / "handler.py").write_text(source.replace(old, new, 1))
    return model


@pytest.mark.parametrize("old, new, line, source, raised", [
    ("def postprocess(self, scores):", "def postprocess(self, scores)", 21, "def postprocess(self, scores)", "SyntaxError: expected ':'"),
    ("import numpy as np\n", "import numpy as np\nimport soundfile\n", 5, "import soundfile", "ModuleNotFoundError: No module named 'soundfile'"),
    (
        "class SpectrogramHandler(BaseHandler):\n",
        "class SpectrogramHandler(BaseHandler):\n    def __init__(self):\n        super().__init__()\n"
        "        self.labels = open('labels.txt').read().split()\n",
        12, "self.labels = open('labels.txt').read().split()", "raised FileNotFoundError",
    ),
], ids=["syntax", "import", "constructor"])
def test_a_handler_that_fails_to_load_is_exit_code_1_with_its_file_line_and_source(tmp_path, capsys, old, new, line, source, raised):
    from _new_users import wav_bytes

    model = _broken_audio_dir(tmp_path / "sounds", old, new)
    request = tmp_path / "tone.wav"
    request.write_bytes(wav_bytes())
    for command in ("run", "check"):
        code, out, err = cli(capsys, command, model, request)
        # The model is broken, as a weights mismatch is (1), not the command line (2).
        assert code == 1 and out == "" and raised in err and "Traceback" not in err, err
        assert [l for l in err.splitlines() if l.startswith("  at ")] == [f"  at {model / 'handler.py'}:{line}: {source}"]
    code, data = cli_json(capsys, "run", model, request)
    assert code == 1 and data["error"]["type"] == "HandlerLoadError"
    assert data["error"]["location"] == {"file": str(model / "handler.py"), "line": line, "source": source}
