"""Shared by the archive tests (test_archive*.py): the demo model, archives crafted in code, the
files a user hands the archiver, the real torch-model-archiver, and what an archive holds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
import tempfile
import warnings
import zipfile
from pathlib import Path

import pytest

from handlerkit import archive
from handlerkit.archive import ArchiveError

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "fixtures" / "models" / "image_classifier"
CIRCLE = REPO / "fixtures" / "images" / "circle.png"
ARCHIVER = Path(os.sys.executable).parent / "torch-model-archiver"
needs_archiver = pytest.mark.skipif(not ARCHIVER.is_file(), reason="torch-model-archiver 0.12 (test dependency) not installed")

HANDLER_PY = "def handle(data, context):\n    return None if data is None else [sorted(row) for row in data]\n"
GOOD_MANIFEST = {
    "createdOn": "01/01/2025 00:00:00",
    "runtime": "python",
    "model": {"modelName": "tiny", "handler": "handler.py:handle", "modelVersion": "1.0"},
    "archiverVersion": "0.12.0",
}


def write_zip(
    path: Path, entries: list[tuple[str | zipfile.ZipInfo, bytes]], manifest: dict | bytes | None = GOOD_MANIFEST
) -> Path:
    """A zip of (name or crafted ZipInfo, data), plus MAR-INF/MANIFEST.json unless None."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns on the duplicate names we write on purpose
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in entries:
                zf.writestr(name, data)
            if manifest is not None:
                data = manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode()
                zf.writestr("MAR-INF/MANIFEST.json", data)
    return path


def with_model(**keys: str) -> dict:
    """GOOD_MANIFEST with these ``model`` keys added or replaced."""
    return {**GOOD_MANIFEST, "model": {**GOOD_MANIFEST["model"], **keys}}


def good_entries() -> list[tuple[str, bytes]]:
    return [("handler.py", HANDLER_PY.encode())]


def snapshot(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def refused(mar: Path, rule: str, tmp_path: Path, member: str | None = None, **kwargs) -> ArchiveError:
    """open_mar refuses ``mar`` for ``rule``; nothing is written anywhere under tmp_path."""
    before = snapshot(tmp_path)
    target = tmp_path / "out" / "model"
    with pytest.raises(ArchiveError) as info:
        archive.open_mar(mar, target, **kwargs)
    err = info.value
    assert rule in {p.rule for p in err.problems}, [(p.rule, p.message) for p in err.problems]
    assert err.path == str(mar)
    assert err.fix
    if member is not None:
        assert member in {p.member for p in err.problems}, [(p.rule, p.member) for p in err.problems]
    after = snapshot(tmp_path)
    assert after - before <= {"out"}, after - before  # at most the (empty) parent of the target
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    return err


def run_archiver(tmp: Path, fmt: str, *args: str) -> Path:
    out = tmp / f"ref-{fmt}"
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(ARCHIVER), *args, "--export-path", str(out), "--archive-format", fmt, "--force"],
                   check=True, capture_output=True, cwd=tmp, timeout=120)  # fmt: skip
    return next(out.iterdir())


def contents(path: Path) -> dict[str, bytes]:
    """Every file of a .mar, .tar.gz or dir, by path in the model dir (MANIFEST.json left out)."""
    if path.is_dir():
        found = {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    elif path.suffix == ".mar":  # (zipfile.is_zipfile would take a level-0 tar.gz of a torch.save file for one)
        with zipfile.ZipFile(path) as zf:
            found = {i.filename: zf.read(i) for i in zf.infolist()}
    else:
        with tarfile.open(path) as tf:
            found = {m.name.split("/", 1)[1]: tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()}
    found.pop("MAR-INF/MANIFEST.json")
    return found


def without_date(manifest: dict) -> dict:
    out = dict(manifest)
    assert re.fullmatch(r"\d\d/\d\d/\d{4} \d\d:\d\d:\d\d", out.pop("createdOn"))
    return out


def private_temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Make tempfile's folder one for this test only, so a leaked temp dir shows (a fixture's body)."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def archiver_inputs(root: Path) -> Path:
    """Files laid out as a user hands them to the archiver, under ``root/src``: a handler, a
    requirements file and extras (a file, a folder with a sub-folder and a cache; a fixture's body)."""
    src = root / "src"
    (src / "extra" / "sub").mkdir(parents=True)
    (src / "extra" / "a.txt").write_text("a")
    (src / "extra" / "sub" / "b.txt").write_text("b")
    (src / "extra" / "__pycache__").mkdir()
    (src / "extra" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    (src / "my_handler.py").write_text(
        "from handlerkit.handlers.image_classifier import ImageClassifier\n\n\nclass H(ImageClassifier):\n    pass\n"
    )
    (src / "requirements.txt").write_text("pillow\n")
    return src
