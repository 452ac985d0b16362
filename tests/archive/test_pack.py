"""handlerkit.archive.pack: what goes into an archive, and why (the import scan it uses is tested in
tests/archive/test_imports.py, the names never swept in in tests/archive/test_rules.py).

- a model dir: the files its manifest references, the modules and packages of the dir that
  they import (transitively) and index_to_name.json are packed, with their sizes and reasons;
  everything else is left out and named; the archive runs in the harness;
- an unpacked .mar (a dir with MAR-INF/MANIFEST.json) is packed whole, and re-archiving it gives
  back the files of the archive it came from;
- hidden and secret-looking files: refused, naming each file, the rule and the fix, when a
  folder, a glob or an unpacked .mar would sweep them in; packed when named; .git never;
- ``handlerkit archive`` prints the packed files with their sizes and names what it left out;
  ``--json`` carries the same.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from _archives import CIRCLE, DEMO, HANDLER_PY, contents, without_date

import handlerkit as hk
from handlerkit import archive
from handlerkit.archive import ArchiveError
from handlerkit.cli import main
from handlerkit.errors import ModelLoadError

#: A handler that imports a module of its model dir, which imports a package of it.
HANDLER_WITH_IMPORTS = '''\
from handlerkit.handlers.image_classifier import ImageClassifier
from shapes_labels import tidy


class Shapes(ImageClassifier):
    def postprocess(self, data):
        return [{tidy(label): p for label, p in row.items()} for row in super().postprocess(data)]
'''
LOCAL_FILES = {
    "shapes_labels.py": "from shapes_text import clean\n\n\ndef tidy(label):\n    return clean(label)\n",
    "shapes_text/__init__.py": "from .strip import clean\n",
    "shapes_text/strip.py": "def clean(label):\n    return label.strip().lower()\n",
}
#: Beside the model, as a project holds them: none is packed.
OTHER_FILES = {
    "train.py": "import shapes_labels\n",
    "notes.md": "# notes\n",
    "unused.py": "VALUE = 1\n",
    "requirements.txt": "pillow\n",
    "data/train.csv": "x,y\n",
    ".env": "API_TOKEN=secret\n",
    ".git/HEAD": "ref: refs/heads/main\n",
    "shapes_text/.env": "TOKEN=secret\n",
}


def write_files(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    """A model dir as a developer keeps it (no MAR-INF): the model, a handler importing local
    code, and a training script, notes, data and secrets beside them."""
    model_dir = tmp_path / "shapes"
    model_dir.mkdir()
    for name in ("model.py", "model.pt", "model-config.yaml", "index_to_name.json"):
        shutil.copy(DEMO / name, model_dir / name)
    write_files(model_dir, {"handler.py": HANDLER_WITH_IMPORTS, **LOCAL_FILES, **OTHER_FILES})
    return model_dir


# ---------------------------------------------------------------------------------- a model dir
def test_a_model_dir_packs_what_its_code_needs_and_names_what_it_leaves_out(project: Path, tmp_path: Path) -> None:
    plan = archive.plan(project, tmp_path / "store")
    assert plan.layout == "model dir" and plan.model_name == "shapes"
    size = {name: (project / name).stat().st_size for name in ("handler.py", "model.py", "model.pt", "model-config.yaml",
                                                                "index_to_name.json", *LOCAL_FILES)}  # fmt: skip
    assert [(f.name, f.size, f.reason) for f in plan.files] == [
        ("handler.py", size["handler.py"], "the manifest's handler"),
        ("model.py", size["model.py"], "the manifest's modelFile"),
        ("model.pt", size["model.pt"], "the manifest's serializedFile"),
        ("model-config.yaml", size["model-config.yaml"], "the manifest's configFile"),
        ("index_to_name.json", size["index_to_name.json"], "labels: TorchServe's BaseHandler reads it"),
        ("shapes_labels.py", size["shapes_labels.py"], "imported by handler.py"),
        ("shapes_text/__init__.py", size["shapes_text/__init__.py"], "imported by shapes_labels.py"),
        ("shapes_text/strip.py", size["shapes_text/strip.py"], "imported by shapes_labels.py"),
    ]
    assert plan.total_size == sum(size.values())
    assert [(f.name, f.hidden) for f in plan.left_out] == [
        (".env", True), (".git/", True), ("data/", False), ("notes.md", False), ("requirements.txt", False),
        ("shapes_text/.env", True), ("train.py", False), ("unused.py", False),
    ]  # fmt: skip
    assert {f.name: f.reason for f in plan.left_out}[".env"] == "looks like environment secrets (.env)"
    text = str(plan)
    assert text.startswith(f"shapes: 8 files, {plan.total_size / 1024:.1f} KiB, from the model dir shapes/ (8 left out)")
    assert re.search(r"\nshapes_labels\.py +\d+ B +imported by handler\.py\n", text)
    flat = " ".join(text.split())  # notes wrap at 100 columns
    assert ("note: not packed: data/, notes.md, requirements.txt, train.py, unused.py — name them with --extra-files "
            "(extra_files=) to pack them") in flat  # fmt: skip
    assert ("note: not packed, hidden or secret-looking: .env, .git/, shapes_text/.env — a file named with "
            "--extra-files is packed all the same (.git never is)") in flat  # fmt: skip
    assert "<table" in plan._repr_mimebundle_()["text/html"]

    mar = plan.write()
    assert mar == tmp_path / "store" / "shapes.mar"
    assert set(contents(mar)) == {f.name for f in plan.files}
    assert without_date(archive.read_manifest(mar)) == without_date(plan.manifest)
    batch = hk.batch(hk.Request.from_file(CIRCLE))
    ctx = hk.MockContext.from_mar(mar)  # the handler imports shapes_labels, which imports shapes_text
    got = hk.Harness(ctx.manifest["model"]["handler"], ctx).run(batch).output
    reference = hk.Harness("image_classifier", hk.MockContext.from_model_dir(DEMO)).run(batch).output
    assert got == reference and max(got[0], key=got[0].get) == "circle"
    ctx.archive.cleanup()


def test_arguments_override_the_model_dir_and_the_output_is_never_archived(tmp_path: Path) -> None:
    src = tmp_path / "m"
    src.mkdir()
    (src / "handler.py").write_text(HANDLER_PY)
    (src / "weights.pt").write_bytes(b"w" * 10)
    (src / ".git").mkdir()
    (src / ".git" / "HEAD").write_text("x")
    other = tmp_path / "other.pt"
    other.write_bytes(b"o" * 10)
    out = archive.build(src, src, archive_format="tgz", version="3.1", serialized_file=str(other))
    manifest = archive.read_manifest(out)
    assert manifest["model"] == {"modelName": "m", "serializedFile": "other.pt", "handler": "handler.py", "modelVersion": "3.1"}
    assert set(contents(out)) == {"handler.py", "other.pt"}  # the dir's weights.pt is not the model's now
    again = archive.plan(src, src)
    assert [f.name for f in again.files] == ["handler.py", "weights.pt"]  # inferred: the one weights file
    assert [f.name for f in again.left_out] == [".git/"]  # the first m.tar.gz is not inside, nor named
    assert set(contents(again.write("tgz", force=True))) == {"handler.py", "weights.pt"}
    (src / "weights.onnx").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="several weights files"):
        archive.build(src, tmp_path / "o")
    two = archive.plan(src, tmp_path / "o", serialized_file="weights.onnx")  # names the one: fine
    assert two.manifest["model"] == {"modelName": "m", "serializedFile": "weights.onnx", "handler": "handler.py",
                                     "modelVersion": "1.0"}  # fmt: skip
    assert [(f.name, f.reason) for f in two.left_out] == [(".git/", "belongs to version control (.git*)"),
                                                          ("m.tar.gz", "not referenced"), ("weights.pt", "not referenced")]  # fmt: skip
    builtin = archive.plan(src, tmp_path / "o", handler="image_classifier", serialized_file="weights.onnx")
    assert [f.name for f in builtin.files] == ["weights.onnx"]  # the dir's handler.py is not the handler now
    assert "handler.py" in [f.name for f in builtin.left_out]


# ---------------------------------------------------------------------------------- the modules its code imports
def test_a_handler_that_is_not_python_is_packed_with_a_note(tmp_path: Path) -> None:
    src = tmp_path / "m"
    write_files(src, {"handler.py": "def handle(data, context:\n", "helper.py": ""})
    plan = archive.plan(src, tmp_path / "o")
    assert [f.name for f in plan.files] == ["handler.py"] and [f.name for f in plan.left_out] == ["helper.py"]
    assert "note: handler.py was not scanned for local imports: SyntaxError (line 1)" in str(plan)


def test_files_named_one_by_one_are_packed_as_the_archiver_packs_them_with_a_note_on_their_imports(
    project: Path, tmp_path: Path
) -> None:
    alone = archive.plan(None, tmp_path / "o", model_name="m", handler=str(project / "handler.py"))
    assert [f.name for f in alone.files] == ["handler.py"] and alone.left_out == []
    assert alone.notes == [f"shapes_labels.py, shapes_text/ in {project}: imported by handler.py, shapes_labels.py but "
                           "not packed; name them with --extra-files (extra_files=), or archive the model dir they "
                           "belong to"]  # fmt: skip
    plan = archive.plan(None, tmp_path / "o", model_name="m", handler=str(project / "handler.py"),
                        extra_files=[str(project / "shapes_labels.py")])  # fmt: skip
    assert [f.name for f in plan.files] == ["handler.py", "shapes_labels.py"]
    assert plan.notes == [f"shapes_text/ in {project}: imported by shapes_labels.py but not packed; name them with "
                          "--extra-files (extra_files=), or archive the model dir they belong to"]  # fmt: skip
    (tmp_path / "h.py").write_text(HANDLER_PY)
    assert archive.plan(None, tmp_path / "o", model_name="m", handler=str(tmp_path / "h.py")).notes == []


# ---------------------------------------------------------------------------------- never swept in
def test_a_folder_or_glob_never_sweeps_in_secrets_but_a_file_named_is_packed(tmp_path: Path) -> None:
    src = tmp_path / "m"
    write_files(src, {"handler.py": HANDLER_PY, "conf/labels.txt": "a\n", "conf/.env": "T=1\n",
                      "conf/server.key": "k\n", "conf/sub/id_rsa": "k\n", ".git/config": "[core]\n"})  # fmt: skip
    out = tmp_path / "store"
    with pytest.raises(ArchiveError, match=re.escape(
        "extra folder 'conf' would sweep in conf/.env, which looks like environment secrets (.env); conf/server.key, "
        "which looks like a private key (*.key); conf/sub/id_rsa, which looks like an SSH key (id_rsa*)"
    )) as info:  # fmt: skip
        archive.build(src, out, extra_files="conf")
    err = info.value
    assert err.rule == "secret-file" and [p.member for p in err.problems] == ["conf/.env", "conf/server.key", "conf/sub/id_rsa"]
    assert err.fix == ("to pack a file, name it (--extra-files conf/.env or extra_files=['conf/.env']); to leave it "
                       "out, name the files you want instead of the folder or glob")  # fmt: skip
    assert err.problems[2].fix.startswith("to pack it, name it: --extra-files conf/sub/id_rsa or")
    with pytest.raises(ArchiveError, match=r"extra files 'conf/\*\.key' would sweep in server\.key, which looks like a "
                       r"private key \(\*\.key\)") as info:  # fmt: skip
        archive.build(src, out, extra_files="conf/*.key")
    assert info.value.rule == "secret-file" and "--extra-files conf/server.key" in info.value.fix
    assert not out.exists()  # refused before writing anything

    plan = archive.plan(src, out, extra_files=["conf/.env", "conf/labels.txt"])
    assert [(f.name, f.reason) for f in plan.files] == [
        (".env", "named explicitly, though it looks like environment secrets (.env)"),
        ("labels.txt", "extra file"),
        ("handler.py", "the manifest's handler"),
    ]
    assert contents(plan.write())[".env"] == b"T=1\n"
    for named in (".git/config", ".git"):
        with pytest.raises(ArchiveError, match=f"extra file '{re.escape(named)}' is in .git, which is never packed"):
            archive.plan(src, out, extra_files=[named])


# ---------------------------------------------------------------------------------- an unpacked .mar
READS_FILES = '''\
import os


def handle(data, context):
    if data is None:
        return None
    root = context.system_properties["model_dir"]
    with open(os.path.join(root, "vocab.txt")) as f, open(os.path.join(root, "prompts", "greeting.txt")) as g:
        words = f.read().split() + g.read().split()
    return [words for _ in data]
'''


def test_an_unpacked_mar_is_packed_whole_and_rearchives_to_the_same_files(tmp_path: Path) -> None:
    """The archiver flattens extra files into the model dir and names them nowhere; a handler opens
    them at run time. Re-archiving the unpacked archive keeps every one of them."""
    inputs = tmp_path / "inputs"
    write_files(inputs, {"reader.py": READS_FILES, "vocab.txt": "circle square\n", "assets/prompts/greeting.txt": "hello\n"})
    first = archive.build(None, tmp_path / "store", model_name="reader", handler=str(inputs / "reader.py:handle"),
                          extra_files=[str(inputs / "vocab.txt"), str(inputs / "assets")])  # fmt: skip
    unpacked = archive.open_mar(first, tmp_path / "reader")
    plan = archive.plan(unpacked, tmp_path / "again")
    assert plan.layout == "unpacked .mar" and plan.left_out == []
    assert [(f.name, f.reason) for f in plan.files] == [
        ("reader.py", "the manifest's handler"),
        ("vocab.txt", "in the unpacked .mar"),
        ("prompts/greeting.txt", "in the unpacked .mar"),
    ]
    again = plan.write()
    assert contents(again) == contents(first) and without_date(archive.read_manifest(again)) == without_date(
        archive.read_manifest(first))
    ctx = hk.MockContext.from_mar(again)
    run = hk.Harness(ctx.manifest["model"]["handler"], ctx).run(hk.batch(hk.Request.json({})))
    assert run.output == [["circle", "square", "hello"]]
    ctx.archive.cleanup()

    write_files(unpacked, {".env": "T=1\n", "prompts/.env": "T=2\n", ".git/HEAD": "x\n", "old.mar": "PK"})
    with pytest.raises(ArchiveError, match=re.escape(
        "the unpacked .mar reader/ (it has MAR-INF/MANIFEST.json: all its files are packed) would sweep in .env, which "
        "looks like environment secrets (.env); prompts/.env, which"
    )) as info:  # fmt: skip
        archive.plan(unpacked, tmp_path / "again")
    assert info.value.rule == "secret-file" and info.value.fix == (
        "to pack a file, name it (--extra-files .env or extra_files=['.env']); to leave it out, move it out of the "
        "model dir")  # fmt: skip
    named = archive.plan(unpacked, tmp_path / "again", extra_files=[".env", "prompts/.env"])
    reasons = {f.name: f.reason for f in named.files}
    assert reasons[".env"] == reasons["prompts/.env"] == "named explicitly, though it looks like environment secrets (.env)"
    assert [(f.name, f.hidden) for f in named.left_out] == [(".git/", True), ("old.mar", False)]
    assert contents(named.write(force=True))["prompts/.env"] == b"T=2\n"  # in its place, not flattened


def test_the_demo_model_dir_is_an_unpacked_mar(tmp_path: Path) -> None:
    plan = archive.plan(DEMO, tmp_path)
    expected = sorted(p.relative_to(DEMO).as_posix() for p in DEMO.rglob("*") if p.is_file()
                      and "__pycache__" not in p.parts and p.parent.name != "MAR-INF")  # fmt: skip
    assert plan.layout == "unpacked .mar" and sorted(f.name for f in plan.files) == expected
    assert "accuracy.json" in expected and plan.left_out == []


# ---------------------------------------------------------------------------------- the CLI
def test_handlerkit_archive_lists_what_it_packed_and_names_what_it_left_out(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    code = main(["archive", str(project), "-o", str(store), "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    lines = out.splitlines()
    assert re.fullmatch(rf"wrote {re.escape(str(store / 'shapes.mar'))} \(\d+\.\d KiB\) in \d+\.\d\d s", lines[0])
    assert lines[1].startswith("shapes: 8 files, ") and lines[1].endswith("from the model dir shapes/ (8 left out)")
    size = (project / "model.pt").stat().st_size / 1024
    assert re.search(rf"\nmodel\.pt +{size:.1f} KiB +the manifest's serializedFile\n", out)
    assert re.search(r"\nshapes_text/strip\.py +\d+ B +imported by shapes_labels\.py\n", out)
    assert ("note: not packed: data/, notes.md, requirements.txt, train.py, unused.py — name them with --extra-files "
            "(extra_files=) to pack them") in " ".join(out.split())  # fmt: skip
    assert "note: not packed, hidden or secret-looking: .env, .git/, shapes_text/.env — " in out
    assert lines[-1] == f"serve it: torchserve --start --ncs --model-store {store} --models shapes=shapes.mar"

    code = main(["archive", str(project), "-o", str(store), "--force", "--json", "--format", "tgz"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["path"] == str(store / "shapes.tar.gz") and data["bytes"] == os.path.getsize(data["path"])
    assert data["layout"] == "model dir" and data["total_bytes"] == sum(f["bytes"] for f in data["files"])
    assert {f["name"]: f["bytes"] for f in data["files"]}["model.pt"] == (project / "model.pt").stat().st_size
    assert {f["name"]: f["why"] for f in data["left_out"]} == {
        ".env": "looks like environment secrets (.env)", ".git/": "belongs to version control (.git*)",
        "data/": "not referenced", "notes.md": "not referenced", "requirements.txt": "not referenced",
        "shapes_text/.env": "looks like environment secrets (.env)", "train.py": "not referenced",
        "unused.py": "not referenced",
    }  # fmt: skip

    write_files(project, {"conf/.env": "T=1\n"})
    code = main(["archive", str(project), "-o", str(store), "--force", "--extra-files", str(project / "conf")])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.startswith(f"handlerkit: error: extra folder '{project / 'conf'}' would sweep in conf/.env, "
                                   "which looks like environment secrets (.env) (fix: to pack a file, name it")  # fmt: skip
