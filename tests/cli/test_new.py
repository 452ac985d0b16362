"""``handlerkit new``: a handler of each kind that works as soon as it is written.

For each kind: its own pytest file passes (in a pytest process of its own, as a user runs it),
its notebook runs (nbclient), ``handlerkit run`` and ``handlerkit check`` on its model dir exit 0
with the answers its tests expect, and ``handlerkit archive`` builds a ``.mar`` that
``Service.open`` serves. The README's "Your own handler" commands run as written.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from _cli import cli, cli_json

import handlerkit as hk
from handlerkit.cli.new import KINDS, create, templates

ROOT = Path(__file__).resolve().parents[2]
MODEL_FILES = {"MAR-INF/MANIFEST.json", "handler.py", "model.py", "model.pt", "index_to_name.json", "model-config.yaml"}


def files_under(path: Path) -> set[str]:
    return {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def projects(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One project of each kind, written once for the module."""
    base = tmp_path_factory.mktemp("projects")
    return {kind: create(f"my_{kind}", kind, base) for kind in KINDS}


@pytest.fixture(params=list(KINDS))
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


def sample_requests(project: Path, kind: str) -> list[str]:
    return [str(project / path) for path, _ in KINDS[kind].requests]


def labels(kind: str) -> list[str]:
    return [label for _, label in KINDS[kind].requests]


# ------------------------------------------------------------------------------ what it writes


def test_it_writes_a_model_dir_its_tests_and_a_notebook(projects, kind):
    project = projects[kind]
    extra = {"model/vocab.txt"} if kind == "text" else set()
    assert files_under(project) == {f"model/{name}" for name in MODEL_FILES} | extra | {
        path for path, _ in KINDS[kind].requests
    } | {"test_handler.py", "pytest.ini", f"my_{kind}.ipynb", "make_weights.py", ".gitignore"}
    manifest = json.loads((project / "model/MAR-INF/MANIFEST.json").read_text())
    assert manifest["model"] == {
        "modelName": f"my_{kind}",
        "serializedFile": "model.pt",
        "handler": "handler.py",
        "modelFile": "model.py",
        "modelVersion": "1.0",
        "configFile": "model-config.yaml",
    }
    assert manifest["runtime"] == "python" and manifest["archiverVersion"] == "0.12.0"
    assert (project / "pytest.ini").read_text().splitlines()[-1] == "hk_model_dir = model"
    texts = [p.read_text(encoding="utf-8") for p in project.rglob("*") if p.suffix in (".py", ".ipynb", ".yaml")]
    assert not [t for t in texts if re.search(r"\{\{[a-z_]+\}\}", t)], "a placeholder was left unfilled"
    notebook = json.loads((project / f"my_{kind}.ipynb").read_text())
    assert "".join(notebook["cells"][0]["source"]).startswith(f"# my_{kind}\n\n{KINDS[kind].what}.")
    assert f"LABELS = {json.dumps(labels(kind))}" in (project / "test_handler.py").read_text()


def test_the_weights_are_built_from_code_the_same_each_time_and_leave_the_random_state_alone(tmp_path, kind):
    import torch

    state = torch.random.get_rng_state()
    first, second = create("a", kind, tmp_path), create("b", kind, tmp_path)
    assert torch.equal(torch.random.get_rng_state(), state)
    weights = [torch.load(p / "model" / "model.pt", weights_only=True) for p in (first, second)]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])
    assert sum(os.path.getsize(p) for p in (first / "model").iterdir() if p.is_file()) < 20_000  # small


def test_the_templates_ship_in_the_package_not_in_the_fixtures():
    folder = templates()
    assert folder == ROOT / "handlerkit" / "assets" / "new"
    assert sorted(p.name for p in folder.iterdir()) == ["common", *sorted(KINDS)]
    assert not list((ROOT / "fixtures").rglob("make_weights.py"))
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'handlerkit = ["py.typed", "assets/**/*"]' in pyproject
    # setuptools' globs skip dotfiles: no template may be one (the .gitignore ships as gitignore)
    assert not [p for p in folder.rglob(".*")]


# -------------------------------------------------------------------------- it works at once


def test_its_own_tests_pass(projects, kind):
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"],  # no -q: the header names the model
        cwd=projects[kind],
        capture_output=True,
        text=True,
        env={**os.environ, "HANDLERKIT_PROGRESS": "0"},
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b4 passed\b", done.stdout), done.stdout
    assert f"handlerkit: model {projects[kind] / 'model'} (from the ini option hk_model_dir)" in done.stdout


