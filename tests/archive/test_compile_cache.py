"""``archive.build(..., compile_cache=batch)`` and ``handlerkit archive --compile-cache``: the handler's
model compiled in a fresh process, its cache and C++ kernels shipped, and hit by a fresh process with an empty
cache dir that builds no kernel.

Every test here starts Python processes (and the end-to-end one compiles with Inductor): ``slow``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import handlerkit as hk
from conftest import MLP_MODEL_PY, write_model_dir
from handlerkit import archive
from handlerkit.cli import main
from handlerkit.errors import HandlerkitError
from handlerkit.formats.compile_cache import CACHE_FILE, TAG_FILE
from handlerkit.formats.compile_kernels import KERNELS_FILE, current_facts

pytestmark = pytest.mark.slow

HANDLER_PY = "from handlerkit import BaseHandler\n\n\nclass Handler(BaseHandler):\n    pass\n"
MANIFEST = {
    "model": {
        "modelName": "mlp",
        "handler": "handler.py",
        "modelFile": "model.py",
        "serializedFile": "model.pt",
        "configFile": "model-config.yaml",
    }
}


def mlp_dir(path: Path, pt2: str) -> Path:
    model_dir = write_model_dir(path, MLP_MODEL_PY, manifest=MANIFEST, config=pt2)
    (model_dir / "handler.py").write_text(HANDLER_PY)
    return model_dir


INDUCTOR = "pt2:\n  compile:\n    enable: true\n    backend: inductor\n"
ROW = [1.0, 2.0, 3.0, 4.0]

# A fresh process, an empty cache dir: serve the archive once and say what the caches did.
# Every C++ build is counted: kernels, CPU-ISA probes, and the precompiled header, which lives in the temp dir.
FRESH = """
import json, sys, time
import handlerkit as hk
from torch._dynamo.utils import counters
from torch._inductor import cpp_builder
built, build = [], cpp_builder.CppBuilder.build
def counted(self):
    built.append(self.get_target_file_path())
    return build(self)
cpp_builder.CppBuilder.build = counted
with hk.Service.open(sys.argv[1]) as svc:
    svc.initialize()
    start = time.perf_counter()
    answer = svc.handle(hk.batch(hk.Request.json({row})))
    first = time.perf_counter() - start
    caches = {{f"{{k}}.{{n}}": v for k in ("inductor", "aot_autograd") for n, v in counters[k].items() if "cache" in n}}
    print(json.dumps({{"cache": svc.handler.decisions.compile.cache, "counters": caches, "answer": answer, "first_s": first,
                      "built": built}}))
"""


def serve_fresh(mar: Path, cache_dir: Path) -> dict:
    """Serve in a fresh process as on a fresh machine: an empty cache dir, and an empty temp dir
    (where Inductor keeps its precompiled headers, outside the cache dir)."""
    fresh_tmp = cache_dir.parent / f"{cache_dir.name}-tmp"
    fresh_tmp.mkdir(parents=True)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir), "TMPDIR": str(fresh_tmp)}
    done = subprocess.run(
        [sys.executable, "-c", FRESH.format(row=ROW), str(mar)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_handler_that_does_not_compile_has_no_cache_to_ship(tmp_path):
    model_dir = mlp_dir(tmp_path / "mlp", "handler:\n  profile: false\n")
    with pytest.raises(HandlerkitError, match=r"^the handler of model 'mlp' does not compile its model \(no pt2 section.*\): no compile cache") as info:
        archive.build(model_dir, tmp_path / "store", compile_cache=hk.batch(hk.Request.json(ROW)))
    assert "pt2: {compile: {enable: true" in info.value.fix
    assert not (tmp_path / "store" / "mlp.mar").exists()


def test_the_shipped_cache_is_hit_by_a_fresh_process_with_an_empty_cache_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "recording-cache"))  # the children inherit it
    model_dir = mlp_dir(tmp_path / "mlp", INDUCTOR)
    mar = archive.build(model_dir, tmp_path / "store", compile_cache=hk.batch(hk.Request.json(ROW)))
    with zipfile.ZipFile(mar) as zf:
        names = zf.namelist()
        tag = json.loads(zf.read(TAG_FILE))
    assert {CACHE_FILE, TAG_FILE, KERNELS_FILE} <= set(names)
    assert tag["device_kind"] == "cpu" and tag["artifacts"]["inductor"] >= 1 and tag["artifacts"]["aot_autograd"] >= 1
    assert tag["kernels"]["files"] >= 2 and tag["kernels"]["machine"] == current_facts()["machine"]
    assert tag["inductor_config"] == {"cpp_cache_precompile_headers": False}

    # The CLI, from the same model dir: the recording now hits the machine's warm cache, and ships it all the same.
    request = tmp_path / "row.json"
    request.write_text(json.dumps(ROW))
    code = main(["archive", str(model_dir), "-o", str(tmp_path / "cli"), "--compile-cache", str(request), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0, data
    assert data["compile_cache"]["artifacts"] == tag["artifacts"]
    assert {f["name"] for f in data["files"]} >= {CACHE_FILE, TAG_FILE, KERNELS_FILE}

    served = serve_fresh(Path(data["path"]), tmp_path / "empty-cache")
    assert served["cache"]["loaded"], served["cache"]["reason"]
    counters = served["counters"]
    assert counters.get("inductor.fxgraph_cache_hit", 0) >= 1 and "inductor.fxgraph_cache_miss" not in counters
    assert counters.get("aot_autograd.autograd_cache_hit", 0) >= 1 and "aot_autograd.autograd_cache_miss" not in counters
    assert len(served["answer"]) == 1 and len(served["answer"][0]) == 3
    # The kernels came with the archive, and no precompiled header is needed: nothing built at all.
    assert served["cache"]["kernels"]["restored"] >= 2, served["cache"]["kernels"]
    assert served["built"] == []
