"""handlerkit.archive's reading and opening (read.py, extract.py, inspect.py): any archive, whoever
built it, opened safely.

- open: the bad-archive matrix, each crafted in code: refused with the path, the entry and the
  rule, nothing written outside the target, nothing left behind;
- read_manifest and inspect_archive read without extracting;
- MockContext.from_mar / from_model_dir(.mar): the temp dir lives as long as the context.

Building is in test_archive_pack.py (what goes in) and test_archive_write.py (how it is
written); the real server round trip in test_archive_torchserve.py.
"""

from __future__ import annotations

import copy
import gc
import io
import json
import os
import pickle
import re
import stat
import struct
import subprocess
import tarfile
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from _archives import (
    DEMO,
    GOOD_MANIFEST,
    HANDLER_PY,
    contents,
    good_entries,
    private_temp_dir,
    refused,
    snapshot,
    with_model,
    write_zip,
)

import handlerkit as hk
from handlerkit import archive
from handlerkit.archive import ArchiveError, Limits
from handlerkit.errors import ModelLoadError


@pytest.fixture()
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return private_temp_dir(tmp_path, monkeypatch)


# ---------------------------------------------------------------------------------- open
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


def _symlink_info(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.create_system = 3
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return info


def _overlapping(path: Path) -> Path:
    """A second central-directory record pointing at the first entry's data (a 'better zip bomb')."""
    write_zip(path, [("aaaa.bin", b"\0" * 1000)])
    data = path.read_bytes()
    eocd = data.rindex(b"PK\x05\x06")
    count, cd_size, cd_offset = struct.unpack("<HLL", data[eocd + 10: eocd + 20])
    first = data[cd_offset: cd_offset + 46 + struct.unpack("<H", data[cd_offset + 28: cd_offset + 30])[0]]
    extra_len, comment_len = struct.unpack("<HH", data[cd_offset + 30: cd_offset + 34])
    assert extra_len == comment_len == 0
    clone = first.replace(b"aaaa.bin", b"bbbb.bin")
    central = data[cd_offset:eocd] + clone
    end = data[eocd:eocd + 8] + struct.pack("<HHLL", count + 1, count + 1, cd_size + len(clone), cd_offset) + data[eocd + 20:]
    path.write_bytes(data[:cd_offset] + central + end)
    return path


BAD_ZIPS = {
    "zip-slip": ([("../evil.py", b"x")], "../evil.py"),
    "zip-slip-deep": ([("a/../../evil.py", b"x")], "a/../../evil.py"),
    "absolute-path": ([("/tmp/hk-evil.py", b"x")], "/tmp/hk-evil.py"),
    "windows-absolute": ([("C:/evil.py", b"x")], "C:/evil.py"),
    "backslash": ([("..\\evil.py", b"x")], "..\\evil.py"),
    "symlink": ([(_symlink_info("link.py"), b"/etc/passwd")], "link.py"),
    "duplicate": ([("handler.py", b"1")], "handler.py"),
    "case-duplicate": ([("Handler.py", b"1")], "Handler.py"),
    "file-and-folder": ([("handler.py/x", b"1")], "handler.py"),
}
RULE = {"zip-slip-deep": "zip-slip", "windows-absolute": "absolute-path", "backslash": "zip-slip",
        "case-duplicate": "duplicate", "file-and-folder": "duplicate"}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_ZIPS))
def test_bad_entries_are_refused_before_a_byte_is_written(tmp_path: Path, case: str) -> None:
    extra, member = BAD_ZIPS[case]
    mar = write_zip(tmp_path / f"{case}.mar", good_entries() + extra)
    refused(mar, RULE.get(case, case), tmp_path, member=member)
    assert not (tmp_path / "evil.py").exists() and not Path("/tmp/hk-evil.py").exists()
    info = archive.inspect_archive(mar)  # inspect lists, never raises, for these
    assert not info.ok and RULE.get(case, case) in {p.rule for p in info.problems}