def test_its_notebook_runs(projects, kind, tmp_path, monkeypatch):
    import nbclient
    import nbformat

    monkeypatch.setenv("HANDLERKIT_PROGRESS", "0")
    project = shutil.copytree(projects[kind], tmp_path / "copy")  # the notebook runs where it lives
    notebook = nbformat.read(project / f"my_{kind}.ipynb", as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(project)}}
    )
    client.execute()  # raises CellExecutionError on any failing cell, asserts included
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o["output_type"] == "error"]
    data = [o.get("data", {}) for o in outputs]
    shown = [d for d in data if "image/png" in d or "handlerkit-shown" in d.get("text/html", "")]
    assert len(shown) == 1  # hk.show(pre) (a text model's tokens: an HTML table)
    answers = [o["data"]["text/plain"] for o in outputs if "'label'" in o.get("data", {}).get("text/plain", "")]
    assert re.findall(r"'label': '(\w+)'", answers[0]) == labels(kind)
    assert any("check of" in o.get("data", {}).get("text/plain", "") and ": ok" in o["data"]["text/plain"] for o in outputs)


def test_run_and_check_on_its_model_dir_exit_0(projects, kind, capsys):
    project = projects[kind]
    code, run = cli_json(capsys, "run", project / "model", *sample_requests(project, kind))
    assert code == 0, run
    assert [answer["label"] for answer in run["output"]] == labels(kind)
    assert all(0.9 < answer["probability"] <= 1.0 for answer in run["output"])
    code, check = cli_json(capsys, "check", project / "model", *sample_requests(project, kind), "--no-progress")
    assert code == 0 and check["ok"] and check["problems"] == [], check
    assert [verdict for _, verdict in check["parity"]] == ["same alone and in the batch"] * 2
    assert {outcome for _, _, outcome in check["encodings"]} == {"same output"}


def test_archive_builds_a_mar_that_service_open_serves(projects, kind, tmp_path, capsys):
    project = projects[kind]
    code, out, _ = cli(capsys, "archive", project / "model", "-o", tmp_path / "model_store")
    assert code == 0, out
    mar = tmp_path / "model_store" / f"my_{kind}.mar"
    extra = {"vocab.txt"} if kind == "text" else set()
    assert set(zipfile.ZipFile(mar).namelist()) == MODEL_FILES | extra  # the model, not the tests
    batch = hk.batch(*(hk.Request.from_file(f) for f in sample_requests(project, kind)))
    with hk.Service.open(mar) as served:
        served.initialize()
        answers = served.handle(batch)
    assert [answer["label"] for answer in answers] == labels(kind)
    assert answers == hk.Harness.open(project / "model").run(batch).output


@pytest.mark.torchserve
def test_the_handler_runs_on_torchserves_base_handler_as_its_docstring_says(projects, kind, tmp_path):
    """What its docstring promises: with TorchServe's BaseHandler in place of handlerkit's and
    PerRequestErrors mixed in, the same answers, a request it cannot read refused alone included
    (TorchServe's initialize loads model.py, model.pt and index_to_name.json)."""
    pytest.importorskip("ts")
    project = shutil.copytree(projects[kind], tmp_path / "ts")
    handler = project / "model" / "handler.py"
    source = handler.read_text()
    assert source.count("from handlerkit.handlers import BaseHandler") == 1
    name = re.search(r"^class (\w+)\(BaseHandler\):$", source, re.M).group(1)
    assert f"class {name}(PerRequestErrors, BaseHandler)" in source  # the docstring's recipe
    source = source.replace("from handlerkit.handlers import BaseHandler",
                            "from ts.torch_handler.base_handler import BaseHandler\n\n"
                            "from handlerkit.handlers import PerRequestErrors")  # fmt: skip
    handler.write_text(source.replace(f"class {name}(BaseHandler):", f"class {name}(PerRequestErrors, BaseHandler):"))
    garbage = hk.Request.from_bytes(b"\xff\x00\xfe", "application/octet-stream")
    batch = hk.batch(*(hk.Request.from_file(f) for f in sample_requests(project, kind)), garbage)
    theirs = hk.Harness.open(project / "model")
    assert "ts.torch_handler.base_handler" in {cls.__module__ for cls in type(theirs.handler).__mro__}
    answers = theirs.run(batch).output
    assert answers == hk.Harness.open(projects[kind] / "model").run(batch).output
    assert [answer.get("label") for answer in answers[:-1]] == labels(kind) and answers[-1]["code"] == 400
    assert theirs.context.get_response_status(len(answers) - 1) == (400, "Bad Request")


