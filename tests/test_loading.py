"""handlerkit.loading: TorchServe 0.12's handler resolution, and per-model-dir imports."""

from __future__ import annotations

import importlib
import inspect
import os
import pickle
import sys
import textwrap
import types
import warnings

import pytest

from handlerkit import isolation, loading
from handlerkit._text import did_you_mean
from handlerkit.errors import HandlerkitWarning, HandlerLoadError
from handlerkit.loading import (
    ResolvedHandler,
    clear_module_cache,
    list_classes,
    load_module_from_file,
    model_dir_imports,
    resolve_handler,
)

CLASS_HANDLER = """
    import model

    class Handler:
        def __init__(self):
            self.context = None

        def initialize(self, context):
            self.context = context

        def handle(self, data, context):
            import model as lazily_imported  # resolved at call time, as in TorchServe
            return [model.Model.VALUE, lazily_imported.Model.VALUE]
"""


def write(directory, name: str, text: str):
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def make_model_dir(root, label: str):
    """A model dir with model.py (one class whose VALUE is `label`) and handler.py."""
    directory = root / f"dir_{label}"
    directory.mkdir()
    write(directory, "model.py", f"class Model:\n    VALUE = {label!r}\n")
    write(directory, "handler.py", CLASS_HANDLER)
    return directory


def call(resolved, data, context):
    """The resolved entry point called within its model dir's imports (as Service runs it)."""
    with model_dir_imports(resolved.model_dir):
        return resolved.function(data, context)


def initialize(resolved, context):
    """TorchServe's initialisation of a resolved handler (Service.initialize's rule)."""
    with model_dir_imports(resolved.model_dir):
        if resolved.kind == "function":
            resolved.function(None, context)
        elif hasattr(resolved.instance, "initialize"):
            resolved.instance.initialize(context)


class FakeContext:
    def __init__(self, model_dir=None):
        self.system_properties = {"model_dir": str(model_dir) if model_dir else None, "gpu_id": None}
        self.manifest = {"model": {}}


@pytest.fixture(autouse=True)
def _clean_state():
    path_before = list(sys.path)
    yield
    clear_module_cache()
    assert sys.path == path_before
    assert not isolation._active


@pytest.fixture
def dirs(tmp_path):
    return make_model_dir(tmp_path, "A"), make_model_dir(tmp_path, "B")


# ------------------------------------------------------------------------------ spec forms


@pytest.mark.parametrize("spec", ["handler", "handler.py", "handler:handle_missing_is_error"])
def test_name_forms_resolve_in_the_model_dir(dirs, spec):
    a, _ = dirs
    if spec.endswith("missing_is_error"):
        with pytest.raises(HandlerLoadError, match=r"has no function 'handle_missing_is_error'.*silently fall back") as info:
            resolve_handler(spec, a)
        assert info.value.fix == "correct the name after ':', or drop ':handle_missing_is_error' to use the class"
        return
    resolved = resolve_handler(spec, a)
    assert isinstance(resolved, ResolvedHandler)
    assert resolved.kind == "class" and resolved.cls.__name__ == "Handler"
    assert resolved.function == resolved.instance.handle and resolved.function_name == "handle"
    assert resolved.module_file == str(a / "handler.py") and resolved.model_dir == str(a)
    assert resolved.origin == "model_dir"
    assert call(resolved, [{}], None) == ["A", "A"]
    assert "handler" not in sys.modules and "model" not in sys.modules


def test_absolute_and_relative_paths(dirs, tmp_path, monkeypatch):
    a, b = dirs
    resolved = resolve_handler(str(a / "handler.py"))  # no model dir: the file's own dir
    assert resolved.model_dir == str(a) and call(resolved, [{}], None) == ["A", "A"]
    monkeypatch.chdir(tmp_path)
    resolved = resolve_handler("dir_B/handler.py")
    assert resolved.model_dir == str(b) and call(resolved, [{}], None) == ["B", "B"]
    # A path under the model dir, and TorchServe's basename rule ("src/handler.py" archived flat).
    write(a, "sub/other.py", "def handle(data, context):\n    return ['sub']\n")
    assert resolve_handler("sub/other.py", a).function([{}], None) == ["sub"]
    assert call(resolve_handler("elsewhere/handler.py", a), [{}], None) == ["A", "A"]


