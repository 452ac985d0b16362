"""handlerkit.worker.pt2: the pt2 section decided as TorchServe 0.12's BaseHandler.initialize does."""

from __future__ import annotations

import copy

import pytest

from handlerkit.errors import ConfigError, HandlerkitWarning
from handlerkit.worker.config import parse_config
from handlerkit.worker.pt2 import TORCHSERVE_PT2_BACKENDS, Pt2Config
from worker.test_config import no_warnings, parse_quietly


def test_no_pt2_means_no_compile():
    pt2 = no_warnings({"batchSize": 1}).pt2
    assert pt2 == Pt2Config()
    assert repr(pt2) == "Pt2Config(schema='none', compile=False)"
    assert (pt2.schema, pt2.compile, pt2.aot_compile, pt2.deprecated) == ("none", False, False, False)


def test_pt2_compile_enable_true_with_options():
    pt2 = no_warnings({"pt2": {"compile": {"enable": True, "backend": "inductor", "mode": "max-autotune", "fullgraph": True}}}).pt2
    assert pt2.schema == "compile" and pt2.compile and pt2.torchserve_compiles
    assert pt2.compile_options == {"backend": "inductor", "mode": "max-autotune", "fullgraph": True}
    assert pt2.backend == "inductor" and pt2.backend_known_to_torchserve
    assert not pt2.deprecated and not pt2.aot_compile
    assert "torch.compile(model, backend='inductor', mode='max-autotune', fullgraph=True)" in pt2.reason


def test_pt2_compile_without_backend_uses_torch_default():
    pt2 = no_warnings({"pt2": {"compile": {"enable": True}}}).pt2
    assert pt2.compile and pt2.backend is None and pt2.compile_options == {}
    assert pt2.backend_known_to_torchserve and "torch's default backend" in pt2.reason


def test_pt2_compile_enable_false():
    pt2 = no_warnings({"pt2": {"compile": {"enable": False, "backend": "inductor"}}}).pt2
    assert pt2.schema == "compile" and not pt2.compile
    assert pt2.reason == "pt2.compile.enable is false: the model is not compiled"
    # Switched off: options torch.compile would refuse are not warned about, bad types still fail.
    assert no_warnings({"pt2": {"compile": {"enable": False, "moed": 1}}}).pt2.compile_options == {"moed": 1}
    with pytest.raises(ConfigError, match=r"pt2\.compile\.fullgraph must be a boolean"):
        parse_config({"pt2": {"compile": {"enable": False, "fullgraph": "x"}}})


def test_pt2_compile_without_enable_is_torchserve_keyerror():
    with pytest.raises(ConfigError, match=r"pt2\.compile has no 'enable' key: TorchServe 0\.12 fails with KeyError 'enable'") as info:
        parse_config({"pt2": {"compile": {"backend": "inductor"}}}, "model-config.yaml")
    assert info.value.fix == (
        "add enable: true (or enable: false to switch compilation off), e.g. "
        "pt2: {compile: {enable: true, backend: inductor}}"
    )


def test_pt2_legacy_string_warns_and_compiles():
    with pytest.warns(HandlerkitWarning) as record:
        pt2 = parse_config({"pt2": "inductor"}).pt2
    (message,) = [str(w.message) for w in record]
    assert message.startswith("handlerkit: pt2: 'inductor' is the legacy schema")
    assert "write pt2: {compile: {enable: true, backend: inductor}}" in message
    assert (pt2.schema, pt2.compile, pt2.deprecated, pt2.backend) == ("legacy-str", True, True, "inductor")
    assert pt2.compile_options == {"backend": "inductor"}


def test_pt2_legacy_dict_warns_and_compiles():
    with pytest.warns(HandlerkitWarning, match=r"write pt2: \{compile: \{enable: true, backend: eager, mode: default\}\}"):
        pt2 = parse_config({"pt2": {"backend": "eager", "mode": "default"}}).pt2
    assert (pt2.schema, pt2.compile, pt2.deprecated) == ("legacy-dict", True, True)
    assert pt2.compile_options == {"backend": "eager", "mode": "default"}


def test_pt2_export_aot_compile():
    pt2 = no_warnings({"pt2": {"export": {"aot_compile": True}}}).pt2
    assert (pt2.schema, pt2.compile, pt2.aot_compile) == ("export", False, True)
    assert "AOTInductor" in pt2.reason
    both = no_warnings({"pt2": {"compile": {"enable": True}, "export": {"aot_compile": True}}}).pt2
    assert both.schema == "compile" and both.compile and both.aot_compile  # TorchServe reads both
    with pytest.raises(ConfigError, match=r"pt2\.export\.aot_compile must be a boolean"):
        parse_config({"pt2": {"export": {"aot_compile": "true"}}})


