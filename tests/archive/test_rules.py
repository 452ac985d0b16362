"""handlerkit.archive.rules: the rules an archive must keep, the ArchiveError that names the one
broken, the zip-bomb Limits, the manifest's checks, and the names never swept into an archive.
Archives crafted to break each rule are in tests/archive/test_read.py.
"""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path

import pytest
from _archives import GOOD_MANIFEST

from handlerkit.archive.rules import (
    MANIFEST,
    RULES,
    ArchiveError,
    Limits,
    Listing,
    handler_file,
    manifest_problems,
    name_problem,
    normalise,
    parse_manifest,
    secret_looking,
)
from handlerkit.errors import ModelLoadError


# ---------------------------------------------------------------------------------- names never swept in
@pytest.mark.parametrize("name", [".env", ".env.production", ".netrc", ".npmrc", ".pypirc", ".gitignore", "server.pem",
                                  "tls.KEY", "id_rsa", "id_ed25519.pub", "credentials.json", "store.p12", "cert.pfx",
                                  ".cache"])  # fmt: skip
def test_hidden_and_secret_looking_names(name: str) -> None:
    assert secret_looking(name)


@pytest.mark.parametrize("name", ["model.pt", "vocab.txt", "keys.json", "env.py", "index_to_name.json", "id.txt"])
def test_model_files_do_not_look_secret(name: str) -> None:
    assert secret_looking(name) is None


# ---------------------------------------------------------------------------------- entry names
@pytest.mark.parametrize(
    "name, rule",
    [("", "unsafe-name"), ("/", "unsafe-name"), ("a\x00b", "unsafe-name"), ("a\\b.py", "unsafe-name"),
     ("/etc/passwd", "absolute-path"), ("\\server\\x", "absolute-path"), ("C:/evil.py", "absolute-path"),
     ("c:evil.py", "absolute-path"), ("../evil.py", "zip-slip"), ("a/../../evil.py", "zip-slip"),
     ("..\\evil.py", "zip-slip"), ("a/b/..", "zip-slip")],
)  # fmt: skip
def test_unsafe_entry_names_break_a_rule(name: str, rule: str) -> None:
    found = name_problem(name)
    assert found is not None and found[0] == rule and found[0] in RULES


@pytest.mark.parametrize("name", ["handler.py", "a/b/c.txt", "dir/", "..data/x", "a..b", "./x.py", "MAR-INF/MANIFEST.json"])
def test_safe_entry_names_break_none(name: str) -> None:
    assert name_problem(name) is None


def test_names_are_normalised_to_their_path_in_the_model_dir() -> None:
    assert [normalise(n) for n in ("./a//b/./c.py", "dir/", "x")] == ["a/b/c.py", "dir", "x"]


# ---------------------------------------------------------------------------------- the manifest
def test_a_manifest_is_a_json_object_with_a_model_object(tmp_path: Path) -> None:
    assert parse_manifest(json.dumps(GOOD_MANIFEST).encode(), "x.mar's manifest") == GOOD_MANIFEST
    for data, message in ((b"{not json", "not valid JSON"), (b"\xff\xfe", "not valid JSON"),
                          (b"[1]", 'must be a JSON object with a "model" object'),
                          (b'{"model": "m"}', 'must be a JSON object with a "model" object')):  # fmt: skip
        with pytest.raises(ArchiveError, match=message) as info:
            parse_manifest(data, "x.mar's manifest", tmp_path / "x.mar")
        error = info.value
        assert (error.rule, error.member, error.path) == ("manifest-malformed", MANIFEST, str(tmp_path / "x.mar"))
        assert error.fix.startswith("rebuild it with handlerkit.archive.build")


@pytest.mark.parametrize(
    "handler, file",
    [("handler.py", "handler.py"), ("dir/h.py:fn", "h.py"), ("h:fn", None), ("image_classifier", None), (None, None), (3, None)],
)  # fmt: skip
def test_the_file_a_manifest_handler_names_for_sure(handler, file) -> None:
    assert handler_file(handler) == file


def test_manifest_problems_name_what_torchserve_refuses_and_the_files_it_lacks() -> None:
    assert manifest_problems(GOOD_MANIFEST, {"handler.py"}) == []
    bare = {"model": {"modelName": "m", "handler": "handler.py", "serializedFile": "Model.PT", "configFile": "../c.yaml",
                      "modelFile": 3}}  # fmt: skip
    problems = manifest_problems(bare, {"handler.py", "model.pt"})  # found case-insensitively, as on the disk it lands on
    assert [(rule, member) for rule, _, member in problems] == [
        ("manifest-malformed", MANIFEST), ("manifest-malformed", MANIFEST), ("manifest-malformed", MANIFEST)]
    assert problems[0][1].startswith(f"{MANIFEST} lacks runtime, archiverVersion, createdOn, model.modelVersion:")
    assert problems[1][1] == f"{MANIFEST} names modelFile 3: not a relative path in the archive"
    assert problems[2][1] == f"{MANIFEST} names configFile '../c.yaml': not a relative path in the archive"
    missing = manifest_problems({**GOOD_MANIFEST, "model": {**GOOD_MANIFEST["model"], "handler": "sub/h.py:fn"}}, set())
    assert missing == [("manifest-file-missing", f"{MANIFEST} names handler 'h.py' but the archive holds no such file", "h.py")]


# ---------------------------------------------------------------------------------- the error, the limits
def test_an_archive_error_carries_its_rule_and_every_problem_through_pickle_and_copy(tmp_path: Path) -> None:
    first = ArchiveError("'../a' climbs out", tmp_path / "x.mar", rule="zip-slip", member="../a", fix="rebuild it")
    second = ArchiveError("'l' is a link", tmp_path / "x.mar", rule="symlink", member="l")
    assert isinstance(first, ModelLoadError) and first.problems == [first] and first.path == str(tmp_path / "x.mar")
    listing = Listing(tmp_path / "x.mar", "zip", [], 0, problems=[first, second])
    with pytest.raises(ArchiveError) as info:
        listing.raise_problems()
    error = info.value
    assert error.message == "x.mar refused [zip-slip]: '../a' climbs out (and 1 more problem: see .problems)"
    assert (error.rule, error.member, error.fix, error.problems) == ("zip-slip", "../a", "rebuild it", [first, second])
    for twin in (pickle.loads(pickle.dumps(error)), copy.deepcopy(error)):
        assert (twin.message, twin.rule, twin.member, twin.fix) == (error.message, "zip-slip", "../a", "rebuild it")
        assert [p.rule for p in twin.problems] == ["zip-slip", "symlink"]
    Listing(tmp_path / "ok.mar", "zip", [], 0).raise_problems()  # nothing to raise


def test_the_limits_admit_real_models_and_are_frozen() -> None:
    limits = Limits()
    assert (limits.max_total_size, limits.max_ratio, limits.ratio_floor) == (64 << 30, 200.0, 1 << 20)
    assert (limits.max_entries, limits.max_manifest_size) == (100_000, 1 << 20)
    with pytest.raises(AttributeError):
        limits.max_ratio = 1e9  # type: ignore[misc]
    assert Limits(max_ratio=5000).max_ratio == 5000
