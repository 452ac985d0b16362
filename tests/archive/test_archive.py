"""handlerkit.archive, the package's front: ``build`` (options checked, then plan, then write) end to
end, every refusal it documents, and the names the package offers. Each step has its own test
module: tests/archive/test_pack.py (what goes in), tests/archive/test_write.py (how it is written),
tests/archive/test_read.py, tests/archive/test_extract.py and tests/archive/test_inspect.py (opening).
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from _archives import CIRCLE, DEMO, HANDLER_PY, archiver_inputs, contents, with_model, without_date

import handlerkit as hk
from handlerkit import archive
from handlerkit.archive import ArchiveError


@pytest.fixture()
def inputs(tmp_path: Path) -> Path:
    return archiver_inputs(tmp_path)


def test_the_package_offers_its_names_where_users_type_them() -> None:
    assert sorted(archive.__all__) == sorted([
        "NEVER_SWEPT", "RULES", "ArchiveError", "ArchiveInfo", "ExtractedArchive", "FileInfo", "LeftOut", "Limits",
        "PackedFile", "Plan", "add_compile_cache", "build", "context_from_mar", "inspect_archive", "is_archive", "open_mar",
        "open_temporary", "plan", "read_manifest",
    ])  # fmt: skip
    for name in archive.__all__:
        assert getattr(archive, name) is not None, name


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


def test_build_is_the_plan_written(tmp_path: Path) -> None:
    built = archive.build(DEMO, tmp_path / "built", version="2.5", archive_format="tgz")
    written = archive.plan(DEMO, tmp_path / "planned", version="2.5").write("tgz")
    assert (built.name, written.name) == ("image_classifier.tar.gz",) * 2
    assert contents(built) == contents(written)
    assert without_date(archive.read_manifest(built)) == without_date(archive.read_manifest(written))
    assert archive.read_manifest(built)["model"]["modelVersion"] == "2.5"


def test_bad_options_are_refused_before_anything_is_read(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    with pytest.raises(ValueError, match=r"archive_format must be one of \['default', 'no-archive', 'tgz', 'zip-store'\]: got 'zip'"):
        archive.build(missing, tmp_path / "o", archive_format="zip")
    with pytest.raises(ValueError, match=r"compression must be 'auto', 'deflate' or 'store': got 'lzma'"):
        archive.build(missing, tmp_path / "o", compression="lzma")
    assert not (tmp_path / "o").exists()
