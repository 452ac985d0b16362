"""handlerkit.worker.config: model-config.yaml parsed and checked as TorchServe 0.12 reads it.

The pt2 section has its own tests (test_pt2.py).
"""

from __future__ import annotations

import copy
import dataclasses
import textwrap
import warnings

import pytest

from handlerkit.errors import ConfigError, HandlerkitWarning
from handlerkit.worker import config as config_module
from handlerkit.worker import pt2 as pt2_module
from handlerkit.worker.config import SERVER_KEYS, HandlerSettings, ModelConfig, load_config, parse_config


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
    assert (cfg.handler.profile, cfg.handler.topk, cfg.handler.tf32) == (True, 3, "auto")
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
    lines = info.value.message.splitlines()
    assert lines[0] == "model-config.yaml: batchSize must be an integer, got str 'eight'"
    assert "model-config.yaml: maxWorkers must be an integer, got float 2.0" in lines
    assert "model-config.yaml: minWorkers must be an integer, got bool True" in lines
    assert (
        "model-config.yaml: useJobTicket must be a boolean (true or false), got str 'true' "
        "(TorchServe ignores a quoted boolean)"
    ) in lines
    assert any(line.startswith("model-config.yaml: deviceIds[1] must be an integer, got str '1'") for line in lines)
    assert any("responseTimeout must be an integer that fits in 32 bits" in line for line in lines)
    assert any(line.startswith("model-config.yaml: pt2.compile.enable must be a boolean") for line in lines)
    assert len(lines) == 7
    assert len(info.value.problems) == 7
    assert info.value.problems[0] == "batchSize must be an integer, got str 'eight'"
    # The fixes that are known, each with its key path, on the error (not in the message).
    assert info.value.fix == (
        "useJobTicket: write true without quotes; deviceIds[1]: write 1 without quotes; "
        "pt2.compile.enable: write true without quotes"
    )
    assert str(info.value).endswith("\n  fix: " + info.value.fix)


def test_quoted_number_is_an_error_not_coerced():
    # TorchServe's frontend ignores a quoted number (batch size stays 1), so handlerkit refuses it.
    with pytest.raises(ConfigError, match=r"batchSize must be an integer, got str '8' \(TorchServe ignores a quoted") as info:
        parse_config({"batchSize": "8"})
    assert info.value.fix == "write 8 without quotes"


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


# ------------------------------------------------------------------------------ handler: settings


def test_handler_settings_are_typed_with_defaults():
    cfg = no_warnings({"handler": {"profile": True, "tf32": False, "topk": 3}})
    assert isinstance(cfg.handler, HandlerSettings)
    assert (cfg.handler.profile, cfg.handler.tf32, cfg.handler.topk) == (True, False, 3)
    assert cfg.handler.extra == {}
    empty = no_warnings({}).handler
    assert empty == HandlerSettings() and len(empty) == 0 and not empty
    assert (empty.profile, empty.tf32, empty.topk) == (False, "auto", None)
    assert no_warnings({"handler": {"tf32": "auto"}}).handler.tf32 == "auto"
    assert no_warnings({"handler": {"topk": None}}).handler.topk is None  # null: the handler's default
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.handler.topk = 4


def test_handler_settings_read_like_the_section_as_written():
    cfg = no_warnings({"handler": {"topk": 2, "profile": False, "model_path": "/m", "threshold": 0.5}})
    handler = cfg.handler
    assert handler["topk"] == 2 and handler.get("topk") == 2
    assert handler["model_path"] == "/m" and handler.get("threshold") == 0.5
    assert handler.extra == {"model_path": "/m", "threshold": 0.5}
    assert "profile" in handler and handler["profile"] is False  # written, though it is the default
    assert "tf32" not in handler and handler.get("tf32") is None and handler.get("tf32", "auto") == "auto"
    assert handler.get("missing", 7) == 7 and "missing" not in handler
    with pytest.raises(KeyError, match="missing"):
        handler["missing"]
    assert dict(handler) == {"profile": False, "topk": 2, "model_path": "/m", "threshold": 0.5}
    assert len(handler) == 4
    # Built directly, a field that differs from its default reads as set.
    shapes = no_warnings({"handler": {"dynamic_shapes": {"item_ids": [1], "mask": [1, 1], 2: []}}}).handler
    assert shapes.dynamic_shapes == {"item_ids": (1,), "mask": (1,), 2: ()} and "dynamic_shapes" in shapes
    assert no_warnings({}).handler.dynamic_shapes is None
    direct = HandlerSettings(topk=3, extra={"x": 1})
    assert dict(direct) == {"topk": 3, "x": 1} and "profile" not in direct