def test_file_outside_the_model_dir_runs_in_the_model_dirs_imports(dirs, tmp_path):
    a, _ = dirs
    outside = write(tmp_path / "src", "my_handler.py", CLASS_HANDLER)
    resolved = resolve_handler(str(outside), a)
    assert resolved.origin == "file" and resolved.model_dir == str(a)
    assert call(resolved, [{}], None) == ["A", "A"]  # `import model` found the model dir's file


def test_missing_file_lists_where_it_looked(dirs):
    a, _ = dirs
    with pytest.raises(HandlerLoadError, match=r"no such file\. Looked for:\n  - .*nope\.py") as info:
        resolve_handler("nope.py", a)
    assert info.value.message.endswith("nope.py")  # the listing ends the message; the fix is apart
    assert info.value.fix == "check the path (relative paths are tried in the model dir, then in the current directory)"
    assert str(info.value).endswith("\n  fix: " + info.value.fix)


def test_function_handler_and_named_function(tmp_path):
    write(
        tmp_path,
        "fn_handler.py",
        """
        calls = []

        def handle(data, context):
            calls.append((data, context))
            return None if data is None else [len(data)]

        def custom(data, context):
            calls.append(("custom", data, context))
            return ["custom"] * len(data or [])

        class Helper:  # ignored: a function entry point wins, as in TorchServe
            pass
        """,
    )
    ctx = FakeContext(tmp_path)
    resolved = resolve_handler("fn_handler", tmp_path)
    assert resolved.kind == "function" and resolved.cls is None and resolved.instance is None
    initialize(resolved, ctx)
    assert resolved.module.calls == [(None, ctx)]  # TorchServe initialises with handle(None, context)
    assert call(resolved, [1, 2], ctx) == [2]

    for spec in ("fn_handler.py:custom", "fn_handler:custom"):
        named = resolve_handler(spec, tmp_path)
        assert named.function_name == "custom" and named.function.__name__ == "custom"
    assert named.module is resolved.module  # the dir's module cache: same module object


def test_class_handler_initialize(dirs):
    a, _ = dirs
    ctx = FakeContext(a)
    resolved = resolve_handler("handler", a)
    assert resolved.instance.context is None  # instantiated, not initialised
    initialize(resolved, ctx)
    assert resolved.instance.context is ctx
    assert "Handler" in repr(resolved) and "origin='model_dir'" in repr(resolved)


def test_class_without_initialize_warns(tmp_path):
    write(tmp_path, "bare.py", "class Bare:\n    def handle(self, data, context):\n        return data\n")
    with pytest.warns(HandlerkitWarning, match=r"Bare has no initialize method; TorchServe 0\.12 fails") as record:
        resolved = resolve_handler("bare", tmp_path)
    assert record[0].filename == __file__  # the warning points at the caller, not into handlerkit
    initialize(resolved, FakeContext())  # skipped quietly


def test_dotted_module_path_in_model_dir(tmp_path):
    write(tmp_path, "pkg/__init__.py", "")
    write(tmp_path, "pkg/handlers.py", "def handle(data, context):\n    return ['pkg']\n")
    resolved = resolve_handler("pkg.handlers", tmp_path)
    assert resolved.origin == "model_dir" and call(resolved, [{}], None) == ["pkg"]
    assert "pkg" not in sys.modules and "pkg.handlers" not in sys.modules


def test_torchserve_dotted_spec():
    pytest.importorskip("ts")
    resolved = resolve_handler("ts.torch_handler.base_handler")
    assert resolved.kind == "class" and resolved.cls.__name__ == "BaseHandler"
    assert resolved.cls.__module__ == "ts.torch_handler.base_handler"
    assert resolved.origin == "torchserve"
    resolved = resolve_handler("ts.torch_handler.image_classifier")
    assert resolved.cls.__name__ == "ImageClassifier"  # VisionHandler is imported, so not counted


# ------------------------------------------------------------------------------ TorchServe's rules


def test_several_classes_error_lists_them(tmp_path):
    write(tmp_path, "multi.py", "class B:\n    pass\nclass A:\n    def handle(self, d, c):\n        pass\n")
    with pytest.raises(HandlerLoadError) as info:
        resolve_handler("multi.py", tmp_path)
    assert "defines 2 classes (A, B) and no function 'handle'" in info.value.message
    assert info.value.fix == "keep one class in the module (move helpers to another file) or name the function: 'multi.py:handle'"
    assert isinstance(info.value, ImportError)


