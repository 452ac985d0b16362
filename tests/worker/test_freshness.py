"""The code on disk is the code that runs (issue 27): a model dir opened again after an edit runs
the edited code (``Harness.open``, ``Harness(spec, ctx)``, ``Service.open``, the pytest plugin),
a file that no longer compiles is a HandlerLoadError with its file, line and source,
``h.reload()`` runs the file as it is after any edit (same-size edits within the same second
included), a harness whose files changed says so once per change, and a handler that imports
TorchServe where it is not installed is told what to install or use instead.

On the new users' handlers (tests/_new_users.py) and the TorchServe-based tabular handler.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
import time
import warnings
from pathlib import Path

import pytest
from _new_users import audio_dir, char_stream_dir, ranker_dir, ranker_request, wav_bytes
from _tabular import FEATURES, tabular_dir

import handlerkit as hk
from handlerkit.errors import HandlerkitWarning, HandlerLoadError
from handlerkit.recording.spy import own_class
from handlerkit.worker import freshness, isolation

pytestmark = pytest.mark.usefixtures("restores_imports")
pytest_plugins = ["pytester"]

RANKED = [hk.Request.json(ranker_request(3, [5, 17, 2]))]
SCORE = '"score": round(score, 4)'  # in the ranker's postprocess


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new))


def answer(opener: str, model_dir: Path, batch: list) -> list:
    """What the handler answers, opened the way ``opener`` names."""
    if opener == "Service.open":
        with hk.Service.open(model_dir) as service:
            service.initialize()
            return service.handle(batch)
    if opener == "Harness.open":
        return hk.Harness.open(model_dir).run(batch).output
    return hk.Harness("handler.py", hk.MockContext.from_model_dir(model_dir)).run(batch).output


OPENERS = ("Harness.open", "Harness(spec, ctx)", "Service.open")


# ---------------------------------------------------------------------------- opening again


BASES = [pytest.param("torchserve", marks=pytest.mark.torchserve), "handlerkit"]


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("opener", OPENERS)
def test_opening_a_model_dir_again_after_an_edit_runs_the_edited_handler(tmp_path, opener, base):
    model_dir = ranker_dir(tmp_path / "recs", base=base)
    first = answer(opener, model_dir, RANKED)
    assert [set(item) for item in first[0]] == [{"item_id", "score"}] * 3
    edit(model_dir / "handler.py", SCORE, f'{SCORE}, "edited": True')
    again = answer(opener, model_dir, RANKED)
    assert [item["edited"] for item in again[0]] == [True] * 3
    assert [item["item_id"] for item in again[0]] == [item["item_id"] for item in first[0]]


@pytest.mark.parametrize("opener", OPENERS)
def test_a_syntax_error_on_opening_again_names_file_line_and_source_and_the_fix_opens(tmp_path, opener):
    model_dir = ranker_dir(tmp_path / "recs", base="handlerkit")
    answer(opener, model_dir, RANKED)  # the dir's modules are cached now
    handler = model_dir / "handler.py"
    line = handler.read_text().splitlines().index("    def postprocess(self, outputs):") + 1
    edit(handler, "def postprocess(self, outputs):", "def postprocess(self, outputs)")
    with pytest.raises(HandlerLoadError) as info:
        answer(opener, model_dir, RANKED)
    real = os.path.realpath(handler)
    assert re.search(
        rf"failed: SyntaxError: expected ':' \(handler\.py, line {line}\)\n"
        rf"  at {re.escape(real)}:{line}: def postprocess\(self, outputs\)\n",
        str(info.value),
    ), str(info.value)
    assert info.value.fix == f"correct handler.py line {line}: Python cannot compile it"
    assert isinstance(info.value.__cause__, SyntaxError)
    edit(handler, "def postprocess(self, outputs)", "def postprocess(self, outputs):")
    edit(handler, SCORE, f'{SCORE}, "fixed": 1')
    assert [item["fixed"] for item in answer(opener, model_dir, RANKED)[0]] == [1, 1, 1]


def test_a_syntax_error_in_a_module_the_handler_imports_points_at_that_module(tmp_path):
    model_dir = audio_dir(tmp_path / "sounds", base="handlerkit")
    (model_dir / "spectra.py").write_text("HOP = 128\n")
    edit(model_dir / "handler.py", "import torch\n", "import torch\nfrom spectra import HOP\n")
    edit(model_dir / "handler.py", "hop_length=128", "hop_length=HOP")
    sound = [hk.Request.from_bytes(wav_bytes(440.0))]
    assert len(hk.Harness.open(model_dir).run(sound).output) == 1
    (model_dir / "spectra.py").write_text("HOP = 128 +\n")
    with pytest.raises(HandlerLoadError, match=r"spectra\.py:1: HOP = 128 \+\n") as info:
        hk.Harness.open(model_dir)
    assert info.value.fix == "correct spectra.py line 1: Python cannot compile it"


@pytest.mark.parametrize("base", BASES)
def test_an_edit_to_model_py_alone_is_seen_on_opening_again(tmp_path, base):
    """TorchServe's BaseHandler imports model.py by name (the dir's cached module, unless it
    changed); handlerkit's loads it by path afresh on every initialize."""
    model_dir = ranker_dir(tmp_path / "recs", base=base)
    h = hk.Harness.open(model_dir)
    scores = [item["score"] for item in h.run(RANKED).output[0]]
    edit(model_dir / "model.py", "return scores.masked_fill", "return (2 * scores).masked_fill")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        doubled = [item["score"] for item in hk.Harness.open(model_dir).run(RANKED).output[0]]
    assert doubled == pytest.approx([2 * s for s in scores], abs=2e-4)
    assert changed_warnings(record) == []  # the new harness runs the file as it is: nothing to tell