@pytest.mark.parametrize(
    ("section", "message", "fix"),
    [
        ({"tf32": "maybe"}, r"handler\.tf32 must be auto, true or false, got str 'maybe'", "write tf32: auto"),
        ({"tf32": "True"}, r"handler\.tf32 must be auto, true or false, got str 'True'", "write true without quotes"),
        ({"tf32": 1}, r"handler\.tf32 must be auto, true or false, got int 1", "write tf32: auto"),
        ({"tf32": None}, r"handler\.tf32 must be auto, true or false, got null", "write tf32: auto"),
        ({"topk": 0}, r"handler\.topk must be a positive integer \(how many classes to return\), got int 0", "write e.g."),
        ({"topk": -1}, r"handler\.topk must be a positive integer .*got int -1", "write e.g."),
        ({"topk": True}, r"handler\.topk must be a positive integer .*got bool True", "write e.g."),
        ({"topk": 2.5}, r"handler\.topk must be a positive integer .*got float 2\.5", "write e.g."),
        ({"topk": "3"}, r"handler\.topk must be a positive integer .*got str '3'", "write 3 without quotes"),
        ({"profile": "true"}, r"handler\.profile must be a boolean \(true or false\), got str 'true'", "write true"),
        ({"dynamic_shapes": [1]}, r"handler\.dynamic_shapes must map the model's inputs to their dims that vary, got "
         r"list \[1\]", "write e.g. 'handler: {dynamic_shapes: {item_ids: [1], mask: [1]}}'"),
        ({"dynamic_shapes": {"item_ids": [0, 1]}}, r"handler\.dynamic_shapes\.item_ids must be a list of dimension "
         r"indices 1 and up, got list \[0, 1\]; dim 0, the batch, always varies", "write item_ids: [1]"),
        ({"dynamic_shapes": {"item_ids": "1"}}, r"handler\.dynamic_shapes\.item_ids must be a list of dimension "
         r"indices 1 and up, got str '1'", "write e.g."),
        ({"dynamic_shapes": {True: [1]}}, r"handler\.dynamic_shapes\.True: an input is named \(forward's "
         r"parameter\) or numbered, got bool True", "write e.g."),
    ],
)  # fmt: skip
def test_bad_handler_values_are_config_errors(section, message, fix):
    with pytest.raises(ConfigError, match=rf"^model-config\.yaml: {message}") as info:
        parse_config({"handler": section}, "model-config.yaml")
    assert info.value.fix.startswith(fix)
    assert "fix" not in info.value.message.lower()


def test_handler_problems_are_collected_with_the_others():
    with pytest.raises(ConfigError) as info:
        parse_config({"batchSize": "x", "handler": {"tf32": "on", "topk": 0, "profile": 1}}, "m.yaml")
    assert [p.split(" must ")[0] for p in info.value.problems] == [
        "batchSize",
        "handler.tf32",
        "handler.topk",
        "handler.profile",
    ]
    assert "handler.topk: write e.g. 'handler: {topk: 5}'" in info.value.fix


@pytest.mark.parametrize(("key", "meant"), [("top_k", "topk"), ("tf_32", "tf32"), ("Profile", "profile"), ("topK", "topk")])
def test_near_miss_of_a_handler_key_warns(key, meant):
    expected = rf"^handlerkit: unknown key handler\.{key} \(did you mean '{meant}'\?\); it is not read as '{meant}'"
    with pytest.warns(HandlerkitWarning, match=expected):
        cfg = parse_config({"handler": {key: 3}})
    assert cfg.handler.extra == {key: 3} and cfg.handler[key] == 3
    assert getattr(cfg.handler, meant) == HandlerSettings.__dataclass_fields__[meant].default


def test_other_handler_keys_are_free_for_custom_handlers():
    section = {"model_path": "x", "index_filename": "i.json", "threshold": 0.3, "labels": [1, 2]}
    cfg = no_warnings({"handler": section})
    assert cfg.handler.extra == section
    cfg.handler.extra["labels"].append(3)  # a copy: the raw config is untouched
    assert section["labels"] == [1, 2] and cfg.raw["handler"]["labels"] == [1, 2]


def test_did_you_mean_comes_from_the_shared_helper():
    assert not hasattr(config_module, "_nearest") and not hasattr(pt2_module, "_nearest")
    assert config_module.Pt2Config is pt2_module.Pt2Config
    assert config_module.TORCHSERVE_PT2_BACKENDS is pt2_module.TORCHSERVE_PT2_BACKENDS


# ------------------------------------------------------------------------------ file errors


def test_malformed_yaml_names_file_line_and_column(tmp_path):
    path = write(tmp_path, "batchSize: 4\nhandler:\n  a: 1\n b: 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = info.value.message
    assert message.startswith(f"{path}, line 4, column 2: not valid YAML")
    assert "fix" not in message.lower()
    assert info.value.fix.startswith("check the YAML near line 4: indent with spaces")
    assert info.value.__cause__ is not None


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.yaml: no such model config") as info:
        load_config(tmp_path / "nope.yaml")
    assert "configFile" in info.value.fix


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_top_level_must_be_a_mapping(tmp_path, text):
    with pytest.raises(ConfigError, match=r"the top level must be a mapping"):
        load_config(write(tmp_path, text))


def test_empty_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=r"the file is empty") as info:
        load_config(write(tmp_path, "# only a comment\n"))
    assert info.value.fix == "write at least one key (e.g. 'batchSize: 1'), or drop --config-file"


def test_non_string_top_level_key_is_an_error():
    with pytest.raises(ConfigError, match=r"top-level key 1 must be a string") as info:
        parse_config({1: "x"})
    assert info.value.fix == "quote it: '1'"


def test_repr_is_short_and_useful():
    cfg = no_warnings({"batchSize": 4, "handler": {"topk": 1}, "pt2": {"compile": {"enable": True, "backend": "eager"}}})
    text = repr(cfg)
    assert text.startswith("ModelConfig(source='model-config.yaml', batchSize=4")
    assert "schema='compile'" in text and "handler=['topk']" in text


def test_warnings_are_kept_on_the_config():
    cfg = parse_quietly({"pt2": "inductor", "batchsize": 1})
    assert len(cfg.warnings) == 2 and not any(w.startswith("handlerkit:") for w in cfg.warnings)


def test_warning_points_at_the_caller(tmp_path):
    with pytest.warns(HandlerkitWarning) as record:
        load_config(write(tmp_path, "pt2: inductor\n"))
    assert record[0].filename == __file__
    assert str(record[0].message).endswith(f"(in {tmp_path / 'model-config.yaml'})")