# ------------------------------------------------------------------------------ the command


def test_new_prints_what_it_wrote_and_what_to_do_next(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(capsys, "new", "shapes")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"wrote shapes/: an image classifier: {KINDS['image'].what.split(': ', 1)[1]}"
    assert any(re.fullmatch(r"model/model\.pt +the model's weights, from make_weights\.py", line) for line in lines)
    assert any(re.fullmatch(r"requests/ +sample requests: blue\.png, red\.png", line) for line in lines)
    assert lines[lines.index("next:") + 1 :] == [
        "  cd shapes",
        "  python -m pytest",
        "  handlerkit run model requests/red.png requests/blue.png",
        "  handlerkit check model requests/red.png requests/blue.png",
        "  handlerkit archive model -o model_store",
    ]


def test_new_json_names_the_project_and_its_model_dir(tmp_path, capsys):
    code, data = cli_json(capsys, "new", "words", "--kind", "text", "-o", tmp_path / "made" / "here")
    assert code == 0 and data["exit_code"] == 0
    project = tmp_path / "made" / "here" / "words"
    assert data["path"] == str(project) and data["model_dir"] == str(project / "model") and data["kind"] == "text"
    assert {f["name"] for f in data["files"]} >= {"model/", "model/vocab.txt", "test_handler.py", "words.ipynb"}
    assert data["next"][0] == f"cd {shlex.quote(str(project))}"


def test_an_existing_path_is_refused_and_left_alone(tmp_path, capsys):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("keep")
    code, out, err = cli(capsys, "new", "taken", "-o", tmp_path)
    assert code == 2 and out == ""
    assert err == f"handlerkit: error: {tmp_path / 'taken'} exists: choose another NAME or -o DIR, or move it away\n"
    assert files_under(tmp_path) == {"taken/mine.txt"}


@pytest.mark.parametrize("name", ["my model", "-dash", "ünïcode", "a/b"])
def test_a_name_torchserve_refuses_is_exit_code_2(tmp_path, capsys, name):
    code, out, err = cli(capsys, "new", f"--output-dir={tmp_path}", "--", name)
    assert code == 2 and out == ""
    assert err.startswith(f"handlerkit: error: model name {name!r} is not allowed: TorchServe wants ")
    assert err.endswith("; give NAME letters, digits, '_', '-' and '.', a letter or digit first\n")
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_kind_is_a_usage_error(capsys):
    code, out, err = cli(capsys, "new", "x", "--kind", "audio")
    assert code == 2 and out == ""
    # argparse quotes the choices or not, by Python version
    assert re.search(r"argument --kind: invalid choice: 'audio' \(choose from '?image'?, '?text'?, '?tabular'?\)", err)


def test_a_failure_leaves_nothing_behind(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("handlerkit.cli.manifest.write_manifest", broken)
    with pytest.raises(OSError, match="disk full"):
        create("half", "tabular", tmp_path)
    assert list(tmp_path.iterdir()) == []  # no half/, no hidden staging folder


# ------------------------------------------------------------------------------ the README


def readme_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Your own handler\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README's 'Your own handler' section has no bash block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_readme_commands_run_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HANDLERKIT_PROGRESS", "0")
    ran = []
    for line in readme_commands():
        argv = shlex.split(line, comments=True)
        if argv[0] == "handlerkit":
            code, out, err = cli(capsys, *argv[1:])
            assert code == 0, f"{line}\n{out}{err}"
        elif argv[0] == "cd":
            os.chdir(argv[1])
        elif argv[:3] == ["python", "-m", "pytest"]:
            done = subprocess.run([sys.executable, *argv[1:], "-p", "no:cacheprovider"], capture_output=True,
                                  text=True, timeout=300)  # fmt: skip
            assert done.returncode == 0, done.stdout + done.stderr
        else:
            pytest.fail(f"the README block runs a command this test does not know: {line}")
        ran.append(argv[0])
    assert ran.count("handlerkit") == 4
    assert zipfile.ZipFile(tmp_path / "iris" / "model_store" / "iris.mar").testzip() is None