@pytest.mark.torchserve
def test_a_torchserve_handler_importing_model_py_sees_its_edit_on_opening_again(tmp_path):
    """The dir's modules that import a changed one run again too (its whole cache is forgotten)."""
    model_dir = audio_dir(tmp_path / "sounds")  # TorchServe's BaseHandler imports model.py by name
    (model_dir / "labels.py").write_text("SCALE = 1.0\n")
    edit(model_dir / "handler.py", "import torch\n", "import torch\nimport labels\n")
    edit(model_dir / "handler.py", "softmax(scores,", "softmax(scores * labels.SCALE,")
    sound = [hk.Request.from_bytes(wav_bytes(440.0))]
    before = hk.Harness.open(model_dir).run(sound).output[0]
    (model_dir / "labels.py").write_text("SCALE = 0.0\n")  # every class equally likely
    after = hk.Harness.open(model_dir).run(sound).output[0]
    assert after == {label: round(1 / 3, 4) for label in before} != before


def test_an_unchanged_dir_opened_again_reuses_its_modules(tmp_path):
    model_dir = ranker_dir(tmp_path / "recs", base="handlerkit")
    first, second = hk.Harness.open(model_dir), hk.Harness.open(model_dir)
    assert type(first.handler).__mro__[1] is type(second.handler).__mro__[1]  # the user's class, once


def test_the_pytest_plugin_runs_the_handler_as_it_is_now(pytester: pytest.Pytester, tmp_path):
    model_dir = ranker_dir(tmp_path / "recs", base="handlerkit")
    pytester.makeini(f"[pytest]\nhk_model_dir = {model_dir}\n")
    pytester.makepyfile(
        test_user="""
        import json, os
        import handlerkit as hk

        def test_ranks(hk_harness):
            out = hk_harness().run([hk.Request.json({"user_id": 3, "item_ids": [5, 17]})]).output
            assert out[0][0].get("version") == int(os.environ["EXPECTED_VERSION"])
        """
    )
    edit(model_dir / "handler.py", SCORE, f'{SCORE}, "version": 1')
    os.environ["EXPECTED_VERSION"] = "1"
    try:
        pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
        edit(model_dir / "handler.py", '"version": 1', '"version": 2')
        os.environ["EXPECTED_VERSION"] = "2"
        pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)  # same process
    finally:
        del os.environ["EXPECTED_VERSION"]


# ---------------------------------------------------------------------------- reload


