"""The ``handlerkit`` command (:mod:`handlerkit.cli`): its help, usage errors and exit codes
in-process through ``main([...])``, a few real processes for what only a process shows (imports,
exit status, how warnings print), and ``compile`` without Inductor. Each command's own tests
are in test_<command>.py beside this file, what they share in test_common.py; the helpers in
tests/_cli.py.

Exit codes under test: 0 ok, 1 a handler failed or a check found a problem, 2 a usage or
input error (one line on stderr, nothing on stdout, no traceback).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from _cli import (
    CIRCLE,
    COMMANDS,
    EAGER,
    IMAGES,
    MODEL,
    ROOT,
    SQUARE,
    STAR,
    assert_usage_error,
    cli,
    cli_json,
    copied_model,
    handler_dir,
)

from handlerkit.cli import main

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


# ------------------------------------------------------------------------ input errors: 2


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


# ---------------------------------------------------------------------------------- compile


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


# ----------------------------------------------------------------------------------- progress


def test_long_work_shows_a_bar_unless_no_progress(capsys, monkeypatch):
    monkeypatch.setenv("HANDLERKIT_PROGRESS", "1")  # as if stderr were a terminal
    code, out, err = cli(capsys, "time", MODEL, CIRCLE, "--repeat", "2", "--warmup", "0", "--json")
    assert code == 0 and "timing ImageClassifier" in err and json.loads(out)["repeat"] == 2
    code, _, err = cli(capsys, "time", MODEL, CIRCLE, "--repeat", "2", "--warmup", "0", "--no-progress")
    assert code == 0 and err == ""
