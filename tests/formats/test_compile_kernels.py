"""Inductor's C++ kernels shipped beside the compile cache: which files are packed, how they come back."""

from __future__ import annotations

import functools
import os
import zipfile
from pathlib import Path

import pytest

from handlerkit.formats import compile_kernels
from handlerkit.formats.compile_kernels import (
    KERNELS_FILE,
    apply_config,
    current_facts,
    mismatch,
    pack,
    record_sources,
    recording_config,
    restore,
)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "inductor-cache"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(root))
    return root


def kernel(root: Path, key: str, *suffixes: str) -> None:
    folder = root / key[1:3]
    folder.mkdir(parents=True, exist_ok=True)
    for suffix in suffixes:
        (folder / f"{key}{suffix}").write_bytes(f"{key}{suffix}".encode())


def test_the_facts_name_the_machine_the_cpu_and_the_compiler():
    facts = current_facts()
    assert set(facts) == {"machine", "cpu_capability", "cpp_compiler"}
    assert mismatch(dict(facts), facts) is None
    other = {**facts, "cpu_capability": "NO AVX"}
    assert mismatch(other, facts) == f"the kernels were built with cpu_capability 'NO AVX' (here {facts['cpu_capability']!r})"
    assert mismatch({}, facts).startswith("the kernels were built with machine None (here ")


def test_record_sources_notes_what_inductor_writes_and_stops_after(cache_dir):
    from torch._inductor import codecache

    with record_sources() as seen:
        key, path = codecache.write("int main() { return 0; }", "cpp")
    assert seen == [path] and os.path.basename(path).startswith(key)
    codecache.write("int other() { return 1; }", "cpp")
    assert seen == [path]


def test_pack_ships_the_files_of_the_recorded_keys_only(cache_dir, tmp_path):
    kernel(cache_dir, "cabc", ".cpp", ".so", ".so.load_ok")
    kernel(cache_dir, "cdef", ".main.cpp", ".main.so", ".py")
    kernel(cache_dir, "cxyz", ".cpp", ".so")  # another model's kernel in a shared cache dir
    sources = [str(cache_dir / "ab" / "cabc.cpp"), str(cache_dir / "de" / "cdef.main.cpp"), "/elsewhere/cq1.cpp"]
    path, count = pack(sources, str(tmp_path))
    assert path == str(tmp_path / KERNELS_FILE) and count == 5
    with zipfile.ZipFile(path) as zf:
        assert sorted(zf.namelist()) == [
            "ab/cabc.cpp",
            "ab/cabc.so",
            "ab/cabc.so.load_ok",
            "de/cdef.main.cpp",
            "de/cdef.main.so",
        ]


def test_pack_ships_nothing_without_a_built_library(cache_dir, tmp_path):
    kernel(cache_dir, "cabc", ".cpp")
    assert pack([str(cache_dir / "ab" / "cabc.cpp")], str(tmp_path)) is None
    assert not (tmp_path / KERNELS_FILE).exists()


def test_restore_fills_the_cache_dir_and_keeps_what_is_there(cache_dir, tmp_path):
    kernel(cache_dir, "cabc", ".cpp", ".so")
    path, _ = pack([str(cache_dir / "ab" / "cabc.cpp")], str(tmp_path))
    (cache_dir / "ab" / "cabc.so").unlink()
    (cache_dir / "ab" / "cabc.cpp").write_text("mine")
    assert restore(path) == (1, 1)
    assert (cache_dir / "ab" / "cabc.so").read_bytes() == b"cabc.so"
    assert (cache_dir / "ab" / "cabc.cpp").read_text() == "mine"
    assert os.stat(cache_dir / "ab" / "cabc.so").st_mode & 0o111
    assert [p.name for p in (cache_dir / "ab").iterdir() if p.name.startswith(".handlerkit-")] == []


def test_restore_refuses_a_member_outside_the_cache_dir(cache_dir, tmp_path):
    path = tmp_path / KERNELS_FILE
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("../escape.so", b"x")
    with pytest.raises(ValueError, match=r"holds '\.\./escape\.so', which is not a file of the Inductor cache dir"):
        restore(str(path))
    assert not (tmp_path / "escape.so").exists()


def test_cache_dir_follows_the_environment(cache_dir):
    assert compile_kernels.cache_dir() == str(cache_dir)


def test_the_recording_turns_precompiled_headers_off_and_the_server_follows():
    from torch._inductor import config

    with config.patch(cpp_cache_precompile_headers=True):  # its own undo: a config module is no plain object
        assert recording_config() == {"cpp_cache_precompile_headers": False}
        assert config.cpp_cache_precompile_headers is False
    with config.patch(cpp_cache_precompile_headers=True):
        changed = apply_config({"cpp_cache_precompile_headers": False, "max_autotune": True})  # only the recording's keys
        assert changed == "torch._inductor.config.cpp_cache_precompile_headers = False"
        assert config.cpp_cache_precompile_headers is False and config.max_autotune is False
        assert apply_config({"cpp_cache_precompile_headers": False}) is None  # already so
        assert apply_config(None) is None
    assert config.cpp_cache_precompile_headers is True


def test_without_isa_probes_an_aoti_load_compares_all_but_the_isa(cache_dir, monkeypatch):
    from torch._inductor import codecache, cpp_builder, cpu_vec_isa

    built: list[str] = []
    monkeypatch.setattr(cpp_builder.CppBuilder, "build", lambda self: built.append(self.get_target_file_path()))
    monkeypatch.setattr(cpu_vec_isa.valid_vec_isa_list, "cache_info", lambda: functools._CacheInfo(0, 0, None, 0))
    torch_info = codecache.get_device_information
    with compile_kernels.without_isa_probes():
        info = codecache.get_device_information("cpu")
    assert built == [] and codecache.get_device_information is torch_info
    assert "AOTI_CPU_ISA" not in info and info["AOTI_MACHINE"] == current_facts()["machine"]
    assert set(info) == {"AOTI_PLATFORM", "AOTI_MACHINE", "AOTI_COMPUTE_CAPABILITY"}


def test_with_the_isa_known_an_aoti_load_compares_it_too(monkeypatch):
    from torch._inductor import codecache, cpu_vec_isa

    monkeypatch.setattr(cpu_vec_isa.valid_vec_isa_list, "cache_info", lambda: functools._CacheInfo(0, 0, None, 1))
    torch_info = codecache.get_device_information
    with compile_kernels.without_isa_probes():
        assert codecache.get_device_information is torch_info
