"""The ``handlerkit`` command: every subcommand in-process through ``main([...])``, a few real
processes for what only a process shows (imports, exit status, how warnings print).

Exit codes under test: 0 ok, 1 a handler failed or a check found a problem, 2 a usage or
input error (one line on stderr, nothing on stdout, no traceback).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest
from _tabular import FEATURES, tabular_dir

from handlerkit.cli import demo_paths, main

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "fixtures" / "models" / "image_classifier"
IMAGES = ROOT / "fixtures" / "images"
CIRCLE, STAR, SQUARE = str(IMAGES / "circle.png"), str(IMAGES / "star.jpg"), str(IMAGES / "square.png")
COMMANDS = ("demo", "new", "run", "check", "time", "compile", "formats", "manifest", "archive", "inspect", "serve")


def cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def cli_json(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, dict]:
    """Run with ``--json``: stdout must be one JSON document and nothing else."""
    code, out, _ = cli(capsys, *argv, "--json")
    data = json.loads(out)
    assert data["exit_code"] == code
    return code, data


def assert_usage_error(code: int, out: str, err: str, *fragments: str) -> None:
    assert code == 2 and out == ""
    assert err.startswith("handlerkit: error: ") and err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err


def handler_dir(path: Path, source: str) -> Path:
    """A model dir holding only handler.py with ``source`` (its manifest is inferred)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "handler.py").write_text(source)
    return path


def copied_model(tmp_path: Path, request: pytest.FixtureRequest, config: str | None = None) -> Path:
    """The fixture classifier copied, its model.py unique to the test: Dynamo remembers sizes by
    a code's file content across a process, which would make one test's batch dim dynamic in another."""
    target = tmp_path / "image_classifier"
    shutil.copytree(MODEL, target)
    with open(target / "model.py", "a") as f:
        f.write(f"\n# {request.node.nodeid}\n")
    if config is not None:
        (target / "model-config.yaml").write_text(config)
    return target


# --------------------------------------------------------------------------- help, imports


def test_help_and_every_subcommand_help_import_no_torch():
    code = (
        "import sys\n"
        "from handlerkit.cli import main\n"
        f"codes = [main(['--help'])] + [main([c, '--help']) for c in {COMMANDS!r}]\n"
        "heavy = sorted(m for m in ('torch', 'numpy', 'PIL', 'yaml', 'tqdm', 'handlerkit.harness') if m in sys.modules)\n"
        "print(codes, heavy, file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"{[0] * (len(COMMANDS) + 1)} []"


def test_python_dash_m_lists_every_command():
    done = subprocess.run([sys.executable, "-m", "handlerkit.cli", "--help"], capture_output=True, text=True)
    assert done.returncode == 0
    listed = [m.group(1) for m in re.finditer(r"^    (\S+)", done.stdout, re.M)]
    assert listed == list(COMMANDS)


def test_every_subcommand_takes_json_and_no_progress(capsys):
    for command in COMMANDS:
        assert main([command, "--help"]) == 0
        text = capsys.readouterr().out
        assert "--json" in text and "--no-progress" in text, command


def test_no_command_prints_help_and_exits_2(capsys):
    code, out, _ = cli(capsys)
    assert code == 2 and "COMMAND" in out


# ------------------------------------------------------------------------------------ demo


def test_demo_assets_ship_inside_the_package():
    model_dir, images = demo_paths()
    assert model_dir.startswith(os.path.dirname(sys.modules["handlerkit"].__file__))
    assert os.path.isfile(os.path.join(model_dir, "MAR-INF", "MANIFEST.json"))
    assert {os.path.basename(p) for p in images} >= {"circle.png", "star.jpg"}


def test_demo_prints_a_row_per_stage_predictions_and_the_note(capsys):
    code, out, _ = cli(capsys, "demo")
    assert code == 0
    for stage in ("initialize", "preprocess", "inference", "postprocess"):
        assert f"\n{stage}" in out
    assert "Tensor[3, 3, 224, 224] float32 cpu" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.split() and "." in line.split()[0]}
    assert lines["circle.png"].split()[1] == "circle"
    assert lines["star.jpg"].split()[1] == "star"
    assert out.rstrip().endswith("grace_hopper.jpg is a photo outside what it knows, so its top class is a guess.")