def test_backend_outside_torchserve_list_is_recorded_not_dropped():
    with pytest.warns(HandlerkitWarning, match=r"'cudagraphs' is not in TorchServe 0\.12's backend list"):
        pt2 = parse_config({"pt2": {"compile": {"enable": True, "backend": "cudagraphs"}}}).pt2
    assert pt2.compile and not pt2.backend_known_to_torchserve and not pt2.torchserve_compiles
    assert "cudagraphs" not in TORCHSERVE_PT2_BACKENDS and "inductor" in TORCHSERVE_PT2_BACKENDS


@pytest.mark.parametrize(
    ("value", "crash"),
    [(5, "TypeError"), ([1, 2], "ValueError 'pt2 should be str or dict'"), (None, "TypeError")],
)
def test_pt2_of_another_type_is_an_error(value, crash):
    with pytest.raises(ConfigError, match=r"pt2 must be a backend name \(string\) or a mapping") as info:
        parse_config({"pt2": value})
    assert crash in info.value.message
    assert info.value.fix == "write pt2: {compile: {enable: true, backend: inductor}}"


def test_pt2_string_is_searched_for_compile_and_export_like_torchserve():
    # TorchServe tests `"compile" in pt2` before checking the type: substrings match.
    with pytest.raises(ConfigError, match=r"finds the substring and fails with TypeError") as info:
        parse_config({"pt2": "my_compiler"})
    assert info.value.fix.startswith("write pt2: {compile:")
    with pytest.warns(HandlerkitWarning, match=r"contains 'export'"):
        pt2 = parse_config({"pt2": "exported"}).pt2
    assert not pt2.compile


def test_pt2_empty_mapping_compiles_with_defaults():
    with pytest.warns(HandlerkitWarning, match=r"legacy schema.*write pt2: \{compile: \{enable: true\}\}"):
        pt2 = parse_config({"pt2": {}}).pt2
    assert (pt2.schema, pt2.compile, pt2.compile_options, pt2.backend) == ("legacy-dict", True, {}, None)


def test_pt2_compile_section_must_be_a_mapping():
    with pytest.raises(ConfigError, match=r"pt2\.compile must be a mapping, got bool True"):
        parse_config({"pt2": {"compile": True}})


def test_unknown_keys_inside_pt2_always_warn():
    with pytest.warns(HandlerkitWarning, match=r"unknown key pt2\.compile\.moed \(did you mean 'mode'\?\)"):
        pt2 = parse_config({"pt2": {"compile": {"enable": True, "moed": "default"}}}).pt2
    assert not pt2.compile  # torch.compile(moed=...) raises TypeError; TorchServe serves uncompiled
    assert "no argument 'moed'" in pt2.reason
    with pytest.warns(HandlerkitWarning, match=r"unknown key pt2\.exprt \(did you mean 'export'\?\)"):
        parse_config({"pt2": {"compile": {"enable": True}, "exprt": {}}})
    with pytest.warns(HandlerkitWarning, match=r"unknown key pt2\.export\.aot \(did you mean 'aot_compile'\?\)"):
        parse_config({"pt2": {"export": {"aot": True}}})


def test_torch_compile_arguments_it_would_refuse():
    with pytest.warns(HandlerkitWarning, match=r"mode and options are both set"):
        pt2 = parse_config({"pt2": {"compile": {"enable": True, "mode": "max-autotune", "options": {"a": 1}}}}).pt2
    assert not pt2.compile
    with pytest.warns(HandlerkitWarning, match=r"'max_autotune' is not one of .* \(did you mean 'max-autotune'\?\)"):
        pt2 = parse_config({"pt2": {"compile": {"enable": True, "mode": "max_autotune"}}}).pt2
    assert not pt2.compile
    with pytest.warns(HandlerkitWarning, match=r"torch\.compile has no 'enable'"):
        pt2 = parse_config({"pt2": {"enable": True, "backend": "inductor"}}).pt2
    assert pt2.schema == "legacy-dict" and not pt2.compile


# ------------------------------------------------------------------------------ against TorchServe


@pytest.mark.torchserve
@pytest.mark.parametrize(
    "pt2",
    [
        {"compile": {"enable": True, "backend": "inductor", "mode": "max-autotune"}},
        {"compile": {"enable": True}},
        {"compile": {"enable": False, "backend": "inductor"}},
        {"compile": {"enable": True, "backend": "cudagraphs"}},
        {"export": {"aot_compile": True}},
        "eager",
        {"backend": "aot_eager", "fullgraph": True},
        {},
        None,
    ],
)
def test_pt2_decision_matches_torchserve_base_handler(tmp_path, monkeypatch, pt2):
    """Run TorchServe's own BaseHandler.initialize with torch.compile recorded."""
    pytest.importorskip("ts")
    torch = pytest.importorskip("torch")
    from ts.torch_handler.base_handler import BaseHandler

    from handlerkit.worker.loading import model_dir_imports

    (tmp_path / "model.py").write_text(
        "import torch\nclass TinyNet(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
    )
    raw = {} if pt2 is None else {"pt2": pt2}
    calls = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: calls.append(kw) or model)

    class Ctx:
        system_properties = {"model_dir": str(tmp_path), "gpu_id": None}
        manifest = {"model": {"modelFile": "model.py"}}
        model_yaml_config = copy.deepcopy(raw)  # TorchServe deletes pt2.compile.enable from it

    with model_dir_imports(tmp_path):
        BaseHandler().initialize(Ctx())

    expected = parse_quietly(raw).pt2
    assert bool(calls) == expected.torchserve_compiles
    if calls:
        assert calls[0] == expected.compile_options


