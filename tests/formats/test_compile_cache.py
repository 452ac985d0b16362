"""A shipped compile cache: loaded when its tag matches this torch and device, refused with its reason when not."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import torch

import handlerkit as hk
from conftest import MLP_MODEL_PY, eager_manifest, write_model_dir
from handlerkit.formats import compile_cache
from handlerkit.formats.compile_cache import (
    CACHE_FILE,
    TAG_FILE,
    current_tag,
    load_shipped,
    mismatch,
    restore_kernels,
    write,
)
from handlerkit.formats.compile_kernels import KERNELS_FILE, current_facts


def ship(model_dir: Path, data: bytes = b"not a cache", **tag_changes: object) -> None:
    write(str(model_dir), data, {**current_tag("cpu"), **tag_changes})


@pytest.fixture
def no_loading(monkeypatch):
    def refuse(data: bytes) -> None:
        raise AssertionError("load_cache_artifacts must not be called for a refused cache")

    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", refuse)


def test_the_tag_names_torch_python_and_the_device():
    tag = current_tag("cpu")
    assert tag["torch"] == torch.__version__ and tag["device_kind"] == "cpu" and tag["device_name"] is None
    assert mismatch(tag, dict(tag)) is None
    assert mismatch({**tag, "device_kind": "cuda"}, tag) == "the compile cache was recorded with device_kind 'cuda' (here 'cpu')"


def test_a_model_dir_without_a_cache_loads_nothing(tmp_path):
    result = load_shipped(str(tmp_path), "cpu")
    assert not result.found and not result.loaded
    assert result.reason.startswith(f"no {CACHE_FILE} in the model dir")


def test_a_cache_of_another_torch_version_is_refused_with_its_reason(tmp_path, no_loading):
    ship(tmp_path, torch="2.3.0")
    result = load_shipped(str(tmp_path), "cpu")
    assert result.found and not result.loaded and result.tag["torch"] == "2.3.0"
    assert f"torch '2.3.0' (here '{torch.__version__}')" in result.reason
    assert result.reason.endswith("not loaded; rebuild the archive with compile_cache= where it will be served")


def test_a_cache_of_another_device_kind_is_refused(tmp_path, no_loading):
    ship(tmp_path, device_kind="cuda", device_name="NVIDIA H100")
    reason = load_shipped(str(tmp_path), "cpu").reason
    assert "device_kind 'cuda' (here 'cpu'), device_name 'NVIDIA H100' (here None)" in reason


def test_an_untagged_cache_is_refused(tmp_path, no_loading):
    (tmp_path / CACHE_FILE).write_bytes(b"bytes")
    result = load_shipped(str(tmp_path), "cpu")
    assert result.found and not result.loaded
    assert result.reason.startswith(f"{CACHE_FILE} has no readable {TAG_FILE} (FileNotFoundError")
    (tmp_path / TAG_FILE).write_text("[1, 2]")
    assert load_shipped(str(tmp_path), "cpu").reason.startswith(f"{TAG_FILE} is not a JSON object")


def test_a_matching_tag_hands_the_bytes_to_torch(tmp_path, monkeypatch):
    ship(tmp_path, data=b"the artifacts")
    seen: list[bytes] = []

    class Info:
        artifacts = {"inductor": ["k1", "k2"], "aot_autograd": ["k3"], "pgo": []}

    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda data: seen.append(data) or Info())
    result = load_shipped(str(tmp_path), "cpu")
    assert seen == [b"the artifacts"]
    assert result.loaded and result.artifacts == {"inductor": 2, "aot_autograd": 1}
    assert result.reason.startswith(f"loaded 2 inductor, 1 aot_autograd from {CACHE_FILE} (tag matches) in ")


def ship_kernels(model_dir: Path) -> None:
    with zipfile.ZipFile(model_dir / KERNELS_FILE, "w") as zf:
        zf.writestr("ab/cabc.so", b"library")


def test_matching_kernels_are_restored_into_the_inductor_cache_dir(tmp_path, monkeypatch):
    from torch._inductor import config

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    recorded_under = {"cpp_cache_precompile_headers": False}
    ship(tmp_path, data=b"the artifacts", kernels={**current_facts(), "files": 1}, inductor_config=recorded_under)
    ship_kernels(tmp_path)

    class Info:
        artifacts = {"inductor": ["k1"]}

    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda data: Info())
    with config.patch(cpp_cache_precompile_headers=True):
        result = load_shipped(str(tmp_path), "cpu")
        assert config.cpp_cache_precompile_headers is False  # the FX graph cache keys were made so
    assert result.loaded and result.kernels["found"] and result.kernels["restored"] == 1
    assert result.reason.endswith(
        "; set torch._inductor.config.cpp_cache_precompile_headers = False as when recorded"
        "; restored 1 kernel files into the Inductor cache dir (0 were there)"
    )
    assert result.kernels["reason"] == "restored 1 kernel files into the Inductor cache dir (0 were there)"
    assert (tmp_path / "inductor" / "ab" / "cabc.so").read_bytes() == b"library"


def test_kernels_built_elsewhere_are_not_restored_and_say_why(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    ship_kernels(tmp_path)
    tag = {"kernels": {**current_facts(), "cpp_compiler": "clang++: clang version 3.0"}}
    kernels = restore_kernels(str(tmp_path), tag)
    assert kernels["found"] and kernels["restored"] == 0
    assert kernels["reason"].startswith("the kernels were built with cpp_compiler 'clang++: clang version 3.0' (here ")
    assert kernels["reason"].endswith("not restored, the first call builds them; rebuild the archive where it will be served")
    assert not (tmp_path / "inductor" / "ab").exists()
    assert restore_kernels(str(tmp_path), {})["reason"].startswith("the kernels were built with machine None")


def test_no_kernels_shipped_says_the_first_call_builds_them(tmp_path):
    assert restore_kernels(str(tmp_path), {}) == {
        "found": False,
        "reason": f"no {KERNELS_FILE}: the first call builds the C++ kernels",
    }


def test_bytes_torch_cannot_read_are_reported(tmp_path):
    ship(tmp_path, data=b"garbage")
    result = load_shipped(str(tmp_path), "cpu")
    assert result.found and not result.loaded
    assert result.reason == f"torch could not read {CACHE_FILE} (torch.compiler.load_cache_artifacts gave nothing)"


def test_write_leaves_the_bytes_and_a_readable_tag(tmp_path):
    cache, tag = write(str(tmp_path), b"abc", {"torch": "x"})
    assert Path(cache).read_bytes() == b"abc" and json.loads(Path(tag).read_text()) == {"torch": "x"}


def test_save_artifacts_is_none_when_nothing_compiled(monkeypatch):
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: None)
    assert compile_cache.save_artifacts() is None


# ---------------------------------------------------------------------------- in BaseHandler
def compiled_context(model_dir: Path) -> hk.MockContext:
    config = {"pt2": {"compile": {"enable": True, "backend": "eager"}}}
    return hk.MockContext(model_dir=str(model_dir), gpu_id=None, manifest=eager_manifest(), model_yaml_config=config)


def test_base_handler_records_why_a_shipped_cache_is_refused(tmp_path, no_loading):
    model_dir = write_model_dir(tmp_path / "mlp", MLP_MODEL_PY)
    ship(model_dir, torch="1.13.1")
    handler = hk.BaseHandler()
    handler.initialize(compiled_context(model_dir))
    cache = handler.decisions.compile.cache
    assert handler.decisions.compile.applied and cache["found"] and not cache["loaded"]
    assert "torch '1.13.1'" in cache["reason"]
    assert [n for n in handler.decisions.notes if n.startswith("compile cache: ")] == [f"compile cache: {cache['reason']}"]


def test_base_handler_loads_a_matching_cache_before_the_first_call(tmp_path, monkeypatch):
    model_dir = write_model_dir(tmp_path / "mlp", MLP_MODEL_PY)
    ship(model_dir, data=b"shipped")
    seen: list[bytes] = []
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda data: seen.append(data))
    handler = hk.BaseHandler()
    handler.initialize(compiled_context(model_dir))
    assert seen == [b"shipped"]  # in initialize: before any compiled call
    assert handler.decisions.compile.cache["found"]


def test_an_eager_handler_does_not_look_for_a_cache(tmp_path, no_loading):
    model_dir = write_model_dir(tmp_path / "mlp", MLP_MODEL_PY)
    ship(model_dir)
    handler = hk.BaseHandler()
    handler.initialize(hk.MockContext(model_dir=str(model_dir), gpu_id=None, manifest=eager_manifest()))
    assert handler.decisions.compile.cache == {} and not any("compile cache" in n for n in handler.decisions.notes)
