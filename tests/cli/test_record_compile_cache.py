"""The program that records a compile cache (:mod:`handlerkit.cli._record_compile_cache`), run in
this process through its ``main``: what it writes when the handler gives it nothing to record.

Recording a real Inductor cache, in the fresh process ``archive.build(..., compile_cache=...)``
starts, is in tests/archive/test_compile_cache.py (``slow``).
"""

from __future__ import annotations

import collections
import json
import pickle
from pathlib import Path

import handlerkit as hk
from conftest import MLP_MODEL_PY, write_model_dir
from handlerkit.cli._record_compile_cache import cache_counters, main

HANDLER_PY = "from handlerkit import BaseHandler\n\n\nclass Handler(BaseHandler):\n    pass\n"
MANIFEST = {
    "model": {"modelName": "mlp", "handler": "handler.py", "modelFile": "model.py", "serializedFile": "model.pt",
              "configFile": "model-config.yaml"}
}  # fmt: skip


def recorded(tmp_path: Path, config: str) -> tuple[dict, Path]:
    """``main``'s result for the MLP with ``config`` as its model-config.yaml, and its out dir."""
    model_dir = write_model_dir(tmp_path / "mlp", MLP_MODEL_PY, manifest=MANIFEST, config=config)
    (model_dir / "handler.py").write_text(HANDLER_PY)
    batch = tmp_path / "batch.pickle"
    batch.write_bytes(pickle.dumps(hk.batch(hk.Request.json([1.0, 2.0, 3.0, 4.0])).data))
    out, result = tmp_path / "out", tmp_path / "result.json"
    out.mkdir()
    from torch._inductor import config as inductor

    with inductor.patch(cpp_cache_precompile_headers=inductor.cpp_cache_precompile_headers):  # the program turns Inductor's precompiled headers off for its process: not this one's
        assert main([str(model_dir), str(batch), str(out), str(result)]) == 0
    return json.loads(result.read_text()), out


def test_a_handler_that_does_not_compile_is_reported_and_nothing_is_written(tmp_path):
    result, out = recorded(tmp_path, "handler:\n  profile: false\n")
    assert result == {
        "error": f"the handler of {tmp_path / 'mlp'} does not compile its model (no pt2 section: the model is not "
        "compiled): no compile cache to record"
    }
    assert list(out.iterdir()) == []


def test_a_compile_that_builds_no_artifact_is_reported(tmp_path):
    # The eager backend compiles (Dynamo traces) but leaves Inductor nothing to save.
    result, out = recorded(tmp_path, "pt2:\n  compile:\n    enable: true\n    backend: eager\n")
    assert result == {"error": f"the handler of {tmp_path / 'mlp'} answered the batch without compiling anything: no cache"}
    assert list(out.iterdir()) == []


def test_the_counters_are_the_two_caches_by_name(monkeypatch):
    from torch._dynamo.utils import counters

    monkeypatch.setitem(counters, "inductor", collections.Counter(fxgraph_cache_hit=2, fxgraph_cache_miss=1, other=5))
    monkeypatch.setitem(counters, "aot_autograd", collections.Counter(autograd_cache_miss=1, total=3))
    assert list(cache_counters()) == sorted(cache_counters()) and cache_counters() == {
        "aot_autograd.autograd_cache_miss": 1,
        "inductor.fxgraph_cache_hit": 2,
        "inductor.fxgraph_cache_miss": 1,
    }