def test_demo_help_says_what_it_does(capsys):
    code, out, _ = cli(capsys, "demo", "--help")
    text = " ".join(out.split())
    assert code == 0
    assert "built-in image_classifier on the bundled 'shapes' model" in text
    assert "grace_hopper.jpg is a real photo outside what the shapes model knows" in text


# ------------------------------------------------------------------------------------- run


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


# ------------------------------------------------------------------------ input errors: 2


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


@pytest.mark.parametrize("argv, fragment", [
    (["run", str(MODEL), SQUARE, "--bogus"], "unrecognized arguments: --bogus (see 'handlerkit run --help')"),
    (["time", str(MODEL), SQUARE, "--sweep", "0,2"], "argument --sweep: expected distinct positive batch sizes"),
    (["time", str(MODEL), SQUARE, "--repeat", "x"], "argument --repeat: expected a positive integer: got 'x'"),
    (["archive", str(MODEL), "-o", "out", "--format", "zip"], "argument --format"),
    (["chek", str(MODEL)], "unknown command 'chek' (did you mean 'check'?)"),
    (["--nope"], "unrecognized arguments: --nope"),
    (["time", str(MODEL), SQUARE, "--repeats", "2"], "--repeats 2 (did you mean '--repeat'?)"),
])
def test_usage_errors_are_one_line_and_exit_code_2(capsys, argv, fragment):
    assert_usage_error(*cli(capsys, *argv), fragment)


def test_a_malformed_manifest_is_exit_code_2(capsys, tmp_path):
    model = tmp_path / "m"
    (model / "MAR-INF").mkdir(parents=True)
    (model / "MAR-INF" / "MANIFEST.json").write_text("{not json")
    assert_usage_error(*cli(capsys, "run", model, SQUARE), "is not valid JSON", "(fix: ")
    assert_usage_error(*cli(capsys, "inspect", model), "is not valid JSON")


def test_a_handler_that_cannot_be_found_is_exit_code_2(capsys):
    code, out, err = cli(capsys, "run", MODEL, SQUARE, "--handler", "no_such_handler.py")
    assert_usage_error(code, out, err, "no_such_handler.py")


def test_input_errors_under_json_still_give_a_document(capsys):
    code, out, err = cli(capsys, "run", MODEL, "missing.png", "--json")
    assert code == 2 and err == "handlerkit: error: no such file: missing.png\n"
    assert json.loads(out) == {"error": {"type": "InputError", "message": "no such file: missing.png", "fix": None},
                               "exit_code": 2}


