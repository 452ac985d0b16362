"""handlerkit.archive.read: any archive, whoever built it, listed and checked without writing
anything: sniffing, the manifest, and the bad-archive matrix, each archive crafted in code and
refused (by open_mar, which lists first) with the path, the entry and the rule, nothing written
outside the target, nothing left behind.

Extracting is in tests/archive/test_extract.py, inspecting in tests/archive/test_inspect.py, the rules and
the error in tests/archive/test_rules.py, building in test_archive.py, tests/archive/test_pack.py (what
goes in) and tests/archive/test_write.py (how it is written); the real server round trip in
tests/archive/test_torchserve.py.
"""

from __future__ import annotations

import io
import json
import pickle
import re
import stat
import struct
import tarfile
import zipfile
from pathlib import Path

import pytest
from _archives import DEMO, GOOD_MANIFEST, HANDLER_PY, good_entries, refused, snapshot, with_model, write_zip

from handlerkit import archive
from handlerkit.archive import ArchiveError, Limits, read
from handlerkit.errors import ModelLoadError


# ---------------------------------------------------------------------------------- refused before a byte is written
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


# ---------------------------------------------------------------------------------- sniffing, the manifest
def test_an_archive_is_known_by_its_name_or_its_first_bytes(tmp_path: Path) -> None:
    mar = write_zip(tmp_path / "tiny.mar", good_entries())
    renamed = tmp_path / "tiny.bin"
    renamed.write_bytes(mar.read_bytes())
    (tmp_path / "notes.txt").write_text("just notes")
    tgz = tmp_path / "t.tar.gz"
    with tarfile.open(tgz, "w:gz"):
        pass
    assert (read.sniff(mar), read.sniff(renamed), read.sniff(tgz)) == ("zip", "zip", "tgz")
    assert read.sniff(tmp_path / "notes.txt") is None and read.sniff(tmp_path / "absent.mar") is None
    assert archive.is_archive(renamed) and archive.is_archive(tgz) and not archive.is_archive(tmp_path / "notes.txt")
    assert not archive.is_archive(tmp_path) and not archive.is_archive(tmp_path / "absent.mar")
    stems = [read.stem(Path(name)) for name in ("shapes.tar.gz", "shapes.TGZ", "a.b.mar", "m.zip", "model.bin")]
    assert stems == ["shapes", "shapes", "a.b", "m", "model"]


def test_list_archive_refuses_what_is_no_archive_file_and_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match=r"'.*absent\.mar' does not exist") as info:
        read.list_archive(tmp_path / "absent.mar")
    assert info.value.rule == "not-an-archive" and info.value.fix.startswith("pass a .mar (or .tar.gz) file")
    with pytest.raises(ArchiveError, match="is a directory, not an archive file"):
        read.list_archive(tmp_path)
    mar = write_zip(tmp_path / "tiny.mar", good_entries())
    before = snapshot(tmp_path)
    listing = read.list_archive(mar)
    assert snapshot(tmp_path) == before
    assert listing.format == "zip" and listing.manifest == GOOD_MANIFEST and listing.problems == []
    assert [(e.path, e.kind, e.size) for e in listing.entries if e.kind == "file"] == [
        ("handler.py", "file", len(HANDLER_PY)), ("MAR-INF/MANIFEST.json", "file", len(json.dumps(GOOD_MANIFEST)))]


def test_read_manifest_of_an_archive_and_of_a_model_dir(tmp_path: Path) -> None:
    assert archive.read_manifest(write_zip(tmp_path / "tiny.mar", good_entries())) == GOOD_MANIFEST
    assert archive.read_manifest(DEMO) == json.loads((DEMO / "MAR-INF" / "MANIFEST.json").read_text())
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "handler.py").write_text(HANDLER_PY)
    assert archive.read_manifest(bare)["model"]["handler"] == "handler.py"  # inferred from the files
    with pytest.raises(ArchiveError, match=r"not valid JSON") as info:
        archive.read_manifest(write_zip(tmp_path / "bad.mar", good_entries(), manifest=b"{oops"))
    assert info.value.rule == "manifest-malformed" and info.value.member == "MAR-INF/MANIFEST.json"
