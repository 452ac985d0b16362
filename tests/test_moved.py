"""The old import paths (:mod:`handlerkit._moved`): each works for one release, with a warning
naming the new place, and names nothing that still exists at the old place."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

from handlerkit import _moved

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "handlerkit"


def test_an_old_import_path_works_for_one_release_with_a_warning():
    """``from handlerkit.context import MockContext`` (before 0.2) still works and says where it went."""
    code = (
        "import warnings\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    from handlerkit.context import MockContext\n"
        "    import handlerkit.results as old\n"
        "import handlerkit.worker.context as new, handlerkit.recording.results as records\n"
        "print(MockContext is new.MockContext, old is records, new.__spec__.name)\n"
        "for w in caught: print(w.category.__name__, w.filename, w.message)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "True True handlerkit.worker.context"
    assert lines[1:] == [
        "DeprecationWarning <string> handlerkit: handlerkit.context moved to handlerkit.worker.context; "
        "import it from there (the old path goes in handlerkit 0.3)",
        "DeprecationWarning <string> handlerkit: handlerkit.results moved to handlerkit.recording.results; "
        "import it from there (the old path goes in handlerkit 0.3)",
    ]  # once each, pointing at the user's line, not at the import machinery
    gone = subprocess.run([sys.executable, "-c", "import handlerkit.nothing_here"], capture_output=True, text=True, cwd=str(ROOT))
    assert "No module named 'handlerkit.nothing_here'" in gone.stderr  # the finder answers for moved names only


def test_every_moved_name_points_to_a_module_and_is_gone_from_its_old_place():
    for old, new in _moved.MOVED.items():
        assert importlib.import_module(new).__spec__.name == new, old
        where = PACKAGE.joinpath(*old.split(".")[1:])
        assert not where.with_suffix(".py").exists() and not where.is_dir(), f"{old} still exists at {where}"
        assert new != old and new.startswith("handlerkit."), old


def test_the_finder_answers_for_moved_names_only_and_is_installed_once():
    finder = _moved.MovedModules()
    assert finder.find_spec("handlerkit.context").name == "handlerkit.context"
    assert finder.find_spec("handlerkit.worker.context") is None
    assert finder.find_spec("json") is None
    _moved.install()  # `import handlerkit` installed it already: a second call adds nothing
    assert sum(isinstance(f, _moved.MovedModules) for f in sys.meta_path) == 1