def test_three_same_size_edits_in_place_within_the_same_second_each_reload(tmp_path):
    model_dir = ranker_dir(tmp_path / "recs", base="handlerkit")
    handler = model_dir / "handler.py"
    h = hk.Harness.open(model_dir)
    exact = [item["score"] for item in h.run(RANKED).output[0]]
    model = h.handler.model
    size, stamp = handler.stat().st_size, handler.stat().st_mtime_ns
    text = handler.read_text()
    for digits in (1, 2, 3):
        handler.write_text(text.replace(SCORE, f'"score": round(score, {digits})'))
        os.utime(handler, ns=(stamp, stamp))  # the same second, even the same clock tick
        assert handler.stat().st_size == size
        h.reload()
        assert [item["score"] for item in h.run(RANKED).output[0]] == [round(s, digits) for s in exact]
    assert h.handler.model is model  # only the handler changed: the loaded model stays


@pytest.mark.torchserve
def test_reload_of_a_torchserve_handler_loaded_from_a_spec_after_a_rewrite(tmp_path):
    model_dir = tabular_dir(tmp_path / "soil")  # TorchServe's BaseHandler
    handler = model_dir / "handler.py"
    edit(handler, "TabularHandler", "SoilHandler")
    h = hk.Harness("handler.py", hk.MockContext.from_model_dir(model_dir))
    rows = [hk.Request.json({"features": FEATURES})]
    label = h.run(rows).output[0]["label"]
    handler.write_text(handler.read_text())  # the same text, written again
    h.reload()
    assert h.run(rows).output[0]["label"] == label
    for offset in (100, 200, 300):
        edit(handler, '"label": int(i)', f'"label": int(i) + {offset}')
        h.reload()
        assert h.run(rows).output[0]["label"] == label + offset
        edit(handler, f'"label": int(i) + {offset}', '"label": int(i)')
    assert type(h.handler).__name__ == "SoilHandler"


def test_reload_sees_an_edit_to_model_py_and_initializes_again(tmp_path):
    model_dir = ranker_dir(tmp_path / "recs", base="handlerkit")
    h = hk.Harness.open(model_dir)
    scores = [item["score"] for item in h.run(RANKED).output[0]]
    edit(model_dir / "model.py", "return scores.masked_fill", "return (2 * scores).masked_fill")
    h.reload()  # what initialize built came from the old model.py
    doubled = [item["score"] for item in h.run(RANKED).output[0]]
    assert doubled == pytest.approx([2 * s for s in scores], abs=2e-4)


def test_reload_without_an_edit_runs_the_file_again(tmp_path):
    model_dir = ranker_dir(tmp_path / "recs", base="handlerkit")
    (model_dir / "handler.py").write_text(
        (model_dir / "handler.py").read_text() + "\nLOADS = globals().get('LOADS', 0) + 1\n"
    )
    h = hk.Harness.open(model_dir)
    h.run(RANKED)
    model = h.handler.model
    classes = [own_class(h.handler)]
    for _ in range(2):
        h.reload()
        classes.append(own_class(h.handler))
    assert len(set(classes)) == 3  # executed afresh each time, into a fresh module
    assert [inspect.unwrap(c.preprocess).__globals__["LOADS"] for c in classes] == [1, 1, 1]
    assert sys.modules.get("handler") is None  # the dir's module lives in the dir's cache only
    assert h.handler.model is model


# ---------------------------------------------------------------------------- the change warning


def changed_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [
        str(w.message) for w in record if "since it was loaded" in str(w.message) or "since they were" in str(w.message)
    ]


