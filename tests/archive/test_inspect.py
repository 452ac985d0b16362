"""handlerkit.archive.inspect: what a .mar, a .tar.gz or a model dir holds (files, sizes, manifest,
problems), read without extracting, rendered as tables and as plain data for ``--json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _archives import DEMO, HANDLER_PY, snapshot

from handlerkit import archive
from handlerkit.archive import ArchiveError


def test_read_manifest_and_inspect_do_not_extract(tmp_path: Path) -> None:
    mar = archive.build(DEMO, tmp_path)
    before = snapshot(tmp_path)
    assert archive.read_manifest(mar)["model"]["modelName"] == "image_classifier"
    info = archive.inspect_archive(mar)
    assert snapshot(tmp_path) == before
    assert info.ok and info.format == "zip" and info.manifest == archive.read_manifest(mar)
    sizes = {f.name: (f.size, f.compressed_size, f.compression) for f in info.files}
    assert sizes["model.pt"] == ((DEMO / "model.pt").stat().st_size,) * 2 + ("stored",)
    assert "image_classifier.mar: .mar (zip)" in repr(info)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "handler.py").write_text(HANDLER_PY)
    dir_info = archive.inspect_archive(bare)
    assert dir_info.format == "dir" and dir_info.inferred and dir_info.manifest["model"]["handler"] == "handler.py"
    assert archive.read_manifest(bare) == dir_info.manifest
    assert archive.inspect_archive(DEMO).manifest == json.loads((DEMO / "MAR-INF" / "MANIFEST.json").read_text())


def test_a_tar_gz_lists_its_files_without_per_file_compressed_sizes(tmp_path: Path) -> None:
    tgz = archive.build(DEMO, tmp_path, archive_format="tgz")
    info = archive.inspect_archive(tgz)
    assert info.ok and info.format == "tgz" and info.archive_size == tgz.stat().st_size
    assert {(f.compressed_size, f.compression) for f in info.files} == {(None, "gzip")}
    assert {f.name: f.size for f in info.files}["model.pt"] == (DEMO / "model.pt").stat().st_size
    assert info.total_size == sum(f.size for f in info.files)
    assert repr(info).startswith("<ArchiveInfo image_classifier.tar.gz: tar.gz, ")
    assert "model 'image_classifier' handler 'image_classifier'" in repr(info)
    data = json.loads(json.dumps(info.to_dict()))
    assert data["format"] == "tgz" and data["problems"] == [] and data["manifest"] == archive.read_manifest(tgz)
    assert {f["name"] for f in data["files"]} == {f.name for f in info.files}


def test_a_model_dir_without_a_manifest_says_it_was_inferred(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    (bare / "__pycache__").mkdir(parents=True)
    (bare / "__pycache__" / "handler.cpython-311.pyc").write_bytes(b"\0")
    (bare / "handler.py").write_text(HANDLER_PY)
    info = archive.inspect_archive(bare)
    assert [f.name for f in info.files] == ["handler.py"]  # caches are not the model's files
    assert info.inferred["handler"] == "handler.py is in the dir"
    text = str(info)
    assert "manifest (inferred)" in text
    assert text.endswith("note: no MAR-INF/MANIFEST.json: the manifest is inferred from the files (see .inferred)")


def test_what_is_no_archive_is_an_error_not_a_listing(tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match=r"nope\.mar' does not exist") as info:
        archive.inspect_archive(tmp_path / "nope.mar")
    assert info.value.rule == "not-an-archive"
    (tmp_path / "notes.txt").write_text("notes")
    with pytest.raises(ArchiveError, match="notes.txt is not a model archive"):
        archive.inspect_archive(tmp_path / "notes.txt")
