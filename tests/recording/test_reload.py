"""``Harness.reload``'s work (:mod:`handlerkit.recording.reload`): a handler's file executed
afresh, its old code kept when the new one fails; and the warning that a loaded file changed."""

from __future__ import annotations

import json
import sys
import types
import warnings
from pathlib import Path

import pytest

from handlerkit.errors import HandlerkitError, HandlerkitWarning, StageError
from handlerkit.recording.reload import reexecuted, warn_if_changed
from handlerkit.service import Service

HANDLER_PY = "def handle(data, context):\n    return ['{answer}' for _ in data or []]\n"


@pytest.fixture
def service(tmp_path):
    """A function handler's model dir, opened and initialized, as a Harness holds it."""
    (tmp_path / "m" / "MAR-INF").mkdir(parents=True)
    (tmp_path / "m" / "MAR-INF" / "MANIFEST.json").write_text(json.dumps({"model": {"modelName": "m", "handler": "handler.py"}}))
    (tmp_path / "m" / "handler.py").write_text(HANDLER_PY.format(answer="v1"))
    with Service.open(tmp_path / "m") as opened:
        opened.initialize()
        yield opened
    # reexecuted() called directly (not through a Harness's block) leaves the reloaded module in
    # sys.modules; take it out so later tests resolving "handler" do not find this one.
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


def test_a_changed_file_is_told_once_and_its_new_code_is_run(service):
    path = Path(service.model_dir) / "handler.py"
    old = service.module.handle
    path.write_text(HANDLER_PY.format(answer="version two"))
    with pytest.warns(HandlerkitWarning, match=r"^handlerkit: handler.py changed since it was loaded: h.reload\(\) to run it$"):
        warn_if_changed(service)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HandlerkitWarning)
        warn_if_changed(service)  # told once per change
    new, module, others_changed = reexecuted(old, "handle", service)
    assert new([{"body": b"x"}], None) == ["version two"] and old([{"body": b"x"}], None) == ["v1"]
    assert sys.modules[module.__name__] is module and not others_changed


def test_new_code_that_fails_or_no_longer_defines_the_handler_keeps_the_old(service):
    path = Path(service.model_dir) / "handler.py"
    old = service.module.handle
    path.write_text("def handle(data, context):\n    return [1 for _ in data or []\n")
    with pytest.raises(StageError, match=r"^reload of handler.py failed, handle keeps its previous code: SyntaxError: ") as info:
        reexecuted(old, "handle", service)
    assert info.value.fix == "SyntaxError was raised at handler.py line 2; correct it there, then h.reload() again"
    path.write_text("def handler(data, context):\n    return []\n")
    with pytest.raises(HandlerkitError, match=r"it no longer defines handle; the handler keeps its previous code") as info:
        reexecuted(old, "handle", service)
    assert info.value.fix == "define handle again in handler.py, or build a new Harness"
    assert service.module.handle is old


def test_a_handler_of_a_cell_or_of_the_script_being_run_cannot_be_reloaded():
    namespace: dict = {}
    exec(compile("def handle(data, context):\n    return data\n", "<ipython-input-4-0abc>", "exec"), namespace)
    with pytest.raises(HandlerkitError, match=r"^cannot reload handle: it is defined in a notebook cell \(Cell In\[4\]\)") as info:
        reexecuted(namespace["handle"], "handle", types.SimpleNamespace(module=None))
    assert info.value.fix == "edit and re-run the cell that defines handle, then build a new Harness from it: h = hk.Harness(handle, h.context)"

    def handle(data, context):
        return data

    handle.__module__ = "__main__"
    with pytest.raises(HandlerkitError, match=r"it is defined in the script being run \(__main__\)"):
        reexecuted(handle, "handle", types.SimpleNamespace(module=None))
