"""handlerkit.config: model-config.yaml parsed and checked as TorchServe 0.12 reads it."""

from __future__ import annotations

import copy
import dataclasses
import textwrap
import warnings

import pytest

from handlerkit.config import (
    SERVER_KEYS,
    TORCHSERVE_PT2_BACKENDS,
    ModelConfig,
    Pt2Config,
    load_config,
    parse_config,
)
from handlerkit.errors import ConfigError, HandlerkitWarning


def write(tmp_path, text: str, name: str = "model-config.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def parse_quietly(mapping):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HandlerkitWarning)
        return parse_config(mapping, "model-config.yaml")


def no_warnings(mapping):
    with warnings.catch_warnings():
        warnings.simplefilter("error", HandlerkitWarning)
        return parse_config(mapping, "model-config.yaml")


# ------------------------------------------------------------------------------ server keys


def test_load_config_reads_server_keys_and_sections(tmp_path):
    path = write(
        tmp_path,
        """
        minWorkers: 1
        maxWorkers: 2
        batchSize: 4
        maxBatchDelay: 50
        responseTimeout: 300
        startupTimeout: 600
        deviceType: gpu
        deviceIds: [0, 1]
        parallelType: pp
        parallelLevel: 2
        jobQueueSize: 10
        useJobTicket: true
        continuousBatching: false
        handler:
          profile: true
          topk: 3
        micro_batching:
          micro_batch_size: 2
        pt2:
          compile:
            enable: true
            backend: inductor
            mode: reduce-overhead
        """,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", HandlerkitWarning)
        cfg = load_config(path)
    assert cfg.source == str(path)
    assert (cfg.min_workers, cfg.max_workers, cfg.batch_size, cfg.max_batch_delay) == (1, 2, 4, 50)
    assert (cfg.response_timeout, cfg.startup_timeout) == (300, 600)
    assert (cfg.device_type, cfg.device_ids, cfg.parallel_type, cfg.parallel_level) == ("gpu", [0, 1], "pp", 2)
    assert (cfg.job_queue_size, cfg.use_job_ticket, cfg.continuous_batching) == (10, True, False)
    assert cfg.use_venv is None and cfg.torchrun is None and cfg.async_communication is None
    assert cfg.handler == {"profile": True, "topk": 3}
    assert cfg.sections == {"micro_batching": {"micro_batch_size": 2}}
    assert cfg.pt2.schema == "compile" and cfg.pt2.compile
    assert cfg.server["batchSize"] == 4 and "useVenv" not in cfg.server


def test_every_server_key_of_modelconfig_java_is_an_attribute():
    # The 23 keys TorchServe 0.12's ModelConfig.build reads (checked against model-server.jar).
    assert set(SERVER_KEYS) == {
        "minWorkers", "maxWorkers", "batchSize", "maxBatchDelay", "responseTimeout", "startupTimeout",
        "deviceType", "deviceIds", "parallelType", "parallelLevel", "torchrun", "maxRetryTimeoutInSec",
        "clientTimeoutInMills", "jobQueueSize", "useJobTicket", "sequenceMaxIdleMSec",
        "sequenceTimeoutMSec", "maxSequenceJobQueueSize", "maxNumSequence", "continuousBatching",
        "sequenceBatching", "asyncCommunication", "useVenv",
    }  # fmt: skip
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    cfg = no_warnings({})
    for attr in SERVER_KEYS.values():
        assert attr in names
        assert getattr(cfg, attr) is None


def test_raw_is_the_mapping_as_given_and_never_changed():
    raw = {"batchSize": 2, "pt2": {"compile": {"enable": True, "backend": "inductor"}}, "handler": {"a": [1]}}
    before = copy.deepcopy(raw)
    cfg = no_warnings(raw)
    assert cfg.raw is raw and raw == before
    assert cfg.pt2.compile_options == {"backend": "inductor"}  # enable removed from the copy only
    cfg.pt2.compile_options["mode"] = "x"
    cfg.handler["a"].append(2)
    copied = cfg.to_dict()
    copied["pt2"]["compile"]["enable"] = False
    assert raw == before


def test_yaml_1_1_booleans_are_booleans(tmp_path):
    # PyYAML and TorchServe's SnakeYAML both read yes/no/on/off as booleans.
    cfg = load_config(write(tmp_path, "useJobTicket: yes\ncontinuousBatching: off\n"))
    assert cfg.use_job_ticket is True and cfg.continuous_batching is False


def test_type_errors_are_collected_with_key_paths():
    raw = {
        "batchSize": "eight",
        "maxWorkers": 2.0,
        "minWorkers": True,
        "useJobTicket": "true",
        "deviceIds": [0, "1"],
        "responseTimeout": 2**40,
        "pt2": {"compile": {"enable": "yes", "fullgraph": "no"}},
    }
    with pytest.raises(ConfigError) as info:
        parse_config(raw, "model-config.yaml")
    lines = str(info.value).splitlines()
    assert lines[0] == "model-config.yaml: batchSize must be an integer, got str 'eight'"
    assert "model-config.yaml: maxWorkers must be an integer, got float 2.0" in lines
    assert "model-config.yaml: minWorkers must be an integer, got bool True" in lines
    assert any(
        line.startswith("model-config.yaml: useJobTicket must be a boolean (true or false), got str 'true'")
        and "write true without quotes" in line
        for line in lines
    )
    assert any(line.startswith("model-config.yaml: deviceIds[1] must be an integer, got str '1'") for line in lines)
    assert any("responseTimeout must be an integer that fits in 32 bits" in line for line in lines)
    assert any(line.startswith("model-config.yaml: pt2.compile.enable must be a boolean") for line in lines)
    assert len(lines) == 7
    assert len(info.value.problems) == 7


def test_quoted_number_is_an_error_not_coerced():
    # TorchServe's frontend ignores a quoted number (batch size stays 1), so handlerkit refuses it.
    with pytest.raises(ConfigError, match=r"batchSize must be an integer, got str '8' \(TorchServe ignores a quoted"):
        parse_config({"batchSize": "8"})


def test_values_torchserve_adjusts_are_warnings():
    with pytest.warns(HandlerkitWarning) as record:
        cfg = parse_config({"batchSize": 0, "responseTimeout": -1, "deviceType": "gpux", "parallelType": "PP"})
    messages = [str(w.message) for w in record]
    assert cfg.batch_size == 0  # as written; the warning says what TorchServe does
    assert any("batchSize: 0 is below 1; TorchServe 0.12 raises it to 1" in m for m in messages)
    assert any("responseTimeout: -1" in m and "keeps 120 s" in m for m in messages)
    assert any("deviceType: 'gpux'" in m and "did you mean 'gpu'" in m for m in messages)
    assert not any("parallelType" in m for m in messages)  # TorchServe lower-cases it
    assert all(m.startswith("handlerkit: ") for m in messages)


def test_torchrun_section_is_typed():
    with pytest.warns(HandlerkitWarning, match=r"unknown key torchrun\.nnode \(did you mean 'nnodes'\?\)"):
        cfg = parse_config({"torchrun": {"nproc-per-node": 4, "nnode": 2}})
    assert cfg.torchrun == {"nproc-per-node": 4, "nnode": 2}
    with pytest.raises(ConfigError, match=r"torchrun\.nproc-per-node must be an integer, got str 'four'"):
        parse_config({"torchrun": {"nproc-per-node": "four"}})


# ------------------------------------------------------------------------------ unknown keys


def test_unknown_top_level_key_warns_only_when_it_looks_like_a_typo():
    with pytest.warns(HandlerkitWarning, match=r"^handlerkit: unknown top-level key 'batchsize' \(did you mean 'batchSize'\?\)"):
        cfg = parse_config({"batchsize": 4})
    assert cfg.batch_size is None and cfg.sections == {"batchsize": 4}
    with pytest.warns(HandlerkitWarning, match=r"did you mean 'maxBatchDelay'"):
        parse_config({"max_batch_delay": 10})
    with pytest.warns(HandlerkitWarning, match=r"did you mean 'handler'"):
        parse_config({"hander": {"x": 1}})
    # Free sections for handlers are TorchServe's design: no warning.
    cfg = no_warnings({"micro_batching": {"parallelism": {"preprocess": 2}}, "my_section": [1, 2], "deepspeed": {}})
    assert set(cfg.sections) == {"micro_batching", "my_section", "deepspeed"}


def test_handler_section_must_be_a_mapping():
    with pytest.raises(ConfigError, match=r"handler must be a mapping, got null"):
        parse_config({"handler": None})
    with pytest.raises(ConfigError, match=r"handler.profile must be a boolean"):
        parse_config({"handler": {"profile": "yes please"}})


# ------------------------------------------------------------------------------ file errors


def test_malformed_yaml_names_file_line_and_column(tmp_path):
    path = write(tmp_path, "batchSize: 4\nhandler:\n  a: 1\n b: 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}, line 4, column 2: not valid YAML")
    assert "indent with spaces" in message
    assert info.value.__cause__ is not None


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.yaml: no such file"):
        load_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_top_level_must_be_a_mapping(tmp_path, text):
    with pytest.raises(ConfigError, match=r"the top level must be a mapping"):
        load_config(write(tmp_path, text))


def test_empty_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=r"the file is empty"):
        load_config(write(tmp_path, "# only a comment\n"))


def test_non_string_top_level_key_is_an_error():
    with pytest.raises(ConfigError, match=r"top-level key 1 must be a string"):
        parse_config({1: "x"})


# ------------------------------------------------------------------------------ pt2


def test_no_pt2_means_no_compile():
    pt2 = no_warnings({"batchSize": 1}).pt2
    assert pt2 == Pt2Config()
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


def test_pt2_compile_without_enable_is_torchserve_keyerror():
    with pytest.raises(ConfigError, match=r"pt2\.compile has no 'enable' key: TorchServe 0\.12 fails with KeyError 'enable'\. Add enable: true") as info:
        parse_config({"pt2": {"compile": {"backend": "inductor"}}}, "model-config.yaml")
    assert "pt2: {compile: {enable: true, backend: inductor}}" in str(info.value)


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
    assert crash in str(info.value) and "pt2: {compile: {enable: true" in str(info.value)


def test_pt2_string_is_searched_for_compile_and_export_like_torchserve():
    # TorchServe tests `"compile" in pt2` before checking the type: substrings match.
    with pytest.raises(ConfigError, match=r"finds the substring and fails with TypeError"):
        parse_config({"pt2": "my_compiler"})
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


def test_repr_is_short_and_useful():
    cfg = no_warnings({"batchSize": 4, "handler": {"topk": 1}, "pt2": {"compile": {"enable": True, "backend": "eager"}}})
    text = repr(cfg)
    assert text.startswith("ModelConfig(source='model-config.yaml', batchSize=4")
    assert "schema='compile'" in text and "handler=['topk']" in text
    assert repr(Pt2Config()) == "Pt2Config(schema='none', compile=False)"


def test_warnings_are_kept_on_the_config():
    cfg = parse_quietly({"pt2": "inductor", "batchsize": 1})
    assert len(cfg.warnings) == 2 and not any(w.startswith("handlerkit:") for w in cfg.warnings)


def test_warning_points_at_the_caller(tmp_path):
    with pytest.warns(HandlerkitWarning) as record:
        load_config(write(tmp_path, "pt2: inductor\n"))
    assert record[0].filename == __file__
    assert str(record[0].message).endswith(f"(in {tmp_path / 'model-config.yaml'})")


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

    from handlerkit.loading import model_dir_imports

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
