"""``handlerkit compile --json``: the compile caches per graph and the first call's cold-compile /
cache-load split, from fresh processes with an empty ``TORCHINDUCTOR_CACHE_DIR``.

Each test starts ``python -m handlerkit.cli`` and compiles a four-input MLP with Inductor: ``slow``.
The exit codes 0, 1 and 2 of ``compile`` without Inductor are in tests/cli/test_cli.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import handlerkit as hk
from conftest import MLP_MODEL_PY, write_model_dir
from handlerkit import archive

pytestmark = pytest.mark.slow

HANDLER_PY = "from handlerkit import BaseHandler\n\n\nclass Handler(BaseHandler):\n    pass\n"
MANIFEST = {
    "model": {"modelName": "mlp", "handler": "handler.py", "modelFile": "model.py", "serializedFile": "model.pt",
              "configFile": "model-config.yaml"}
}  # fmt: skip
INDUCTOR = "pt2:\n  compile:\n    enable: true\n    backend: inductor\n"
ROW = [1.0, 2.0, 3.0, 4.0]


def mlp(tmp_path: Path) -> tuple[Path, Path]:
    """The inductor-compiled MLP's model dir and a request file for it."""
    model_dir = write_model_dir(tmp_path / "mlp", MLP_MODEL_PY, manifest=MANIFEST, config=INDUCTOR)
    (model_dir / "handler.py").write_text(HANDLER_PY)
    request = tmp_path / "row.json"
    request.write_text(json.dumps(ROW))
    return model_dir, request


def compile_json(model: Path, request: Path, cache_dir: Path) -> tuple[int, dict]:
    """``handlerkit compile MODEL REQUEST --json`` in a fresh process whose cache dir is ``cache_dir``."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir)}
    argv = [sys.executable, "-m", "handlerkit.cli", "compile", str(model), str(request), "--repeat", "2", "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert done.stdout.strip(), done.stderr[-3000:]
    data = json.loads(done.stdout)
    assert data["exit_code"] == done.returncode
    return done.returncode, data


def test_an_empty_cache_dir_misses_both_caches_and_compiles_cold(tmp_path):
    model_dir, request = mlp(tmp_path)
    code, data = compile_json(model_dir, request, tmp_path / "empty-cache")

    assert code == 0 and data["ok"] is True and data["applied"] is True and data["backend"] == "inductor"
    (graph,) = data["graph_caches"]
    assert (graph["fx_graph_cache"], graph["aot_autograd_cache"], graph["cache_hit"]) == ("miss", "miss", False)
    assert graph["compile_id"] == "0/0" and graph["function"] == "forward"
    assert data["cold_compile_s"] > 0 and data["cache_load_s"] is None
    assert data["shipped_cache"] is None  # the dir ships none


def test_a_shipped_cache_is_hit_and_the_first_call_is_a_cache_load(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "recording-cache"))  # the recording's own
    model_dir, request = mlp(tmp_path)
    mar = archive.build(model_dir, tmp_path / "store", compile_cache=hk.batch(hk.Request.json(ROW)))
    code, data = compile_json(mar, request, tmp_path / "empty-cache")

    assert code == 0 and data["ok"] is True
    assert data["shipped_cache"]["loaded"] is True, data["shipped_cache"]
    (graph,) = data["graph_caches"]
    assert (graph["fx_graph_cache"], graph["aot_autograd_cache"], graph["cache_hit"]) == ("hit", "hit", True)
    assert data["cache_load_s"] > 0 and data["cold_compile_s"] is None
