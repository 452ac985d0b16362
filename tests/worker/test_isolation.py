"""handlerkit.worker.isolation: each model dir's modules kept to itself, several model dirs in one process.

Inside ``model_dir_imports(dir)`` a bare ``import model`` gets that dir's ``model.py``, the same
module each time the dir is entered, and leaves ``sys.modules`` and ``sys.path`` as they were;
``load_module_from_file`` imports a dir's file under a name of its own; ``exec_source`` runs a
file's current source. Handler resolution on top of it is tested in test_loading.py.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pickle
import sys
import types
import warnings

import pytest
from _module_dirs import make_model_dir, write

from handlerkit.errors import HandlerkitWarning, HandlerLoadError
from handlerkit.worker import isolation
from handlerkit.worker.isolation import clear_module_cache, exec_source, load_module_from_file, model_dir_imports
from handlerkit.worker.loading import list_classes

pytestmark = pytest.mark.usefixtures("restores_imports")


# ------------------------------------------------------------------------------ model_dir_imports


def test_each_dir_gets_its_own_model(two_model_dirs):
    a, b = two_model_dirs
    assert "model" not in sys.modules
    with model_dir_imports(a) as resolved_dir:
        assert resolved_dir == str(a) and sys.path[0] == str(a)
        import model

        assert model.Model.VALUE == "A"
    assert "model" not in sys.modules and str(a) not in sys.path
    with model_dir_imports(b):
        import model

        assert model.Model.VALUE == "B"
    assert "model" not in sys.modules


def test_reentry_reuses_the_same_module_and_classes(two_model_dirs):
    a, b = two_model_dirs
    with model_dir_imports(a):
        first = importlib.import_module("model").Model
    with model_dir_imports(b):
        other = importlib.import_module("model").Model
    with model_dir_imports(a):
        again = importlib.import_module("model").Model
    assert first is again and first is not other


def test_nested_blocks(two_model_dirs):
    a, b = two_model_dirs
    with model_dir_imports(a):
        outer = importlib.import_module("model")
        with model_dir_imports(a):  # same dir: nothing changes
            assert importlib.import_module("model") is outer
        with model_dir_imports(b):
            assert importlib.import_module("model").Model.VALUE == "B"
            with model_dir_imports(a):
                assert importlib.import_module("model") is outer
            assert importlib.import_module("model").Model.VALUE == "B"
        assert sys.modules["model"] is outer and sys.path[0] == str(a)
    assert "model" not in sys.modules


def test_an_unrelated_module_of_the_same_name_survives(two_model_dirs, monkeypatch):
    a, _ = two_model_dirs
    unrelated = types.ModuleType("model")
    unrelated.Model = "unrelated"
    monkeypatch.setitem(sys.modules, "model", unrelated)
    with model_dir_imports(a):
        assert importlib.import_module("model").Model.VALUE == "A"
    assert sys.modules["model"] is unrelated


def test_state_is_restored_when_the_block_raises(two_model_dirs):
    a, _ = two_model_dirs
    with pytest.raises(ZeroDivisionError), model_dir_imports(a):
        importlib.import_module("model")
        1 / 0  # noqa: B018
    assert "model" not in sys.modules and str(a) not in sys.path


def test_module_imported_outside_a_block_stays(two_model_dirs, monkeypatch):
    a, b = two_model_dirs
    monkeypatch.syspath_prepend(str(a))
    import model as outside  # imported the ordinary way, e.g. by the notebook

    try:
        with model_dir_imports(a):
            assert importlib.import_module("model") is outside
        assert sys.modules["model"] is outside
        with model_dir_imports(b):
            assert importlib.import_module("model").Model.VALUE == "B"
        assert sys.modules["model"] is outside
    finally:
        sys.modules.pop("model", None)


def test_project_root_as_model_dir_keeps_global_packages(tmp_path, monkeypatch):
    # E.g. a notebook whose model dir is the project root, holding the project's own package.
    write(tmp_path, "projpkg/__init__.py", "")
    write(tmp_path, "projpkg/sub.py", "X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import projpkg

    try:
        with model_dir_imports(tmp_path):
            sub = importlib.import_module("projpkg.sub")
        assert sys.modules["projpkg"] is projpkg and sys.modules["projpkg.sub"] is sub
        clear_module_cache()
        assert sys.modules["projpkg"] is projpkg and sys.modules["projpkg.sub"] is sub
    finally:
        sys.modules.pop("projpkg.sub", None)
        sys.modules.pop("projpkg", None)


def test_nested_model_dirs_are_told_apart(tmp_path, monkeypatch):
    outer = make_model_dir(tmp_path, "R")
    inner = outer / "sub"
    inner.mkdir()
    write(inner, "model.py", "class Model:\n    VALUE = 'S'\n")
    monkeypatch.syspath_prepend(str(inner))
    import model as inner_model  # imported the ordinary way from the nested dir

    try:
        with model_dir_imports(outer):
            assert importlib.import_module("model").Model.VALUE == "R"
        assert sys.modules["model"] is inner_model
    finally:
        sys.modules.pop("model", None)


def test_new_files_are_seen_and_the_listing_is_cached(two_model_dirs, monkeypatch):
    a, _ = two_model_dirs
    with model_dir_imports(a):
        pass
    scans = []
    real_scandir = os.scandir
    monkeypatch.setattr(isolation.os, "scandir", lambda p: scans.append(p) or real_scandir(p))
    for _ in range(3):
        with model_dir_imports(a):
            pass
    assert scans == []  # the listing is reused while the dir's mtime is unchanged
    write(a, "extra_module.py", "WHO = 'A'\n")
    os.utime(a, ns=(0, os.stat(a).st_mtime_ns + 10**9))  # mtime granularity on some filesystems
    with model_dir_imports(a):
        assert importlib.import_module("extra_module").WHO == "A"
    # one scan on entry; one more on exit when the import wrote __pycache__/ into the dir
    assert 1 <= len(scans) <= 2
    assert "extra_module" not in sys.modules


def test_clear_module_cache_reimports(two_model_dirs):
    a, _ = two_model_dirs
    with model_dir_imports(a):
        first = importlib.import_module("model").Model
    clear_module_cache(a)
    with model_dir_imports(a):
        second = importlib.import_module("model").Model
    assert first is not second and second.VALUE == "A"


def test_stdlib_names_are_not_shadowed(tmp_path):
    import json

    write(tmp_path, "json.py", "BROKEN = True\n")
    with pytest.warns(HandlerkitWarning, match=r"'json' is already imported") as record:
        with model_dir_imports(tmp_path):
            assert importlib.import_module("json") is json
    assert record[0].filename == __file__
    assert sys.modules["json"] is json


def test_packages_in_the_model_dir_are_isolated(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    for directory, label in ((one, "1"), (two, "2")):
        write(directory, "helpers/__init__.py", "")
        write(directory, "helpers/values.py", f"LABEL = {label!r}\n")
    with model_dir_imports(one):
        assert importlib.import_module("helpers.values").LABEL == "1"
    with model_dir_imports(two):
        assert importlib.import_module("helpers.values").LABEL == "2"
    assert not [k for k in sys.modules if k == "helpers" or k.startswith("helpers.")]


def test_none_and_missing_dirs():
    with model_dir_imports(None) as directory:
        assert directory is None
    with pytest.raises(FileNotFoundError, match="does not exist"), model_dir_imports("/no/such/model/dir"):
        pass


def test_listing_is_trusted_for_max_age_seconds(two_model_dirs, monkeypatch):
    a, _ = two_model_dirs
    with model_dir_imports(a, max_age=60):
        pass  # lists the dir (or checks its mtime) and notes when
    stats = []
    real_stat = os.stat
    monkeypatch.setattr(isolation.os, "stat", lambda p, *args, **kw: stats.append(p) or real_stat(p, *args, **kw))
    write(a, "late_module.py", "WHO = 'late'\n")
    os.utime(a, ns=(0, real_stat(a).st_mtime_ns + 10**9))
    stats.clear()  # (os.stat is the process's: pathlib's mkdir called it)
    with model_dir_imports(a, max_age=60):
        assert stats == []  # trusted: no stat on entry...
    assert "late_module" not in sys.modules
    with model_dir_imports(a):  # ...while the default checks every time and sees the new file
        assert importlib.import_module("late_module").WHO == "late"
    assert stats and "late_module" not in sys.modules
    clock = [isolation.time.monotonic()]
    monkeypatch.setattr(isolation.time, "monotonic", lambda: clock[0])
    stats.clear()
    with model_dir_imports(a, max_age=60):
        pass
    assert stats == []
    clock[0] += 61  # once the age has passed, the mtime is checked again
    with model_dir_imports(a, max_age=60):
        pass
    assert len(stats) == 1


def test_leaving_a_block_lists_the_dir_only_when_something_was_imported(two_model_dirs, monkeypatch):
    a, _ = two_model_dirs
    with model_dir_imports(a):
        importlib.import_module("model")
    calls = []
    real_provided = isolation._provided
    monkeypatch.setattr(isolation, "_provided", lambda d, max_age=0.0: calls.append(max_age) or real_provided(d, max_age))
    with model_dir_imports(a):
        importlib.import_module("model")  # cached: sys.modules does not grow
    assert len(calls) == 1  # the entry only
    assert "model" not in sys.modules
    write(a, "fresh_module.py", "WHO = 'fresh'\n")
    os.utime(a, ns=(0, os.stat(a).st_mtime_ns + 10**9))
    calls.clear()
    with model_dir_imports(a):
        importlib.import_module("fresh_module")
    assert len(calls) == 2  # entry, and exit because a module was imported
    assert "fresh_module" not in sys.modules and "model" not in sys.modules


# ------------------------------------------------------------------------------ load_module_from_file


def test_load_module_from_file_gives_distinct_modules(two_model_dirs):
    a, b = two_model_dirs
    ma, mb = load_module_from_file(a / "model.py"), load_module_from_file(b / "model.py")
    assert ma is not mb and ma.__name__ != mb.__name__
    assert ma.__name__.startswith("handlerkit_modeldir_") and ma.__name__.endswith(".model")
    assert (ma.Model.VALUE, mb.Model.VALUE) == ("A", "B")
    assert ma.Model.__module__ == ma.__name__ and list_classes(ma) == [ma.Model]
    assert load_module_from_file(a / "model.py") is ma  # loaded once
    assert load_module_from_file(a / "model.py", reload=True) is not ma
    assert "model" not in sys.modules


def test_load_module_from_file_pickles_and_has_source(two_model_dirs):
    a, _ = two_model_dirs
    module = load_module_from_file(a / "model.py")
    instance = module.Model()
    assert type(pickle.loads(pickle.dumps(instance))) is module.Model
    assert "VALUE = 'A'" in inspect.getsource(module.Model)


def test_load_module_from_file_imports_its_own_siblings(two_model_dirs):
    a, b = two_model_dirs
    for directory, label in ((a, "A"), (b, "B")):
        write(directory, "net.py", "from model import Model\n\nclass Net(Model):\n    pass\n")
    na, nb = load_module_from_file(a / "net.py"), load_module_from_file(b / "net.py")
    assert (na.Net.VALUE, nb.Net.VALUE) == ("A", "B")
    assert [c.__name__ for c in list_classes(na)] == ["Net"]  # the imported Model does not count


def test_load_module_from_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_module_from_file(tmp_path / "absent.py")
    write(tmp_path, "broken.py", "import not_installed_for_handlerkit\n")
    with pytest.raises(HandlerLoadError, match=r"broken\.py failed: ModuleNotFoundError: No module named 'not_installed_for_handlerkit'\n"
                       r"  at .*broken\.py:1: import not_installed_for_handlerkit\n  fix: ") as info:
        load_module_from_file(tmp_path / "broken.py")
    assert isinstance(info.value.__cause__, ModuleNotFoundError)
    assert info.value.fix == f"correct broken.py (it runs with {os.path.realpath(tmp_path)} first on sys.path)"
    assert not [k for k in sys.modules if k.endswith(".broken")]


def test_exec_source_runs_the_files_current_source_never_its_bytecode(two_model_dirs):
    """A file rewritten within the same second to the same size: a .pyc would still match it."""
    a, _ = two_model_dirs
    write(a, "labels.py", "NAME = 'one'\n")
    module = load_module_from_file(a / "labels.py")
    stamp = os.stat(a / "labels.py").st_mtime_ns
    write(a, "labels.py", "NAME = 'two'\n")
    os.utime(a / "labels.py", ns=(stamp, stamp))
    assert module.NAME == "one"
    exec_source(module, str(a / "labels.py"))
    assert module.NAME == "two"
    (a / "labels.py").write_bytes("# -*- coding: latin-1 -*-\nNAME = 'caf\u00e9'\n".encode("latin-1"))
    exec_source(module, str(a / "labels.py"))
    assert module.NAME == "caf\u00e9"  # the file's declared encoding, as an import reads it


# ------------------------------------------------------------------------------ TorchServe's own code


@pytest.mark.torchserve
def test_torchserve_load_pickled_model_gets_each_dirs_class(two_model_dirs):
    pytest.importorskip("ts")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from ts.torch_handler.base_handler import BaseHandler

    a, b = two_model_dirs
    for directory, label in ((a, "A"), (b, "B"), (a, "A")):
        with model_dir_imports(directory):
            model = BaseHandler()._load_pickled_model(str(directory), "model.py", None)
        assert type(model).VALUE == label
    with model_dir_imports(a):
        first = BaseHandler()._load_pickled_model(str(a), "model.py", None)
        second = BaseHandler()._load_pickled_model(str(a), "model.py", None)
    assert type(first) is type(second)
    assert "model" not in sys.modules