def test_no_class_error_explains_imported_classes(tmp_path):
    write(tmp_path, "empty_handler.py", "X = 1\n")
    with pytest.raises(HandlerLoadError, match=r"defines no class and no function 'handle'.*handle\(data, context\)\n  fix: define a handler class") as info:
        resolve_handler("empty_handler", tmp_path)
    assert info.value.fix == "define a handler class (e.g. subclass handlerkit.BaseHandler) or def handle(data, context): ..."
    write(tmp_path, "reexport.py", "from bare_base import Base\n")
    write(tmp_path, "bare_base.py", "class Base:\n    def handle(self, d, c):\n        return d\n")
    with pytest.raises(HandlerLoadError, match=r"it imports Base, but classes imported from elsewhere do not count") as info:
        resolve_handler("reexport", tmp_path)
    assert info.value.fix == "subclass it in the module: class MyHandler(Base): pass"


def test_class_without_handle_is_an_error(tmp_path):
    write(tmp_path, "nohandle.py", "class Thing:\n    def initialize(self, ctx):\n        pass\n")
    with pytest.raises(HandlerLoadError, match=r"class Thing in module nohandle .* has no handle method") as info:
        resolve_handler("nohandle", tmp_path)
    assert info.value.fix.startswith("subclass handlerkit.BaseHandler (or TorchServe's)")


def test_constructor_with_arguments_is_an_error(tmp_path):
    write(tmp_path, "needs_args.py", "class H:\n    def __init__(self, x):\n        pass\n    def handle(self, d, c):\n        pass\n")
    with pytest.raises(HandlerLoadError, match=r"TorchServe builds the handler with H\(\) \(no arguments\), and that raised TypeError") as info:
        resolve_handler("needs_args", tmp_path)
    assert isinstance(info.value.__cause__, TypeError)
    assert info.value.fix == "give every __init__ argument a default, or move the setup into initialize(self, context)"


def test_build_makes_the_instance(dirs):
    a, _ = dirs
    built = []

    def build(cls):
        import model  # build runs within the model dir's imports, as cls() does

        built.append((cls, model.Model.VALUE))
        instance = cls.__new__(cls)
        instance.instrumented = True  # what the Harness does: before __init__ runs
        cls.__init__(instance)
        return instance

    resolved = resolve_handler("handler", a, build=build)
    assert [(c.__name__, value) for c, value in built] == [("Handler", "A")]
    assert built[0][0] is resolved.cls
    assert resolved.instance.instrumented is True and resolved.instance.context is None
    assert resolved.function == resolved.instance.handle
    assert call(resolved, [{}], None) == ["A", "A"]


def test_an_exception_from_build_is_wrapped_like_one_from_the_class(dirs):
    a, _ = dirs

    def build(cls):
        raise RuntimeError("instrumentation failed")

    with pytest.raises(HandlerLoadError, match=r"with Handler\(\) \(no arguments\), and that raised RuntimeError: instrumentation failed\n  fix: ") as info:
        resolve_handler("handler", a, build=build)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert info.value.fix.startswith("give every __init__ argument a default")


def test_handle_that_is_not_callable(tmp_path):
    write(tmp_path, "weird.py", "handle = 3\n")
    with pytest.raises(HandlerLoadError, match=r"has handle = int, not a function; TorchServe calls handle\(data, context\)\n  fix: ") as info:
        resolve_handler("weird", tmp_path)
    assert info.value.fix == "define def handle(data, context): ..."


def test_list_classes_is_torchserves_rule(tmp_path):
    write(tmp_path, "mod_with_import.py", "from collections import OrderedDict\nclass Z:\n    pass\nclass Y(OrderedDict):\n    pass\n")
    module = load_module_from_file(tmp_path / "mod_with_import.py")
    assert [c.__name__ for c in list_classes(module)] == ["Y", "Z"]
    assert [c.__name__ for c in list_classes(module, dict)] == ["Y"]


# ------------------------------------------------------------------------------ errors TorchServe hides


def test_real_import_error_is_surfaced(tmp_path):
    path = write(tmp_path, "handler.py", "import missing_pkg_for_handlerkit_test\n\ndef handle(d, c):\n    return d\n")
    with pytest.raises(HandlerLoadError) as info:
        resolve_handler("handler", tmp_path)
    message = info.value.message
    assert str(path) in message
    assert "ModuleNotFoundError: No module named 'missing_pkg_for_handlerkit_test'" in message
    assert "TorchServe 0.12 would have hidden this error behind \"No module named 'ts.torch_handler.handler'\"" in message
    assert info.value.fix.startswith("if 'missing_pkg_for_handlerkit_test' is a package, pip install it")
    assert "--extra-files" in info.value.fix
    assert isinstance(info.value.__cause__, ModuleNotFoundError)
    assert "handler" not in sys.modules