def test_a_harness_says_once_per_change_that_its_files_changed(tmp_path):
    model_dir = ranker_dir(tmp_path / "recs", base="handlerkit")
    handler = model_dir / "handler.py"
    h = hk.Harness.open(model_dir)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        h.run(RANKED)
        assert changed_warnings(record) == []
        edit(handler, SCORE, f'{SCORE}, "v": 2')
        h.run(RANKED)
        h.run(RANKED)
        h.preprocess(RANKED)
        h.inference()
        assert changed_warnings(record) == ["handlerkit: handler.py changed since it was loaded: h.reload() to run it"]
        assert [w.filename for w in record if "changed since" in str(w.message)] == [__file__]  # the user's line
        edit(handler, '"v": 2', '"v": 3')  # another change: told again, once
        h.run(RANKED)
        h.run(RANKED)
        assert len(changed_warnings(record)) == 2
        h.reload()
        assert [item["v"] for item in h.run(RANKED).output[0]] == [3, 3, 3]
        edit(model_dir / "model.py", "return scores", "return 1.0 * scores")
        (model_dir / "notes.py").write_text("# not imported by anything\n")
        h.run(RANKED)
        assert changed_warnings(record)[2:] == [
            "handlerkit: model.py changed since it was loaded: h.reload() to run it"
        ]
        edit(handler, '"v": 3', '"v": 4')
        edit(model_dir / "model.py", "return 1.0 * scores", "return 2.0 * scores")
        h.run(RANKED)
        assert changed_warnings(record)[3:] == [
            "handlerkit: handler.py and model.py changed since they were loaded: h.reload() to run them"
        ]
        h.reload()
        h.run(RANKED)
        assert len(changed_warnings(record)) == 4


@pytest.mark.torchserve
def test_the_change_warning_reaches_the_caller_of_stream(tmp_path):
    model_dir = char_stream_dir(tmp_path / "chars", base="handlerkit")
    h = hk.Harness.open(model_dir)
    list(h.stream([hk.Request.text("ab")]))
    edit(model_dir / "handler.py", "length = 8", "length = 3")
    with pytest.warns(HandlerkitWarning, match=r"^handlerkit: handler\.py changed since it was loaded") as record:
        chunks = list(h.stream([hk.Request.text("ab")]))
    assert len(chunks) == 8  # the code loaded runs until h.reload()
    assert [w.filename for w in record if "changed since" in str(w.message)] == [__file__]


def test_the_change_check_stats_each_file_per_run_reads_only_files_that_moved_and_a_diagnostic_looks_once(
    tmp_path, monkeypatch
):
    model_dir = ranker_dir(tmp_path / "recs", base="handlerkit")
    long_ago = time.time_ns() - 3600 * 10**9  # files modified now may change again unseen by a stat
    for file in model_dir.glob("*.py"):
        os.utime(file, ns=(long_ago, long_ago))
    h = hk.Harness.open(model_dir)
    h.run(RANKED)  # initialize loads model.py: both files are watched
    reads, stats = [], []
    real_read, real_stat = freshness.read_stamp, os.stat
    monkeypatch.setattr(freshness, "read_stamp", lambda f: reads.append(os.path.basename(f)) or real_read(f))

    def stat(path, *args, **kwargs):
        if str(path).endswith(".py") and str(path).startswith(str(model_dir)):  # (not the dir's listing)
            stats.append(path)
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(freshness.os, "stat", stat)
    h.run(RANKED)  # the run before read each file once: now a stat each, no read (mtime and size as seen)
    assert reads == [] and len(stats) == 2
    for _ in range(3):
        h.run(RANKED)
    assert len(stats) == 8 and reads == []
    h.time(RANKED, warmup=1, repeat=5)  # seven runs of its own: one look before them
    assert len(stats) == 10
    edit(model_dir / "handler.py", SCORE, f'{SCORE}, "v": 2')
    os.utime(model_dir / "handler.py", ns=(long_ago + 1, long_ago + 1))
    with pytest.warns(HandlerkitWarning, match="handler.py changed since"):
        h.run(RANKED)  # the very next run tells, however soon after the edit
    assert reads == ["handler.py"]  # the one whose mtime moved


# ---------------------------------------------------------------------------- TorchServe not installed