def test_zip_bombs_are_refused_and_the_limits_can_be_raised(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.mar"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("handler.py", HANDLER_PY)
        with zf.open("zeros.bin", "w") as f:
            for _ in range(8):
                f.write(bytes(1 << 20))
        zf.writestr("MAR-INF/MANIFEST.json", json.dumps(GOOD_MANIFEST))
    err = refused(bomb, "zip-bomb", tmp_path, member="zeros.bin")
    assert re.search(r"8\.0 MiB \(\d+x, over 200x\)", str(err))
    assert "Limits" in err.fix
    refused(bomb, "zip-bomb", tmp_path, limits=Limits(max_total_size=1 << 20))
    refused(bomb, "zip-bomb", tmp_path, limits=Limits(max_entries=2))
    model_dir = archive.open_mar(bomb, tmp_path / "trusted", limits=Limits(max_ratio=5000))
    assert (model_dir / "zeros.bin").stat().st_size == 8 << 20
    overlap = _overlapping(tmp_path / "overlap.mar")
    refused(overlap, "zip-bomb", tmp_path, member="bbbb.bin")


def test_manifest_problems_are_refused(tmp_path: Path) -> None:
    cases = {
        "manifest-missing": write_zip(tmp_path / "none.mar", good_entries(), manifest=None),
        "manifest-malformed": write_zip(tmp_path / "notjson.mar", good_entries(), manifest=b"{not json"),
        "manifest-file-missing": write_zip(tmp_path / "gone.mar", good_entries(), with_model(serializedFile="model.pt")),
    }
    for rule, mar in cases.items():
        refused(mar, rule, tmp_path)
    no_version = {**GOOD_MANIFEST, "model": {"modelName": "tiny", "handler": "handler.py"}}
    err = refused(write_zip(tmp_path / "nover.mar", good_entries(), no_version), "manifest-malformed", tmp_path)
    assert "model.modelVersion" in str(err)
    err = refused(write_zip(tmp_path / "list.mar", good_entries(), manifest=b"[1]"), "manifest-malformed", tmp_path)
    gone_handler = with_model(handler="other.py:handle")
    refused(write_zip(tmp_path / "h.mar", good_entries(), gone_handler), "manifest-file-missing", tmp_path, member="other.py")
    with pytest.raises(ArchiveError) as info:
        archive.read_manifest(cases["manifest-missing"])
    assert info.value.rule == "manifest-missing"


def test_truncated_corrupt_and_foreign_files_are_refused(tmp_path: Path) -> None:
    good = archive.build(DEMO, tmp_path / "store")
    data = good.read_bytes()
    (tmp_path / "half.mar").write_bytes(data[: len(data) // 2])
    refused(tmp_path / "half.mar", "truncated", tmp_path)
    (tmp_path / "text.mar").write_text("not a zip")
    refused(tmp_path / "text.mar", "not-an-archive", tmp_path)
    # A flipped byte in the weights: the directory is fine, the CRC is not. Found while
    # extracting: the partial extraction is removed.
    with zipfile.ZipFile(good) as zf:
        info = zf.getinfo("model.pt")
        start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    flipped = bytearray(data)
    flipped[start + 1000] ^= 0xFF
    (tmp_path / "crc.mar").write_bytes(bytes(flipped))
    refused(tmp_path / "crc.mar", "corrupt", tmp_path)
    lzma = tmp_path / "lzma.mar"
    with zipfile.ZipFile(lzma, "w", zipfile.ZIP_LZMA) as zf:
        zf.writestr("handler.py", HANDLER_PY)
        zf.writestr("MAR-INF/MANIFEST.json", json.dumps(GOOD_MANIFEST))
    refused(lzma, "compression", tmp_path, member="handler.py")


def test_bad_tar_gz_archives_are_refused(tmp_path: Path) -> None:
    def tgz(name: str, members: list[tarfile.TarInfo]) -> Path:
        path = tmp_path / name
        with tarfile.open(path, "w:gz") as tf:
            for member in members:
                data = b"x" * member.size
                tf.addfile(member, io.BytesIO(data) if member.isfile() else None)
        return path

    def regular(name: str, size: int = 1) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.size = size
        return info

    manifest = json.dumps(GOOD_MANIFEST).encode()
    link = tarfile.TarInfo("m/handler.py")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    refused(tgz("link.tar.gz", [link]), "symlink", tmp_path, member="m/handler.py")
    refused(tgz("slip.tar.gz", [regular("m/../../evil.py")]), "zip-slip", tmp_path)
    fifo = tarfile.TarInfo("m/fifo")
    fifo.type = tarfile.FIFOTYPE
    refused(tgz("fifo.tar.gz", [fifo]), "special-file", tmp_path)
    big = regular("m/zeros.bin", 64 << 20)  # 64 MiB of "x": a tar.gz of ~70 KiB
    refused(tgz("bomb.tar.gz", [big]), "zip-bomb", tmp_path)
    good = tmp_path / "good.tar.gz"
    with tarfile.open(good, "w:gz") as tf:
        for name, data in (("m/handler.py", HANDLER_PY.encode()), ("m/MAR-INF/MANIFEST.json", manifest)):
            info = regular(name, len(data))
            tf.addfile(info, io.BytesIO(data))
    assert archive.read_manifest(good) == GOOD_MANIFEST
    (tmp_path / "cut.tar.gz").write_bytes(good.read_bytes()[:-30])
    refused(tmp_path / "cut.tar.gz", "truncated", tmp_path)


def test_all_problems_are_reported_together_and_inspect_renders_them(tmp_path: Path) -> None:
    mar = write_zip(tmp_path / "many.mar", good_entries() + [("../a.py", b""), (_symlink_info("l"), b"/")], manifest=None)
    err = refused(mar, "zip-slip", tmp_path)
    assert {p.rule for p in err.problems} == {"zip-slip", "symlink", "manifest-missing"}
    assert err.message.startswith("many.mar refused [zip-slip]: '../a.py'") and "and 2 more problems" in err.message
    assert isinstance(err, ModelLoadError) and pickle.loads(pickle.dumps(err)).problems[1].rule == "symlink"
    info = archive.inspect_archive(mar)
    text, bundle = str(info), info._repr_mimebundle_()
    assert "3 problems" in repr(info) and "zip-slip" in text and "<table" in bundle["text/html"]
    assert json.loads(json.dumps(info.to_dict()))["problems"][0]["rule"] == "zip-slip"


def test_disk_space_is_checked_before_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from handlerkit.archive import extract as archive_extract

    mar = archive.build(DEMO, tmp_path / "store")
    monkeypatch.setattr(archive_extract.shutil, "disk_usage", lambda path: SimpleNamespace(free=10))
    refused(mar, "disk-space", tmp_path)


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
