"""handlerkit._validate: the YAML type rules of TorchServe's Java frontend, the Findings that
collect problems and notes, and read_yaml's failures (the parsers using them are tested in
test_config.py, test_pt2.py and test_metrics_config.py)."""

from __future__ import annotations

import pytest

from handlerkit._validate import INT32, Findings, Problem, describe, read_yaml
from handlerkit.errors import ConfigError


def verdict(value, kind: str) -> tuple[bool, list[Problem]]:
    findings = Findings()
    ok = findings.check(value, kind, "key")
    return ok, findings.problems


# ---------------------------------------------------------------------------------------------
# Type rules
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, kind",
    [(8, "int"), (-(2**31), "int"), (2**31 - 1, "int"), (True, "bool"), (False, "bool"), ("x", "str"),
     ({}, "mapping"), ({"a": 1}, "mapping"), ([], "int_list"), ([0, 1], "int_list"), (None, "int?"),
     (None, "mapping?"), ("anything", "any"), (None, "any")],
)  # fmt: skip
def test_values_of_the_kind_pass_and_record_nothing(value, kind):
    assert verdict(value, kind) == (True, [])


@pytest.mark.parametrize(
    "value, kind, text",
    [
        (True, "int", "key must be an integer, got bool True"),  # a YAML boolean is no integer
        (8.0, "int", "key must be an integer, got float 8.0"),
        (None, "int", "key must be an integer, got null"),  # null only with a trailing '?'
        (2**31, "int", "key must be an integer that fits in 32 bits, got 2147483648"),
        (-(2**31) - 1, "int", "key must be an integer that fits in 32 bits, got -2147483649"),
        (1, "bool", "key must be a boolean (true or false), got int 1"),
        (3, "str", "key must be a string, got int 3"),
        ([1], "mapping", "key must be a mapping, got list [1]"),
        ("1, 2", "int_list", "key must be a list of integers, got str '1, 2'"),
    ],
)
def test_values_of_another_kind_are_problems_with_their_key_path(value, kind, text):
    ok, problems = verdict(value, kind)
    assert not ok and problems == [Problem("key", text, None)]


@pytest.mark.parametrize(
    "value, kind, hint, fix",
    [
        ("8", "int", "quoted number", "write 8 without quotes"),
        (" -3 ", "int", "quoted number", "write -3 without quotes"),
        ("true", "bool", "quoted boolean", "write true without quotes"),
        ("Yes", "bool", "quoted boolean", "write true without quotes"),  # YAML 1.1 spellings
        ("off", "bool", "quoted boolean", "write false without quotes"),
    ],
)
def test_a_quoted_number_or_boolean_is_refused_with_the_unquoted_fix(value, kind, hint, fix):
    """TorchServe's frontend ignores a quoted value (batchSize: "8" leaves the batch size at 1)."""
    ok, (problem,) = verdict(value, kind)
    assert not ok and problem.text.endswith(f"(TorchServe ignores a {hint})") and problem.fix == fix


def test_an_int_list_names_each_bad_item():
    ok, problems = verdict([0, "1", 2.5, 2**40], "int_list")
    assert not ok
    assert [(p.path, p.fix) for p in problems] == [("key[1]", "write 1 without quotes"), ("key[2]", None), ("key[3]", None)]
    assert problems[2].text == f"key[3] must be an integer that fits in 32 bits, got {2**40}"
    assert INT32 == (-(2**31), 2**31 - 1)


def test_describe_gives_the_type_and_a_short_repr():
    assert describe(None) == "null"
    assert describe("eight") == "str 'eight'"
    assert describe(8.0) == "float 8.0"
    long = describe("x" * 100)
    assert long.startswith("str 'xxx") and long.endswith("...") and len(long) == len("str ") + 60


# ---------------------------------------------------------------------------------------------
# Findings: every problem raised at once
# ---------------------------------------------------------------------------------------------


def test_no_problems_raise_nothing_and_notes_are_kept_apart():
    findings = Findings()
    findings.note("minWorkers is above maxWorkers")
    findings.raise_problems("model-config.yaml")
    assert findings.notes == ["minWorkers is above maxWorkers"] and findings.problems == []


def test_every_problem_is_raised_in_one_config_error_with_the_one_fix():
    findings = Findings()
    findings.check("8", "int", "batchSize")
    findings.check(1.5, "int", "maxBatchDelay")
    with pytest.raises(ConfigError, match=r"^cfg\.yaml: batchSize must be an integer, got str '8'") as info:
        findings.raise_problems("cfg.yaml")
    error = info.value
    assert error.message.splitlines() == [
        "cfg.yaml: batchSize must be an integer, got str '8' (TorchServe ignores a quoted number)",
        "cfg.yaml: maxBatchDelay must be an integer, got float 1.5",
    ]
    assert error.problems == [p.text for p in findings.problems]
    assert error.fix == "write 8 without quotes"  # one problem has a fix: it is the error's


def test_several_fixes_are_joined_with_their_key_paths_and_none_gives_no_fix():
    findings = Findings()
    findings.check("4", "int", "batchSize")
    findings.problem("handler", "handler must be a mapping", fix="indent the handler's keys under it")
    with pytest.raises(ConfigError) as info:
        findings.raise_problems("cfg.yaml")
    assert info.value.fix == "batchSize: write 4 without quotes; handler: indent the handler's keys under it"
    bare = Findings()
    bare.check(None, "str", "name")
    with pytest.raises(ConfigError, match="name must be a string, got null") as info:
        bare.raise_problems("cfg.yaml")
    assert info.value.fix is None


# ---------------------------------------------------------------------------------------------
# read_yaml
# ---------------------------------------------------------------------------------------------


def test_read_yaml_loads_a_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("batchSize: 4\nhandler: {topk: 3}\n", encoding="utf-8")
    assert read_yaml(path, what="model config", missing_fix="x") == {"batchSize": 4, "handler": {"topk": 3}}
    (tmp_path / "empty.yaml").write_text("")
    assert read_yaml(tmp_path / "empty.yaml", what="model config", missing_fix="x") is None


def test_read_yaml_failures_say_which_file_where_and_the_fix(tmp_path):
    missing = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError, match=r"absent\.yaml: no such metrics config \(looked in /") as info:
        read_yaml(missing, what="metrics config", missing_fix="pass the path of a metrics YAML")
    assert info.value.fix == "pass the path of a metrics YAML"
    binary = tmp_path / "latin1.yaml"
    binary.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1\.yaml: the model config cannot be read: 'utf-8' codec") as info:
        read_yaml(binary, what="model config", missing_fix="x")
    assert info.value.fix == "make it a readable UTF-8 text file"
    with pytest.raises(ConfigError, match="the model config cannot be read"):
        read_yaml(tmp_path, what="model config", missing_fix="x")  # a folder: IsADirectoryError
    tabs = tmp_path / "tabs.yaml"
    tabs.write_text("handler:\n\ttopk: 3\n")
    with pytest.raises(ConfigError, match=r"tabs\.yaml, line 2, column 1: not valid YAML: ") as info:
        read_yaml(tabs, what="model config", missing_fix="x")
    assert info.value.fix.startswith("check the YAML near line 2: indent with spaces (not tabs)")