def test_import_error_in_a_name_torchserve_ships_would_load_its_own(tmp_path):
    # The retry of "image_classifier" succeeds in TorchServe: no error to hide, the built-in served.
    write(tmp_path, "image_classifier.py", "from nowhere_for_handlerkit import thing\n")
    with pytest.raises(HandlerLoadError) as info:
        resolve_handler("image_classifier", tmp_path)
    assert info.value.message.splitlines()[-1] == (
        "TorchServe 0.12 would have silently served its own ts.torch_handler.image_classifier instead "
        "(when a handler fails to import it retries the name as one of its built-in handlers), so this "
        "error would never have shown"
    )
    assert "hidden" not in info.value.message


@pytest.mark.torchserve
@pytest.mark.parametrize(
    "spec",
    ["image_classifier", "image_classifier.py", "image_classifier.py:handle", "image_classifier:handle", "handler",
     "handler.py", "handler.py:handle", "request_envelope.py"],
)
def test_the_hidden_error_is_the_one_torchserve_raises(tmp_path, spec):
    # ts.model_loader retries importlib.import_module("." + spec, "ts.torch_handler").
    module = spec.split(":")[0].removesuffix(".py")
    write(tmp_path, f"{module}.py", "import nowhere_for_handlerkit_retry\n\ndef handle(d, c):\n    return d\n")
    try:
        importlib.import_module("." + spec, "ts.torch_handler")
        theirs = None
    except ModuleNotFoundError as exc:
        theirs = str(exc)
    with pytest.raises(HandlerLoadError) as info:
        resolve_handler(spec, tmp_path)
    if theirs is None:
        assert f"would have silently served its own ts.torch_handler.{spec} instead" in info.value.message
    else:
        assert f'TorchServe 0.12 would have hidden this error behind "{theirs}" (when a handler fails' in info.value.message
        assert "silently served" not in info.value.message


def test_the_hidden_error_is_known_without_torchserve_installed(monkeypatch):
    # A server always has its built-ins, even where torchserve is not installed here.
    monkeypatch.setattr(loading, "_torchserve_builtin_names", lambda: ())
    assert loading._torchserve_retry_error("image_classifier") is None
    assert loading._torchserve_retry_error("image_classifier.py") == (
        "No module named 'ts.torch_handler.image_classifier.py'; 'ts.torch_handler.image_classifier' is not a package"
    )
    assert loading._torchserve_retry_error("mine.py") == "No module named 'ts.torch_handler.mine'"


def test_other_import_time_exception_is_surfaced_without_the_ts_note(tmp_path):
    write(tmp_path, "boom.py", "raise RuntimeError('bad config at import')\n")
    with pytest.raises(HandlerLoadError, match=r"importing module 'boom' \(.*boom\.py\) failed: RuntimeError: bad config at import") as info:
        resolve_handler("boom.py", tmp_path)
    assert "would have hidden" not in str(info.value)  # TorchServe only swallows ImportError
    assert isinstance(info.value.__cause__, RuntimeError)
    assert info.value.fix.startswith("correct ") and info.value.fix.endswith("boom.py: importing it raises the RuntimeError above")


def test_not_found_lists_where_it_looked(tmp_path):
    with pytest.raises(HandlerLoadError) as info:
        resolve_handler("no_such_handler_anywhere", tmp_path)
    message = info.value.message
    assert message.startswith("handler 'no_such_handler_anywhere' not found. Looked for:\n")
    assert f"module 'no_such_handler_anywhere' in the model dir {os.path.realpath(tmp_path)}" in message
    assert "handlerkit.handlers.no_such_handler_anywhere" in message
    assert "ts.torch_handler.no_such_handler_anywhere" in message or "torchserve is not installed" in message
    assert info.value.fix == (
        "check the spelling, or put no_such_handler_anywhere.py in the model dir "
        "(torch-model-archiver --handler no_such_handler_anywhere.py)"
    )


