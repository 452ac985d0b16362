"""handlerkit.archive: .mar archives built as torch-model-archiver 0.12 builds them, opened safely.

- build: the manifest (key for key, minus createdOn) and the file layout equal the real
  archiver's on the same inputs, in the default, tgz and no-archive forms; weights are stored;
  the archive built from the demo model dir predicts what the dir predicts;
- open: the bad-archive matrix, each crafted in code: refused with the path, the entry and the
  rule, nothing written outside the target, nothing left behind;
- MockContext.from_mar / from_model_dir(.mar): the temp dir lives as long as the context.

The real server round trip is in test_archive_torchserve.py.
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
import tempfile
import warnings
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

import handlerkit as hk
from handlerkit import archive
from handlerkit.archive import ArchiveError, Limits
from handlerkit.errors import ModelLoadError

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


# ---------------------------------------------------------------------------------- helpers
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


@pytest.fixture()
def inputs(tmp_path: Path) -> Path:
    """Files laid out as a user hands them to the archiver: a handler, extras (a file, a folder)."""
    src = tmp_path / "src"
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


@pytest.fixture()
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tempfile's folder for this test only, so a leaked temp dir shows."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


# ---------------------------------------------------------------------------------- build
@needs_archiver
@pytest.mark.parametrize("fmt", ["default", "tgz", "no-archive"])
def test_build_writes_what_torch_model_archiver_writes(inputs: Path, tmp_path: Path, fmt: str) -> None:
    args = dict(model_file=str(DEMO / "model.py"), serialized_file=str(DEMO / "model.pt"),
                requirements_file=str(inputs / "requirements.txt"), config_file=str(DEMO / "model-config.yaml"))  # fmt: skip
    extra = [str(DEMO / "index_to_name.json"), str(inputs / "extra")]
    ref = run_archiver(tmp_path, fmt, "--model-name", "shapes", "--version", "2.0", "--handler", f"{inputs}/my_handler:handle",
                       "--extra-files", ",".join(extra), *[f"--{k.replace('_', '-')}={v}" for k, v in args.items()])  # fmt: skip
    ours = archive.build(None, tmp_path / "ours", model_name="shapes", version="2.0", handler=f"{inputs}/my_handler:handle",
                         extra_files=extra, archive_format=fmt, **args)  # fmt: skip
    assert ours.name == ref.name == {"default": "shapes.mar", "tgz": "shapes.tar.gz", "no-archive": "shapes"}[fmt]
    theirs, mine = archive.read_manifest(ref), archive.read_manifest(ours)
    assert without_date(mine) == without_date(theirs)
    assert list(mine) == list(theirs) and list(mine["model"]) == list(theirs["model"])  # the same key order
    assert mine["model"]["handler"] == "my_handler:handle" and mine["model"]["requirementsFile"] == "requirements.txt"
    # Same files at the same places (extras flattened, a folder's contents kept with sub-folders), same bytes.
    assert contents(ours) == contents(ref)
    assert "sub/b.txt" in contents(ours) and "x.pyc" not in str(sorted(contents(ours)))
    if fmt == "tgz":  # every file under <model name>/, as the archiver lays it out
        with tarfile.open(ours) as tf, tarfile.open(ref) as rf:
            tops = ({m.name.split("/")[0] for m in archive_.getmembers()} for archive_ in (tf, rf))
            assert next(tops) == {"shapes"} == next(tops)


@needs_archiver
@pytest.mark.parametrize(
    "spec, archived", [("image_classifier", None), ("my_handler", "my_handler.py"), ("my_handler.py", "my_handler.py")]
)
def test_handler_specs_are_archived_as_the_archiver_does(inputs: Path, tmp_path: Path, spec: str, archived: str | None) -> None:
    """A built-in name is no file; a path is archived under its base name and named by it."""
    handler = spec if spec == "image_classifier" else f"{inputs}/{spec}"
    ref = run_archiver(tmp_path, "default", "--model-name", "m", "--version", "1.0", "--handler", handler)
    ours = archive.build(None, tmp_path / "ours", model_name="m", handler=handler)
    assert without_date(archive.read_manifest(ours)) == without_date(archive.read_manifest(ref))
    assert archive.read_manifest(ours)["model"]["handler"] == spec
    assert set(contents(ours)) == set(contents(ref)) == ({archived} if archived else set())


@needs_archiver
@pytest.mark.parametrize("fmt", ["default", "tgz"])
def test_an_archive_from_torch_model_archiver_opens_with_its_manifest(
    inputs: Path, tmp_path: Path, private_tmp: Path, fmt: str
) -> None:
    ref = run_archiver(tmp_path, fmt, "--model-name", "shapes", "--version", "1.0", "--handler", f"{inputs}/my_handler.py",
                       "--model-file", str(DEMO / "model.py"), "--serialized-file", str(DEMO / "model.pt"),
                       "--extra-files", str(DEMO / "index_to_name.json"),
                       "--config-file", str(DEMO / "model-config.yaml"))  # fmt: skip
    if fmt == "tgz":
        with tarfile.open(ref) as tf:
            written = json.loads(tf.extractfile("shapes/MAR-INF/MANIFEST.json").read())
    else:
        with zipfile.ZipFile(ref) as zf:
            written = json.loads(zf.read("MAR-INF/MANIFEST.json"))
    ctx = hk.MockContext.from_mar(ref)
    assert ctx.manifest == written == archive.read_manifest(ref) and ctx.model_yaml_config["batchSize"] == 4
    assert archive.inspect_archive(ref).ok
    batch = hk.batch(hk.Request.from_file(CIRCLE))
    got = hk.Harness(ctx.manifest["model"]["handler"], ctx).run(batch).output
    assert got == hk.Harness("image_classifier", hk.MockContext.from_model_dir(DEMO)).run(batch).output


def test_build_from_the_demo_model_dir_predicts_what_the_dir_predicts(tmp_path: Path) -> None:
    mar = archive.build(DEMO, tmp_path)
    assert mar == tmp_path / "image_classifier.mar"
    manifest = archive.read_manifest(mar)
    assert without_date(manifest) == without_date(json.loads((DEMO / "MAR-INF" / "MANIFEST.json").read_text()))
    with zipfile.ZipFile(mar) as zf:
        infos = {i.filename: i for i in zf.infolist()}
        assert list(infos)[-1] == "MAR-INF/MANIFEST.json"  # written last, as the archiver does
        assert infos["model.pt"].compress_type == zipfile.ZIP_STORED  # weights are not deflated
        assert infos["model.py"].compress_type == zipfile.ZIP_DEFLATED
    expected = {p.relative_to(DEMO).as_posix() for p in DEMO.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert set(infos) == expected

    batch = hk.batch(hk.Request.from_file(CIRCLE))
    ref_ctx = hk.MockContext.from_model_dir(DEMO)
    reference = hk.Harness(ref_ctx.manifest["model"]["handler"], ref_ctx).run(batch).output
    ctx = hk.MockContext.from_model_dir(mar)  # a .mar wherever a model dir works
    got = hk.Harness(ctx.manifest["model"]["handler"], ctx).run(batch).output
    assert got == reference and max(got[0], key=got[0].get) == "circle"


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
    assert set(contents(out)) == {"handler.py", "weights.pt", "other.pt"}
    again = archive.build(src, src, archive_format="tgz", force=True)  # the first tar.gz is not inside
    assert set(contents(again)) == {"handler.py", "weights.pt"}
    assert archive.read_manifest(again)["model"]["serializedFile"] == "weights.pt"  # inferred: the one weights file
    (src / "weights.onnx").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="several weights files"):
        archive.build(src, tmp_path / "o")
    two = archive.build(src, tmp_path / "o", serialized_file="weights.onnx")  # names the one: fine
    assert archive.read_manifest(two)["model"] == {"modelName": "m", "serializedFile": "weights.onnx", "handler": "handler.py",
                                                   "modelVersion": "1.0"}  # fmt: skip


def test_build_refusals_name_the_rule_and_the_fix(tmp_path: Path, inputs: Path) -> None:
    handler = str(inputs / "my_handler.py")
    archive.build(None, tmp_path / "o", model_name="m", handler=handler)
    cases = [
        (dict(model_name="m", handler=handler), "exists"),
        (dict(model_name="m", handler=str(tmp_path / "nope.py"), force=True), "missing-file"),
        (dict(model_name="m"), "no-handler"),
        (dict(model_name="bad name!", handler=handler), "model-name"),
        (dict(model_name="m", handler=handler, extra_files=[str(inputs / "extra" / "a.txt"), str(inputs / "extra" / "sub")],
              model_file=str(inputs / "extra" / "a.txt"), force=True), None),  # the same file twice: fine
        (dict(model_name="m", handler=handler, extra_files=["missing.json"], force=True), "missing-file"),
    ]  # fmt: skip
    for kwargs, rule in cases:
        if rule is None:
            archive.build(None, tmp_path / "o", **kwargs)
            continue
        with pytest.raises(ArchiveError) as info:
            archive.build(None, tmp_path / "o", **kwargs)
        assert info.value.rule == rule and info.value.fix, (kwargs, info.value)
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "a.txt").write_text("other")
    with pytest.raises(ArchiveError, match="two files would be archived as 'a.txt'") as info:
        archive.build(None, tmp_path / "o", model_name="m", handler=handler, force=True,
                      extra_files=[str(inputs / "extra" / "a.txt"), str(tmp_path / "x" / "a.txt")])  # fmt: skip
    assert info.value.rule == "name-collision"
    src = tmp_path / "src2"
    src.mkdir()
    (src / "MAR-INF").mkdir()
    (src / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(with_model(serializedFile="gone.pt")))
    (src / "handler.py").write_text(HANDLER_PY)
    with pytest.raises(ArchiveError, match="serializedFile 'gone.pt'") as info:
        archive.build(src, tmp_path / "o2")
    assert info.value.rule == "manifest-file-missing"
    with pytest.raises(ValueError, match="archive_format"):
        archive.build(src, tmp_path, archive_format="zip")


@pytest.mark.parametrize("fmt", ["default", "tgz", "no-archive"])
def test_an_interrupted_build_leaves_nothing_and_keeps_the_old_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    from handlerkit.archive import write as archive_write

    out = tmp_path / "store"
    first = archive.build(DEMO, out, archive_format=fmt)
    before = snapshot(out)
    old = contents(first)

    def fail(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(archive_write._Counted, "read", fail)
    monkeypatch.setattr(archive_write.shutil, "copyfile", fail)
    with pytest.raises(KeyboardInterrupt):
        archive.build(DEMO, out, archive_format=fmt, force=True)
    assert snapshot(out) == before and contents(first) == old


def test_compression_stores_weights_and_incompressible_files(tmp_path: Path) -> None:
    from handlerkit.archive.write import compression_for

    (tmp_path / "w.onnx").write_bytes(b"\0" * 100)
    (tmp_path / "noise.dat").write_bytes(os.urandom(2 << 20))
    (tmp_path / "vocab.txt").write_text("word\n" * 400_000)
    got = {p.name: compression_for(p, p.stat().st_size) for p in tmp_path.iterdir()}
    assert got == {"w.onnx": zipfile.ZIP_STORED, "noise.dat": zipfile.ZIP_STORED, "vocab.txt": zipfile.ZIP_DEFLATED}
    assert compression_for(tmp_path / "w.onnx", 100, "deflate") == zipfile.ZIP_DEFLATED
    mar = archive.build(DEMO, tmp_path / "z", archive_format="zip-store")
    with zipfile.ZipFile(mar) as zf:
        assert {i.compress_type for i in zf.infolist() if i.filename != "MAR-INF/MANIFEST.json"} == {zipfile.ZIP_STORED}


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


def test_the_benchmark_builds_with_both_tools_and_checks_the_result(tmp_path: Path) -> None:
    """benchmarks/archive_vs_model_archiver.py on 2 MB (its timings are judged by running it)."""
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import archive_vs_model_archiver as bench
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    if not ARCHIVER.is_file():
        pytest.skip("torch-model-archiver 0.12 (test dependency) not installed")
    result = bench.measure(2, 1, "default", tmp_path)
    assert {name: len(t) for name, t in result["times"].items()} == {"torch-model-archiver": 1, "handlerkit": 1}
    assert bench.check(result) == []
    result["expected"] += 1.0
    assert "weights sum" in bench.check(result)[0]  # the check can fail


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
