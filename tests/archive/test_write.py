"""handlerkit.archive.write: archives written as torch-model-archiver 0.12 writes them, only faster,
and read by TorchServe's own code.

- the manifest (key for key, minus createdOn) and the file layout equal the real archiver's on
  the same inputs, in the default, tgz and no-archive forms; an archive the archiver wrote
  opens with its manifest; an interrupted build leaves nothing behind;
- compression: weights are stored, text deflated, in a .mar's entries and in a .tar.gz, which
  is one gzip member whose level changes from file to file; TorchServe 0.12's frontend
  (ZipUtils.decompressTarGzipFile, run in Java) extracts it, and would not extract a .tar.gz of
  several gzip members.

What goes in is tested in tests/archive/test_pack.py, the manifest's keys in tests/archive/test_manifest.py,
``archive.build`` end to end in test_archive.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import zipfile
import zlib
from pathlib import Path

import pytest
from _archives import (
    ARCHIVER,
    CIRCLE,
    DEMO,
    HANDLER_PY,
    archiver_inputs,
    contents,
    needs_archiver,
    private_temp_dir,
    run_archiver,
    snapshot,
    without_date,
)

import handlerkit as hk
from handlerkit import archive

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def inputs(tmp_path: Path) -> Path:
    return archiver_inputs(tmp_path)


@pytest.fixture()
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return private_temp_dir(tmp_path, monkeypatch)


# ---------------------------------------------------------------------------------- as the archiver
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


@pytest.mark.parametrize("fmt", ["default", "tgz"])
def test_the_benchmark_builds_with_both_tools_and_checks_the_result(tmp_path: Path, fmt: str) -> None:
    """benchmarks/archive_vs_model_archiver.py on 2 MB + 1 MB of text (its timings are judged by running it)."""
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import archive_vs_model_archiver as bench
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    if not ARCHIVER.is_file():
        pytest.skip("torch-model-archiver 0.12 (test dependency) not installed")
    result = bench.measure(2, 1, fmt, tmp_path / fmt, bench.make_inputs(tmp_path / "inputs", 2, vocab_mb=1))
    assert {name: len(t) for name, t in result["times"].items()} == {"torch-model-archiver": 1, "handlerkit": 1}
    assert result["sizes"]["handlerkit"] < result["input_bytes"]  # the text is deflated, in either format
    assert bench.check(result) == []
    result["expected"] += 1.0
    assert "weights sum" in bench.check(result)[0]  # the check can fail


# ---------------------------------------------------------------------------------- tar.gz
def gzip_members(path: Path) -> int:
    """How many gzip members a file holds (each must end properly)."""
    data, members = path.read_bytes(), 0
    while data:
        stream = zlib.decompressobj(zlib.MAX_WBITS | 16)
        stream.decompress(data)
        assert stream.eof, f"gzip member {members + 1} of {path.name} is truncated"
        data, members = stream.unused_data, members + 1
    return members


@pytest.fixture()
def text_and_weights(tmp_path: Path) -> Path:
    """A model dir of 2 MiB of weights (zeros: deflate would shrink them 1000x) and 1.6 MB of text."""
    src = tmp_path / "m"
    src.mkdir()
    (src / "handler.py").write_text(HANDLER_PY)
    (src / "model.pt").write_bytes(bytes(2 << 20))
    (src / "vocab.txt").write_text("".join(f"word{i % 1000}\n" for i in range(200_000)))
    return src


def test_a_tgz_deflates_text_and_stores_weights_in_one_gzip_member(text_and_weights: Path, tmp_path: Path) -> None:
    src = text_and_weights
    weights, text = (src / "model.pt").stat().st_size, (src / "vocab.txt").stat().st_size
    built = {mode: archive.build(src, tmp_path / mode, extra_files="vocab.txt", archive_format="tgz", compression=mode)
             for mode in ("auto", "store", "deflate")}  # fmt: skip
    size = {mode: path.stat().st_size for mode, path in built.items()}
    assert weights < size["auto"] < weights + text // 4, size  # the weights stored, the text deflated
    assert size["store"] > weights + text  # nothing deflated
    assert size["deflate"] < text // 4  # everything deflated: the zeros too
    expected = {name: (src / name).read_bytes() for name in ("handler.py", "model.pt", "vocab.txt")}
    for mode, path in built.items():
        assert gzip_members(path) == 1, mode
        assert contents(path) == expected, mode  # Python's tarfile reads it
    out = tmp_path / "gnu"
    out.mkdir()
    subprocess.run(["tar", "-xzf", str(built["auto"]), "-C", str(out)], check=True, capture_output=True, timeout=60)
    assert contents(out / "m") == expected  # and GNU tar


def _ts_jar() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("ts")
    if spec is None or not spec.submodule_search_locations:
        return None
    jar = Path(next(iter(spec.submodule_search_locations))) / "frontend" / "model-server.jar"
    return jar if jar.is_file() else None


#: TorchServe 0.12's frontend extracting a .tar.gz model archive, as it does when it loads one.
EXTRACT_JAVA = """\
import java.io.*;
import org.pytorch.serve.archive.utils.ZipUtils;

public class Extract {
    public static void main(String[] args) throws Exception {
        try (InputStream in = new FileInputStream(args[0])) {
            ZipUtils.decompressTarGzipFile(in, new File(args[1]));
        }
    }
}
"""


@pytest.mark.torchserve
def test_torchserve_extracts_the_tgz_handlerkit_writes(text_and_weights: Path, tmp_path: Path) -> None:
    """TorchServe's own code (Java, from its jar), not a server: one gzip member reads whole; two do not."""
    java, jar = shutil.which("java"), _ts_jar()
    if java is None or jar is None:
        pytest.skip("needs java and torchserve 0.12's model-server.jar (test dependencies)")
    (tmp_path / "Extract.java").write_text(EXTRACT_JAVA)

    def extract(tgz: Path, out: Path) -> subprocess.CompletedProcess:
        return subprocess.run([java, "-cp", str(jar), str(tmp_path / "Extract.java"), str(tgz), str(out)],
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    tgz = archive.build(text_and_weights, tmp_path / "store", extra_files="vocab.txt", archive_format="tgz")
    done = extract(tgz, tmp_path / "ts")
    assert done.returncode == 0, done.stderr
    assert contents(tmp_path / "ts") == contents(tgz)
    assert json.loads((tmp_path / "ts" / "MAR-INF" / "MANIFEST.json").read_text()) == archive.read_manifest(tgz)
    # The same tar in two gzip members (valid gzip: Python, GNU tar and our own open_mar read it)
    # is cut short by TorchServe's reader: why handlerkit changes levels inside one member.
    tar = zlib.decompress(tgz.read_bytes(), zlib.MAX_WBITS | 16)
    half = len(tar) // 2
    two = tmp_path / "two.tar.gz"
    two.write_bytes(zlib.compress(tar[:half], wbits=zlib.MAX_WBITS | 16) + zlib.compress(tar[half:], wbits=zlib.MAX_WBITS | 16))
    assert gzip_members(two) == 2 and contents(archive.open_mar(two, tmp_path / "python")) == contents(tgz)
    done = extract(two, tmp_path / "ts-two")
    assert done.returncode != 0 and "Truncated TAR archive" in done.stderr, done
