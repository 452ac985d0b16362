"""handlerkit._optional: a missing optional package fails with the pip command that brings it."""

from __future__ import annotations

import json
import sys

import pytest

from handlerkit._optional import require

ABSENT = "handlerkit_test_no_such_module"


def test_present_module_is_returned():
    assert require("json", feature="reading JSON", extra="onnx") is json
    import email.mime

    assert require("email.mime", feature="mail") is email.mime


def test_missing_module_names_the_extra_and_chains_the_cause():
    with pytest.raises(ImportError, match=rf"^loading \.onnx models needs {ABSENT}: pip install 'handlerkit\[onnx\]'$") as info:
        require(ABSENT, feature="loading .onnx models", extra="onnx")
    assert isinstance(info.value.__cause__, ModuleNotFoundError)
    assert info.value.__cause__.name == ABSENT
    assert info.value.name == ABSENT
    assert not isinstance(info.value, ModuleNotFoundError)  # our own ImportError, not the original


def test_missing_submodule_names_its_package_and_the_given_pip_command():
    with pytest.raises(
        ImportError,
        match=rf"^explanations \(Integrated Gradients\) needs {ABSENT}: pip install captum$",
    ) as info:
        require(f"{ABSENT}.attr", feature="explanations (Integrated Gradients)", pip="pip install captum")
    assert info.value.__cause__.name == ABSENT


def test_without_extra_or_pip_the_package_is_pip_installed():
    with pytest.raises(ImportError, match=rf"^plots needs {ABSENT}: pip install {ABSENT}$"):
        require(ABSENT, feature="plots")


def test_module_blocked_in_sys_modules_counts_as_missing(monkeypatch):
    # sys.modules[name] = None is how tests (and some environments) hide an installed package.
    monkeypatch.setitem(sys.modules, "json", None)
    with pytest.raises(ImportError, match=r"^reading JSON needs json: pip install 'handlerkit\[onnx\]'$"):
        require("json", feature="reading JSON", extra="onnx")


def test_installed_package_whose_import_fails_says_so(tmp_path, monkeypatch):
    package = tmp_path / "hk_test_broken_pkg"
    package.mkdir()
    (package / "__init__.py").write_text(f"import {ABSENT}_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "hk_test_broken_pkg", raising=False)
    with pytest.raises(ImportError) as info:
        require("hk_test_broken_pkg", feature="the demo", extra="onnx")
    assert str(info.value) == (
        "the demo needs hk_test_broken_pkg: pip install 'handlerkit[onnx]' (hk_test_broken_pkg is installed, "
        f"but importing hk_test_broken_pkg failed: ModuleNotFoundError: No module named '{ABSENT}_dependency')"
    )
    assert info.value.__cause__.name == f"{ABSENT}_dependency"


def test_extra_and_pip_together_are_refused():
    with pytest.raises(ValueError, match=r"give extra or pip, not both"):
        require("json", feature="x", extra="onnx", pip="pip install onnx")