class _NoTorchServe:
    """A finder that says what Python says where TorchServe is not installed."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "ts":
            raise ModuleNotFoundError("No module named 'ts'", name="ts")
        return None


@pytest.fixture
def no_torchserve(monkeypatch):
    """``import ts`` fails as where TorchServe is not installed (its modules are put back after)."""
    for name in [n for n in sys.modules if n == "ts" or n.startswith("ts.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_NoTorchServe, *sys.meta_path])


TORCHSERVE_FIX = (
    "pip install torchserve==0.12.0 (the TorchServe handlerkit follows), or import handlerkit's own "
    "equivalents, which need no TorchServe: `from handlerkit.handlers import BaseHandler` for "
    "ts.torch_handler.base_handler.BaseHandler, and hk.send_intermediate_predict_response "
    "(`import handlerkit as hk`) for ts.handler_utils.utils.send_intermediate_predict_response"
)


def test_a_handler_importing_torchserve_where_it_is_not_installed_is_told_what_to_do(tmp_path, no_torchserve):
    model_dir = char_stream_dir(tmp_path / "chars", base="handlerkit")  # send_... from ts.handler_utils.utils
    with pytest.raises(HandlerLoadError) as info:
        hk.Harness.open(model_dir)
    message = str(info.value)
    assert "failed: ModuleNotFoundError: No module named 'ts'" in message
    assert f"\n  at {os.path.realpath(model_dir / 'handler.py')}:2: from ts.handler_utils.utils import " in message
    assert "TorchServe (the ts package) is not installed here" in message
    assert "would have" not in message  # no word of TorchServe's retry: under its worker ts is there
    assert info.value.fix == TORCHSERVE_FIX

    soil = tabular_dir(tmp_path / "soil")  # from ts.torch_handler.base_handler import BaseHandler
    with pytest.raises(HandlerLoadError, match=r"handler\.py:2: from ts\.torch_handler\.base_handler import") as info:
        hk.Harness("handler.py", hk.MockContext.from_model_dir(soil))
    assert info.value.fix == TORCHSERVE_FIX
    edit(soil / "handler.py", "from ts.torch_handler.base_handler import", "from handlerkit.handlers import")
    assert hk.Harness.open(soil).run([hk.Request.json({"features": FEATURES})]).output[0]["label"] in (0, 1, 2)


def test_a_file_loaded_by_path_importing_torchserve_is_told_the_same(tmp_path, no_torchserve):
    outside = tmp_path / "elsewhere" / "soil_handler.py"
    outside.parent.mkdir()
    outside.write_text("from ts.torch_handler.base_handler import BaseHandler\n")
    with pytest.raises(HandlerLoadError, match=r"soil_handler\.py:1: from ts\.torch_handler") as info:
        isolation.load_module_from_file(outside)
    assert info.value.fix == TORCHSERVE_FIX


# ---------------------------------------------------------------------------- the isolation underneath


def test_a_fresh_look_reads_files_a_trusted_block_does_not(tmp_path, monkeypatch):
    model_dir = ranker_dir(tmp_path / "recs", base="handlerkit")
    with isolation.model_dir_imports(model_dir):
        import model  # noqa: F401

    reads = []
    real_read = freshness.read_stamp
    monkeypatch.setattr(freshness, "read_stamp", lambda f: reads.append(f) or real_read(f))
    with isolation.model_dir_imports(model_dir, max_age=1.0):  # what every run enters
        pass
    assert reads == []
    with isolation.model_dir_imports(model_dir):  # open, initialize, reload
        pass
    assert reads == [os.path.realpath(model_dir / "model.py")]


def test_model_dir_files_never_run_from_a_stale_pyc(tmp_path):
    model_dir = ranker_dir(tmp_path / "recs", base="handlerkit")
    (model_dir / "version.py").write_text("V = 1\n")
    with isolation.model_dir_imports(model_dir):
        import version

        assert version.V == 1
    stamp = (model_dir / "version.py").stat().st_mtime_ns
    (model_dir / "version.py").write_text("V = 2\n")
    os.utime(model_dir / "version.py", ns=(stamp, stamp))
    with isolation.model_dir_imports(model_dir):
        import version

        assert version.V == 2
    assert not (model_dir / "__pycache__").exists()


def test_the_change_check_benchmark_times_every_variant_and_puts_things_back(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import change_check
    finally:
        sys.path.pop(0)
    from handlerkit import harness
    from handlerkit.recording import reload as reloading

    samples = change_check.measure(str(tabular_dir(tmp_path / "tabular", base="handlerkit")), rounds=2, block=3)
    assert set(samples) == set(change_check.VARIANTS) and all(len(v) == 2 for v in samples.values())
    assert harness.reloading is reloading