# ------------------------------------------------------------------------------ modes and backends, against torch


def test_compile_modes_are_torchs_own_with_a_static_fallback(monkeypatch):
    import torch._inductor

    from handlerkit.worker import pt2 as pt2_module

    assert pt2_module.compile_modes() == tuple(torch._inductor.list_mode_options())
    assert "lite" in pt2_module.compile_modes()
    monkeypatch.setattr(pt2_module, "_torch_importable", lambda: False)
    pt2_module.compile_modes.cache_clear()
    try:
        assert pt2_module.compile_modes() == ("default", "lite", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
    finally:
        pt2_module.compile_modes.cache_clear()


def test_lite_mode_is_a_mode():
    pt2 = no_warnings({"pt2": {"compile": {"enable": True, "mode": "lite"}}}).pt2
    assert pt2.compile and pt2.torchserve_compiles
    assert pt2.reason == "pt2.compile.enable is true: torch.compile(model, mode='lite') with torch's default backend"


@pytest.mark.parametrize(
    ("backend", "checked"),
    [(None, True), ("inductor", True), ("eager", False), ("aot_eager", False)],
)
def test_mode_is_checked_only_for_inductor_as_torch_does(backend, checked):
    import torch

    options = {"mode": "bogus"} if backend is None else {"backend": backend, "mode": "bogus"}
    if checked:
        with pytest.raises(RuntimeError, match="Unrecognized mode=bogus"):
            torch.compile(torch.nn.Linear(1, 1), **options)
        with pytest.warns(HandlerkitWarning, match=r"pt2\.compile\.mode: 'bogus' is not one of default, lite, .*; torch\.compile \(inductor\) raises"):
            pt2 = parse_config({"pt2": {"compile": {"enable": True, **options}}}).pt2
        assert not pt2.compile and pt2.reason.endswith("torch.compile does not know mode 'bogus': torch.compile raises, so the model is not compiled")
    else:
        torch.compile(torch.nn.Linear(1, 1), **options)  # accepted: the backend gets mode=... and ignores it
        pt2 = no_warnings({"pt2": {"compile": {"enable": True, **options}}}).pt2
        assert pt2.compile and pt2.torchserve_compiles


def test_importing_pt2_and_parsing_without_a_mode_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys, handlerkit.worker.pt2; from handlerkit.worker.config import parse_config; "
        "parse_config({'pt2': {'compile': {'enable': True, 'backend': 'eager'}}}); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("backend", TORCHSERVE_PT2_BACKENDS)
def test_torchserve_compiles_means_torch_has_the_backend_too(backend):
    # TorchServe's list holds backends today's torch lacks: torch.compile raises InvalidBackend,
    # TorchServe logs it and serves the model uncompiled.
    import torch

    pt2 = parse_quietly({"pt2": {"compile": {"enable": True, "backend": backend}}}).pt2
    assert pt2.compile and pt2.backend_known_to_torchserve
    try:
        torch.compile(torch.nn.Linear(1, 1), backend=backend)
        accepted = True
    except Exception as exc:
        assert type(exc).__name__ == "InvalidBackend"
        accepted = False
    assert pt2.torchserve_compiles == accepted
    if backend == "nvfuser":
        assert not pt2.torchserve_compiles


@pytest.mark.torchserve
@pytest.mark.parametrize("backend", ["nvfuser", "eager"])
def test_torchserve_compiles_matches_torchserve_with_the_real_torch_compile(tmp_path, backend):
    import torch
    from ts.torch_handler.base_handler import BaseHandler

    from handlerkit.worker.loading import model_dir_imports

    (tmp_path / "model.py").write_text(
        "import torch\nclass TinyNet(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
    )
    raw = {"pt2": {"compile": {"enable": True, "backend": backend}}}

    class Ctx:
        system_properties = {"model_dir": str(tmp_path), "gpu_id": None}
        manifest = {"model": {"modelFile": "model.py"}}
        model_yaml_config = copy.deepcopy(raw)

    handler = BaseHandler()
    with model_dir_imports(tmp_path):
        handler.initialize(Ctx())
    compiled = isinstance(handler.model, torch._dynamo.eval_frame.OptimizedModule)
    assert compiled == parse_quietly(raw).pt2.torchserve_compiles == (backend == "eager")
