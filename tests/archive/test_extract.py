"""handlerkit.archive.extract: an archive extracted all at once or not at all, and the private temp
dirs of MockContext.from_mar / from_model_dir(.mar), which live as long as the context (and are
swept after a killed process). What is refused before extracting is in tests/archive/test_read.py.
"""

from __future__ import annotations

import copy
import gc
import os
import pickle
import subprocess
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from _archives import DEMO, contents, good_entries, private_temp_dir, refused, snapshot, with_model, write_zip

import handlerkit as hk
from handlerkit import archive
from handlerkit.archive import ArchiveError


@pytest.fixture()
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return private_temp_dir(tmp_path, monkeypatch)


# ---------------------------------------------------------------------------------- all at once or not at all
def test_open_mar_extracts_a_good_archive_all_at_once(tmp_path: Path) -> None:
    mar = archive.build(DEMO, tmp_path / "store")
    target = tmp_path / "unpacked" / "shapes"
    assert archive.open_mar(mar, target) == target
    assert contents(target) == contents(mar)
    assert snapshot(tmp_path / "unpacked") == {"shapes", *{f"shapes/{n}" for n in snapshot(target)}}  # no staging left
    tgz = archive.build(DEMO, tmp_path / "store", archive_format="tgz")
    assert contents(archive.open_mar(tgz, tmp_path / "t")) == contents(mar)  # the top folder is stripped
    with pytest.raises(ArchiveError, match="not an empty folder") as info:
        archive.open_mar(mar, target)
    assert info.value.rule == "exists"
    temp = archive.open_mar(mar)
    try:
        assert temp.name.startswith("handlerkit-image_classifier-") and (temp / "model.pt").is_file()
    finally:
        import shutil

        shutil.rmtree(temp)


def test_disk_space_is_checked_before_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from handlerkit.archive import extract as archive_extract

    mar = archive.build(DEMO, tmp_path / "store")
    monkeypatch.setattr(archive_extract.shutil, "disk_usage", lambda path: SimpleNamespace(free=10))
    refused(mar, "disk-space", tmp_path)


# ---------------------------------------------------------------------------------- contexts
def test_from_mar_keeps_the_files_as_long_as_the_context(tmp_path: Path, private_tmp: Path) -> None:
    mar = archive.build(DEMO, tmp_path / "store")
    ctx = hk.MockContext.from_mar(mar, batch_size=2)
    model_dir = Path(ctx.system_properties["model_dir"])
    assert model_dir.parent == private_tmp and model_dir.name.startswith(f"handlerkit-mar-{os.getpid()}-")
    assert (model_dir / "model.pt").is_file()
    assert ctx.archive.source == mar and ctx.system_properties["batch_size"] == 2
    assert ctx.manifest == archive.read_manifest(mar)
    twin = copy.deepcopy(ctx)
    assert twin.archive is ctx.archive
    borrowed = pickle.loads(pickle.dumps(ctx.archive))  # as a child process would get it: never removes
    assert borrowed.path == model_dir
    borrowed.cleanup()
    del borrowed
    gc.collect()
    assert model_dir.is_dir()
    del ctx
    gc.collect()
    assert model_dir.is_dir()  # the copy still holds it
    del twin
    gc.collect()
    assert not model_dir.exists() and not any(private_tmp.iterdir())
    with hk.MockContext.from_model_dir(mar).archive as extracted:
        assert extracted.alive
    assert not extracted.alive and not any(private_tmp.iterdir())


def test_from_mar_refusals_leak_nothing(tmp_path: Path, private_tmp: Path) -> None:
    slip = write_zip(tmp_path / "slip.mar", good_entries() + [("../evil.py", b"x")])
    with pytest.raises(ArchiveError, match="'..' path component"):
        hk.MockContext.from_mar(slip)
    bad_config = tmp_path / "cfg.mar"
    manifest = with_model(configFile="model-config.yaml")
    write_zip(bad_config, good_entries() + [("model-config.yaml", b"batchSize: [")], manifest)
    with pytest.raises(hk.HandlerkitError):
        hk.MockContext.from_model_dir(bad_config)  # fails after extracting: the dir goes too
    good = archive.build(DEMO, tmp_path / "store")
    with zipfile.ZipFile(good) as zf:
        info = zf.getinfo("model.pt")
        start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    data = bytearray(good.read_bytes())
    data[start + 1000] ^= 0xFF  # found only while extracting: the half-extracted temp dir goes
    good.write_bytes(bytes(data))
    with pytest.raises(ArchiveError, match="damaged") as info:
        hk.MockContext.from_mar(good)
    assert info.value.rule == "corrupt"
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ArchiveError, match="not a directory, nor a model archive") as info:
        hk.MockContext.from_mar(tmp_path / "notes.txt")
    assert info.value.rule == "not-an-archive"
    gc.collect()
    assert not any(private_tmp.iterdir())


def test_a_function_handler_runs_from_a_mar(tmp_path: Path, private_tmp: Path) -> None:
    mar = write_zip(tmp_path / "tiny.mar", good_entries())
    ctx = hk.MockContext.from_mar(mar)
    run = hk.Harness(ctx.manifest["model"]["handler"], ctx).run(hk.batch(hk.Request.json({"a": 1})))
    assert run.output == [["body"]] and ctx.model_name == "tiny"


def test_dirs_of_killed_processes_are_swept_by_the_next_open(tmp_path: Path, private_tmp: Path) -> None:
    """A kernel killed with SIGKILL never runs its finalizers; the next from_mar removes its dirs."""
    gone = subprocess.Popen([os.sys.executable, "-c", "pass"])
    gone.wait()
    orphan = private_tmp / f"handlerkit-mar-{gone.pid}-abc"
    (orphan / "MAR-INF").mkdir(parents=True)
    partial = private_tmp / f".handlerkit-mar-{gone.pid}-def.partial-1234"
    partial.mkdir()
    alive = private_tmp / f"handlerkit-mar-{os.getppid()}-ghi"  # pytest's parent: alive
    alive.mkdir()
    unrelated = private_tmp / "handlerkit-nb-xyz"
    unrelated.mkdir()
    ctx = hk.MockContext.from_mar(archive.build(DEMO, tmp_path / "store"))
    assert not orphan.exists() and not partial.exists() and alive.is_dir() and unrelated.is_dir()
    ctx.archive.cleanup()