def test_not_found_suggests_a_near_name(tmp_path):
    write(tmp_path, "my_handler.py", "def handle(d, c):\n    return d\n")
    with pytest.raises(HandlerLoadError, match=r"^handler 'my_handlr' not found \(did you mean 'my_handler'\?\)\. Looked for") as info:
        resolve_handler("my_handlr", tmp_path)
    assert info.value.fix.startswith("write 'my_handler' if that is the one; otherwise put my_handlr.py in the model dir")
    # One "did you mean" for the whole package: loading uses handlerkit._text's.
    from handlerkit import loading

    assert not hasattr(loading, "_nearest") and loading.did_you_mean is did_you_mean
    with pytest.raises(HandlerLoadError, match=r"did you mean 'my_handler'\?"):  # case and '_' are ignored
        resolve_handler("MyHandler", tmp_path)


def test_bad_specs():
    with pytest.raises(TypeError):
        resolve_handler(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty"):
        resolve_handler("  ")
    with pytest.raises(HandlerLoadError, match=r"'my-handler' is not a module name\n  fix: ") as info:
        resolve_handler("my-handler")
    assert info.value.fix.startswith("write name, name.py, path/to/name.py, file.py:function or a dotted module path")


# ------------------------------------------------------------------------------ built-ins


def _fake_module(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(textwrap.dedent(source), f"<{name}>", "exec"), module.__dict__)
    return module


def test_builtin_fallback_to_handlerkit_handlers(tmp_path, monkeypatch):
    fake = _fake_module(
        "handlerkit.handlers._test_builtin",
        "class FakeBuiltin:\n    def initialize(self, ctx):\n        pass\n    def handle(self, d, c):\n        return ['builtin']\n",
    )
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    resolved = resolve_handler("_test_builtin", tmp_path)
    assert resolved.origin == "handlerkit" and resolved.module is fake
    assert call(resolved, [{}], None) == ["builtin"]


def test_model_dir_module_beats_the_builtin(tmp_path, monkeypatch):
    fake = _fake_module("handlerkit.handlers._test_builtin", "def handle(d, c):\n    return ['builtin']\n")
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    write(tmp_path, "_test_builtin.py", "def handle(d, c):\n    return ['mine']\n")
    assert call(resolve_handler("_test_builtin", tmp_path), [{}], None) == ["mine"]


def test_builtin_fallback_to_torchserve_when_handlerkit_has_none(tmp_path):
    pytest.importorskip("ts")
    resolved = resolve_handler("base_handler", tmp_path)  # handlerkit's is handlers/base.py
    assert resolved.origin == "torchserve" and resolved.module.__name__ == "ts.torch_handler.base_handler"


def test_failing_builtin_shows_its_error(tmp_path, monkeypatch):
    class Finder:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name == "handlerkit.handlers._test_broken":
                raise RuntimeError("built-in is broken")
            return None

    monkeypatch.setattr(sys, "meta_path", [Finder, *sys.meta_path])
    with pytest.raises(HandlerLoadError, match=r"importing module 'handlerkit\.handlers\._test_broken'.*built-in is broken") as info:
        resolve_handler("_test_broken", tmp_path)
    assert "would have hidden" not in str(info.value)


# ------------------------------------------------------------------------------ import isolation


def test_each_dir_gets_its_own_model(dirs):
    a, b = dirs
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


def test_reentry_reuses_the_same_module_and_classes(dirs):
    a, b = dirs
    with model_dir_imports(a):
        first = importlib.import_module("model").Model
    with model_dir_imports(b):
        other = importlib.import_module("model").Model
    with model_dir_imports(a):
        again = importlib.import_module("model").Model
    assert first is again and first is not other


def test_nested_blocks(dirs):
    a, b = dirs
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


def test_an_unrelated_module_of_the_same_name_survives(dirs, monkeypatch):
    a, _ = dirs
    unrelated = types.ModuleType("model")
    unrelated.Model = "unrelated"
    monkeypatch.setitem(sys.modules, "model", unrelated)
    with model_dir_imports(a):
        assert importlib.import_module("model").Model.VALUE == "A"
    assert sys.modules["model"] is unrelated


def test_state_is_restored_when_the_block_raises(dirs):
    a, _ = dirs
    with pytest.raises(ZeroDivisionError), model_dir_imports(a):
        importlib.import_module("model")
        1 / 0  # noqa: B018
    assert "model" not in sys.modules and str(a) not in sys.path


def test_handlers_of_two_dirs_side_by_side(dirs):
    a, b = dirs
    ha, hb = resolve_handler("handler", a), resolve_handler("handler", b)
    assert ha.module is not hb.module
    for _ in range(2):
        assert call(ha, [{}], None) == ["A", "A"]
        assert call(hb, [{}], None) == ["B", "B"]


def test_module_imported_outside_a_block_stays(dirs, monkeypatch):
    a, b = dirs
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


def test_new_files_are_seen_and_the_listing_is_cached(dirs, monkeypatch):
    a, _ = dirs
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


def test_clear_module_cache_reimports(dirs):
    a, _ = dirs
    with model_dir_imports(a):
        first = importlib.import_module("model").Model
    clear_module_cache(a)
    with model_dir_imports(a):
        second = importlib.import_module("model").Model
    assert first is not second and second.VALUE == "A"
    assert resolve_handler("handler", a).module is resolve_handler("handler", a).module
    assert resolve_handler("handler", a).module is not resolve_handler("handler", a, reload=True).module


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


# ------------------------------------------------------------------------------ load_module_from_file


def test_load_module_from_file_gives_distinct_modules(dirs):
    a, b = dirs
    ma, mb = load_module_from_file(a / "model.py"), load_module_from_file(b / "model.py")
    assert ma is not mb and ma.__name__ != mb.__name__
    assert ma.__name__.startswith("handlerkit_modeldir_") and ma.__name__.endswith(".model")
    assert (ma.Model.VALUE, mb.Model.VALUE) == ("A", "B")
    assert ma.Model.__module__ == ma.__name__ and list_classes(ma) == [ma.Model]
    assert load_module_from_file(a / "model.py") is ma  # loaded once
    assert load_module_from_file(a / "model.py", reload=True) is not ma
    assert "model" not in sys.modules


def test_load_module_from_file_pickles_and_has_source(dirs):
    a, _ = dirs
    module = load_module_from_file(a / "model.py")
    instance = module.Model()
    assert type(pickle.loads(pickle.dumps(instance))) is module.Model
    assert "VALUE = 'A'" in inspect.getsource(module.Model)


def test_load_module_from_file_imports_its_own_siblings(dirs):
    a, b = dirs
    for directory, label in ((a, "A"), (b, "B")):
        write(directory, "net.py", "from model import Model\n\nclass Net(Model):\n    pass\n")
    na, nb = load_module_from_file(a / "net.py"), load_module_from_file(b / "net.py")
    assert (na.Net.VALUE, nb.Net.VALUE) == ("A", "B")
    assert [c.__name__ for c in list_classes(na)] == ["Net"]  # the imported Model does not count


def test_load_module_from_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_module_from_file(tmp_path / "absent.py")
    write(tmp_path, "broken.py", "import not_installed_for_handlerkit\n")
    with pytest.raises(HandlerLoadError, match=r"broken\.py failed: ModuleNotFoundError: No module named 'not_installed_for_handlerkit'\n  fix: ") as info:
        load_module_from_file(tmp_path / "broken.py")
    assert isinstance(info.value.__cause__, ModuleNotFoundError)
    assert info.value.fix == f"correct broken.py (it runs with {os.path.realpath(tmp_path)} first on sys.path)"
    assert not [k for k in sys.modules if k.endswith(".broken")]


# ------------------------------------------------------------------------------ TorchServe's own code


@pytest.mark.torchserve
def test_torchserve_load_pickled_model_gets_each_dirs_class(dirs):
    pytest.importorskip("ts")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from ts.torch_handler.base_handler import BaseHandler

    a, b = dirs
    for directory, label in ((a, "A"), (b, "B"), (a, "A")):
        with model_dir_imports(directory):
            model = BaseHandler()._load_pickled_model(str(directory), "model.py", None)
        assert type(model).VALUE == label
    with model_dir_imports(a):
        first = BaseHandler()._load_pickled_model(str(a), "model.py", None)
        second = BaseHandler()._load_pickled_model(str(a), "model.py", None)
    assert type(first) is type(second)
    assert "model" not in sys.modules


def test_a_folder_named_like_a_builtin_does_not_shadow_it(tmp_path, monkeypatch):
    # A notebook next to its model dir "image_classifier/": the folder is a namespace package
    # on sys.path, with no handler code; the built-in handler must still be found.
    (tmp_path / "image_classifier").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    sys.modules.pop("image_classifier", None)
    try:
        resolved = resolve_handler("image_classifier")
    finally:
        sys.modules.pop("image_classifier", None)
    assert resolved.cls.__module__ == "handlerkit.handlers.image_classifier"


def test_listing_is_trusted_for_max_age_seconds(dirs, monkeypatch):
    a, _ = dirs
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


def test_leaving_a_block_lists_the_dir_only_when_something_was_imported(dirs, monkeypatch):
    a, _ = dirs
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