def test_exit_codes_and_warnings_in_a_real_process(tmp_path):
    """What only a process shows: the exit status, and warnings printed as one line each."""
    model = handler_dir(tmp_path / "m", "def handle(data, context):\n    return ['ok' for _ in data or []]\n")
    request = tmp_path / "r.txt"
    request.write_text("x")
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    cmd = [sys.executable, "-m", "handlerkit.cli"]
    ok = subprocess.run([*cmd, "run", str(model), str(request)], capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr
    warning_lines = [line for line in ok.stderr.splitlines() if line.strip()]
    assert warning_lines and all(line.startswith("handlerkit: warning: ") for line in warning_lines), ok.stderr
    assert "inferred the manifest" in ok.stderr
    bad = subprocess.run([*cmd, "run", str(IMAGES), SQUARE], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.count("\n") == 1
    assert bad.stderr.startswith(f"handlerkit: error: {IMAGES} is not a model dir")


# ------------------------------------------------------------------------------------ check


def test_check_passes_on_the_classifier(capsys):
    code, out, _ = cli(capsys, "check", MODEL, CIRCLE, "--no-progress")
    assert code == 0 and "check of ImageClassifier on 1 request(s): ok" in out
    code, data = cli_json(capsys, "check", MODEL, CIRCLE, STAR)
    assert code == 0 and data["ok"] is True and data["problems"] == [] and len(data["parity"]) == 2


def test_check_failing_is_exit_code_1_with_the_problem_and_fix(tmp_path, capsys):
    model = handler_dir(tmp_path / "m", "def handle(data, context):\n    return ['one'] if data else []\n")
    requests = [tmp_path / "a.txt", tmp_path / "b.txt"]
    for r in requests:
        r.write_text("x")
    with pytest.warns(Warning):
        code, data = cli_json(capsys, "check", model, *requests)
    assert code == 1 and data["ok"] is False
    assert any("one item per request" in p["message"] or "1 item" in p["message"] for p in data["problems"])
    assert all(p["fix"] for p in data["problems"] if p["severity"] == "error")


# ------------------------------------------------------------------------------------- time


def test_time_prints_a_row_per_stage(capsys):
    code, out, _ = cli(capsys, "time", MODEL, CIRCLE, "--repeat", "2", "--warmup", "0")
    assert code == 0 and "timing: batch_size=1, warmup=0, repeat=2, device=cpu" in out
    rows = [line.split()[0] for line in out.splitlines() if line.split() and line.split()[0] in
            ("preprocess", "inference", "postprocess", "end_to_end")]
    assert rows == ["preprocess", "inference", "postprocess", "end_to_end"]


def test_time_sweep_json_has_a_row_per_batch_size(capsys):
    code, data = cli_json(capsys, "time", MODEL, CIRCLE, "--sweep", "1,3", "--repeat", "2", "--warmup", "0")
    assert code == 0 and data["kind"] == "sweep"
    assert [row["batch_size"] for row in data["rows"]] == [1, 3]
    assert all(row["throughput_rps"] > 0 for row in data["rows"])
    assert [r["repeat"] for r in data["reports"]] == [2, 2]


def test_time_sweep_without_sizes_uses_1_2_4_8(capsys):
    code, data = cli_json(capsys, "time", MODEL, CIRCLE, "--sweep", "--repeat", "1", "--warmup", "0")
    assert code == 0 and [row["batch_size"] for row in data["rows"]] == [1, 2, 4, 8]


# ---------------------------------------------------------------------------------- compile

EAGER = "batchSize: 4\npt2:\n  compile:\n    enable: true\n    backend: eager\n    dynamic: {dynamic}\n"


def test_compile_gate_failing_is_exit_code_1(tmp_path, request, capsys):
    model = copied_model(tmp_path, request, EAGER.format(dynamic="false"))
    code, out, _ = cli(capsys, "compile", model, CIRCLE, STAR, "--batch-sizes", "2,4", "--repeat", "1")
    assert code == 1
    assert "compiled with eager" in out and "gate: batch 4 recompile" in out
    assert "set dynamic: true in the pt2 section" in out  # the fix


def test_compile_gate_passing_is_exit_code_0(tmp_path, request, capsys):
    model = copied_model(tmp_path, request, EAGER.format(dynamic="true"))
    code, data = cli_json(capsys, "compile", model, CIRCLE, STAR, "--batch-sizes", "2,4", "--repeat", "1")
    assert code == 0 and data["applied"] is True and data["gate_ok"] is True and data["ok"] is True
    assert [g["batch_size"] for g in data["gate"]] == [2, 4]


def test_compile_of_a_model_not_compiled_says_so(capsys):
    code, out, _ = cli(capsys, "compile", MODEL, CIRCLE)
    assert code == 0 and "not compiled" in out.splitlines()[1]


# ------------------------------------------------------------------------------------ --threads


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


# ------------------------------------------------------------------------------------ inspect


def test_inspect_a_model_dir(capsys):
    code, out, _ = cli(capsys, "inspect", MODEL)
    assert code == 0
    assert out.splitlines()[0] == "image_classifier (dir): model image_classifier 1.0, handler ImageClassifier, eager: loads"
    code, data = cli_json(capsys, "inspect", MODEL)
    assert data["manifest"] == json.loads((MODEL / "MAR-INF" / "MANIFEST.json").read_text())
    assert data["handler"]["origin"] == "handlerkit" and data["handler"]["kind"] == "class"
    assert data["model"]["format"] == "eager" and data["config"]["batchSize"] == 4
    assert {f["name"] for f in data["files"]} >= {"model.pt", "model.py", "MAR-INF/MANIFEST.json"}


def test_inspect_does_not_run_initialize(tmp_path, capsys):
    model = handler_dir(tmp_path / "m", "class H:\n    def initialize(self, context):\n"
                        "        raise RuntimeError('initialize ran')\n    def handle(self, data, context):\n"
                        "        return []\n")
    code, data = cli_json(capsys, "inspect", model)
    assert data["handler"]["name"] == "H" and data["handler"]["origin"] == "model_dir"
    assert data["inferred"]["handler"] == "handler.py is in the dir" and "inferred" in data["notes"][0]
    assert data["model"]["format"] == "none (the handler loads its own model)" and code == 0


def test_inspect_reports_what_would_stop_torchserve(tmp_path, capsys):
    model = tmp_path / "broken"
    shutil.copytree(MODEL, model)
    manifest = json.loads((model / "MAR-INF" / "MANIFEST.json").read_text())
    manifest["model"]["handler"] = "no_such_handler.py"
    (model / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest))
    (model / "model-config.yaml").write_text("batchSize: '8'\n")
    (model / "model.pt").unlink()
    code, out, _ = cli(capsys, "inspect", model)
    assert code == 1 and "3 problem(s)" in out.splitlines()[0]
    _, data = cli_json(capsys, "inspect", model)
    assert sorted(p["what"] for p in data["problems"]) == ["config", "handler", "model"]
    assert all(p["fix"] for p in data["problems"])


# ----------------------------------------------------------------------- archive round trip


@pytest.fixture
def mar(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    code, data = cli_json(capsys, "archive", MODEL, "-o", tmp_path / "store")
    assert code == 0
    return Path(data["path"])


def test_archive_builds_a_mar_with_the_manifest(mar, capsys):
    assert mar.name == "image_classifier.mar" and zipfile.is_zipfile(mar)
    with zipfile.ZipFile(mar) as zf:
        manifest = json.loads(zf.read("MAR-INF/MANIFEST.json"))
    assert manifest["model"]["handler"] == "image_classifier" and manifest["model"]["modelName"] == "image_classifier"


def test_archive_prints_the_torchserve_command(tmp_path, capsys):
    code, out, _ = cli(capsys, "archive", MODEL, "-o", tmp_path, "--model-name", "shapes")
    assert code == 0 and out.startswith(f"wrote {tmp_path / 'shapes.mar'} (")
    assert f"torchserve --start --ncs --model-store {tmp_path} --models shapes=shapes.mar" in out


def test_archive_refuses_to_overwrite_without_force(mar, capsys):
    code, out, err = cli(capsys, "archive", MODEL, "-o", mar.parent)
    assert_usage_error(code, out, err, str(mar))
    assert cli(capsys, "archive", MODEL, "-o", mar.parent, "--force")[0] == 0


@pytest.mark.parametrize("fmt, name", [("no-archive", "image_classifier"), ("tgz", "image_classifier.tar.gz")])
def test_archive_formats(tmp_path, capsys, fmt, name):
    code, data = cli_json(capsys, "archive", MODEL, "-o", tmp_path, "--format", fmt)
    assert code == 0 and Path(data["path"]) == tmp_path / name and data["format"] == fmt
    code, out, _ = cli(capsys, "run", data["path"], CIRCLE)
    assert code == 0 and "circle.png  circle" in out


def test_archive_without_a_source_or_files_is_exit_code_2(capsys, tmp_path):
    assert_usage_error(*cli(capsys, "archive", "-o", tmp_path), "give SOURCE")
    assert_usage_error(*cli(capsys, "archive", MODEL, "-o", tmp_path, "--extra-files", "nowhere.json"), "nowhere.json")
    assert_usage_error(*cli(capsys, "archive", tmp_path / "nowhere", "-o", tmp_path), "does not exist")


def test_a_mar_runs_checks_and_inspects_like_its_dir(mar, capsys):
    _, from_dir = cli_json(capsys, "run", MODEL, CIRCLE, STAR)
    code, from_mar = cli_json(capsys, "run", mar, CIRCLE, STAR)
    # The model is named as its manifest names it (what TorchServe serves it as), from a .mar or its dir.
    assert code == 0 and from_mar["output"] == from_dir["output"] and from_mar["model"] == from_dir["model"] == "image_classifier"
    assert cli(capsys, "check", mar, CIRCLE)[0] == 0
    code, out, _ = cli(capsys, "inspect", mar)
    assert code == 0 and out.startswith("image_classifier.mar (mar): model image_classifier 1.0, handler ImageClassifier")
    _, data = cli_json(capsys, "inspect", mar)
    assert data["manifest"]["model"] == json.loads((MODEL / "MAR-INF" / "MANIFEST.json").read_text())["model"]
    assert {f["name"] for f in data["files"]} >= {"model.pt", "MAR-INF/MANIFEST.json"}
    assert all("compressed" in f for f in data["files"]) and data["kind"] == "mar"


def test_a_zip_slip_mar_is_refused_and_nothing_is_written(tmp_path, capsys):
    evil = tmp_path / "inner" / "evil.mar"
    evil.parent.mkdir()
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("MAR-INF/MANIFEST.json", (MODEL / "MAR-INF" / "MANIFEST.json").read_text())
        zf.writestr("../escaped.txt", "gotcha")
    for argv in (["run", evil, SQUARE], ["inspect", evil]):
        assert_usage_error(*cli(capsys, *argv), "../escaped.txt")
    assert not list(tmp_path.rglob("escaped.txt"))


# ----------------------------------------------------------------------------------- progress


def test_long_work_shows_a_bar_unless_no_progress(capsys, monkeypatch):
    monkeypatch.setenv("HANDLERKIT_PROGRESS", "1")  # as if stderr were a terminal
    code, out, err = cli(capsys, "time", MODEL, CIRCLE, "--repeat", "2", "--warmup", "0", "--json")
    assert code == 0 and "timing ImageClassifier" in err and json.loads(out)["repeat"] == 2
    code, _, err = cli(capsys, "time", MODEL, CIRCLE, "--repeat", "2", "--warmup", "0", "--no-progress")
    assert code == 0 and err == ""


def test_time_sweep_before_the_model_does_not_take_the_model_for_its_sizes(capsys):
    code, data = cli_json(capsys, "time", "--sweep", MODEL, CIRCLE, "--repeat", "1", "--warmup", "0")
    assert code == 0 and data["kind"] == "sweep" and [r["batch_size"] for r in data["rows"]] == [1, 2, 4, 8]
    assert all(key == "batch_size" or key.endswith(("_ms", "_rps")) for key in data["rows"][0])  # units in keys
    code, data = cli_json(capsys, "time", "--sweep", "1,2", MODEL, CIRCLE, "--repeat", "1", "--warmup", "0")
    assert code == 0 and [r["batch_size"] for r in data["rows"]] == [1, 2]


# ------------------------------------------------------------- errors name what the user typed
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


def test_run_awaits_an_async_handler_as_torchserves_async_worker(tmp_path, capsys):
    from _async_handlers import VLLM_STYLE, reversed_words, write_model_dir

    model_dir = write_model_dir(tmp_path, VLLM_STYLE)
    request = tmp_path / "prompt.json"
    request.write_text(json.dumps({"prompt": "served from the command line"}), encoding="utf-8")
    code, out, _ = cli(capsys, "run", model_dir, request)
    assert code == 0, out
    assert reversed_words("served from the command line") in out


# ----------------------------------------------------------------- handlers unlike the fixtures
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
