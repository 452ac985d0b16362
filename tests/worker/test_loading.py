"""handlerkit.worker.loading: TorchServe 0.12's handler resolution (the per-model-dir imports it runs
under are handlerkit.worker.isolation's: test_isolation.py)."""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
import types

import pytest
from _module_dirs import CLASS_HANDLER, write

from handlerkit._text import did_you_mean
from handlerkit.errors import HandlerkitWarning, HandlerLoadError
from handlerkit.worker import isolation, loading
from handlerkit.worker.loading import (
    ResolvedHandler,
    list_classes,
    load_module_from_file,
    model_dir_imports,
    resolve_handler,
)


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


pytestmark = pytest.mark.usefixtures("restores_imports")


class FakeContext:
    def __init__(self, model_dir=None):
        self.system_properties = {"model_dir": str(model_dir) if model_dir else None, "gpu_id": None}
        self.manifest = {"model": {}}


# ------------------------------------------------------------------------------ spec forms


@pytest.mark.parametrize("spec", ["handler", "handler.py", "handler:handle_missing_is_error"])
def test_name_forms_resolve_in_the_model_dir(two_model_dirs, spec):
    a, _ = two_model_dirs
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


def test_absolute_and_relative_paths(two_model_dirs, tmp_path, monkeypatch):
    a, b = two_model_dirs
    resolved = resolve_handler(str(a / "handler.py"))  # no model dir: the file's own dir
    assert resolved.model_dir == str(a) and call(resolved, [{}], None) == ["A", "A"]
    monkeypatch.chdir(tmp_path)
    resolved = resolve_handler("dir_B/handler.py")
    assert resolved.model_dir == str(b) and call(resolved, [{}], None) == ["B", "B"]
    # A path under the model dir, and TorchServe's basename rule ("src/handler.py" archived flat).
    write(a, "sub/other.py", "def handle(data, context):\n    return ['sub']\n")
    assert resolve_handler("sub/other.py", a).function([{}], None) == ["sub"]
    assert call(resolve_handler("elsewhere/handler.py", a), [{}], None) == ["A", "A"]


def test_file_outside_the_model_dir_runs_in_the_model_dirs_imports(two_model_dirs, tmp_path):
    a, _ = two_model_dirs
    outside = write(tmp_path / "src", "my_handler.py", CLASS_HANDLER)
    resolved = resolve_handler(str(outside), a)
    assert resolved.origin == "file" and resolved.model_dir == str(a)
    assert call(resolved, [{}], None) == ["A", "A"]  # `import model` found the model dir's file


def test_missing_file_lists_where_it_looked(two_model_dirs):
    a, _ = two_model_dirs
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


def test_class_handler_initialize(two_model_dirs):
    a, _ = two_model_dirs
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


def test_a_class_named_after_the_colon_is_no_function(tmp_path):
    write(tmp_path, "loan.py", "class Loan:\n    def handle(self, d, c):\n        return d\n")
    with pytest.raises(HandlerLoadError, match=r"handler 'loan:Loan': Loan in module loan .* is a class; after ':' TorchServe names a function") as info:
        resolve_handler("loan:Loan", tmp_path)
    assert info.value.fix == "write 'loan' (TorchServe then uses the module's one class), or name a function handle(data, context)"
    assert resolve_handler("loan", tmp_path).cls.__name__ == "Loan"


def test_constructor_with_arguments_is_an_error(tmp_path):
    write(tmp_path, "needs_args.py", "class H:\n    def __init__(self, x):\n        pass\n    def handle(self, d, c):\n        pass\n")
    with pytest.raises(HandlerLoadError, match=r"TorchServe builds the handler with H\(\) \(no arguments\), and that raised TypeError") as info:
        resolve_handler("needs_args", tmp_path)
    assert isinstance(info.value.__cause__, TypeError)
    assert info.value.fix == "give every __init__ argument a default, or move the setup into initialize(self, context)"


def test_build_makes_the_instance(two_model_dirs):
    a, _ = two_model_dirs
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


def test_an_exception_from_build_is_wrapped_like_one_from_the_class(two_model_dirs):
    a, _ = two_model_dirs

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
    from handlerkit.worker import loading

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


# ------------------------------------------------------------------------------ model dirs side by side
# (the per-dir imports themselves are tested in test_isolation.py)


def test_handlers_of_two_dirs_side_by_side(two_model_dirs):
    a, b = two_model_dirs
    ha, hb = resolve_handler("handler", a), resolve_handler("handler", b)
    assert ha.module is not hb.module
    for _ in range(2):
        assert call(ha, [{}], None) == ["A", "A"]
        assert call(hb, [{}], None) == ["B", "B"]


def test_resolving_again_reuses_the_module_unless_reloaded(two_model_dirs):
    a, _ = two_model_dirs
    assert resolve_handler("handler", a).module is resolve_handler("handler", a).module
    assert resolve_handler("handler", a).module is not resolve_handler("handler", a, reload=True).module


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


def test_the_isolation_names_are_where_users_met_them():
    """handlerkit.worker.loading re-exports handlerkit.worker.isolation's public names: notebooks import them from here."""
    for name in ("clear_module_cache", "load_module_from_file", "model_dir_imports"):
        assert name in loading.__all__ and getattr(loading, name) is getattr(isolation, name), name
