"""The package's import graph: layers, each using only the ones below it, and no cycles.

Every ``import`` in handlerkit's source counts, the lazy ones inside functions too (a lazy
import defers the cost, not the dependency). The layers are DESIGN.md §3's, with one change:
the diagnostics read a harness only through a ``Protocol`` (``diagnostics/_view.py``) and the
records in ``results.py``, never the ``Harness`` class, so they sit *below* it, and
``h.check()``/``h.time()``/``h.device_report()`` are downward calls:

1. base: errors, private helpers;  2. the TorchServe model;  3. handlers;  4. the front door
(``service``: a model and its handler, loaded as the worker loads them);  5. the harness's
records (results, capture, recorder, failures);  6. diagnostics;  7. the Harness;  8. front
ends.  The package ``__init__`` is the facade above them all.

The tests mirror the package: every module has a test module named after it
(``handlerkit/pkg/mod.py`` → ``tests/test_pkg_mod.py`` or ``tests/test_pkg.py``), checked below.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "handlerkit"

LAYERS: dict[str, int] = {
    # 1. base
    "handlerkit.errors": 1,
    "handlerkit._text": 1,
    "handlerkit._render": 1,
    "handlerkit._stack": 1,
    "handlerkit.summaries": 1,
    "handlerkit._optional": 1,
    "handlerkit._validate": 1,
    "handlerkit._progress": 1,
    "handlerkit._compare": 1,
    # 2. the TorchServe model
    "handlerkit.devices": 2,
    "handlerkit.timer": 2,
    "handlerkit.memory": 2,
    "handlerkit.contract": 2,
    "handlerkit.context": 2,
    "handlerkit.request_processor": 2,
    "handlerkit.metrics": 2,
    "handlerkit.metrics_config": 2,
    "handlerkit.requests": 2,
    "handlerkit.batches": 2,
    "handlerkit.sequence_batches": 2,  # how the frontend forms a sequence batch (hk.Sequences, Ray's loop)
    "handlerkit._wire": 2,
    "handlerkit.streaming": 2,
    "handlerkit.envelopes": 2,
    "handlerkit.v2_tensors": 2,  # the Open Inference Protocol v2 tensor rule (envelopes, config, serving, the check)
    "handlerkit.modeldir": 2,
    "handlerkit.config": 2,
    "handlerkit.pt2": 2,
    "handlerkit.loading": 2,
    "handlerkit.isolation": 2,
    "handlerkit.freshness": 2,  # whether loaded code is the code on disk (isolation's caches, the Harness's warning)
    "handlerkit.workdir": 2,
    "handlerkit.async_worker": 2,
    "handlerkit.formats": 2,
    "handlerkit.served_format": 2,  # a format saved into a model dir: file, manifest, pt2
    "handlerkit.compile_cache": 2,
    "handlerkit.compile_kernels": 2,  # Inductor's C++ kernels shipped beside the compile cache
    # the archive package: rules, pack, write, read, extract, inspect, manifest, imports
    **{f"handlerkit.archive.{m}": 2 for m in ("rules", "pack", "write", "read", "extract", "inspect", "manifest", "imports")},
    # 3. handlers
    "handlerkit.handlers": 3,
    # 4. the front door: a model and its handler, loaded as the worker loads them
    "handlerkit.service": 4,
    # ... and what runs a handler to build an archive: its compile cache is recorded by the
    # service in a child process, so the archive facade (``archive.build``) sits above it
    "handlerkit.archive.compile_cache": 4,
    "handlerkit.archive": 4,
    # 5. the harness's records
    "handlerkit.results": 5,
    "handlerkit.recording": 5,
    # 6. diagnostics
    "handlerkit.diagnostics": 6,
    # 7. the Harness
    "handlerkit.harness": 7,
    "handlerkit.sequences": 7,  # the frontend's sequence and continuous batching, around a Harness
    # 8. front ends
    "handlerkit.cli": 8,
    "handlerkit.viz": 8,
    "handlerkit.widgets": 8,
    "handlerkit.pytest_plugin": 8,
    "handlerkit.testing": 8,
    "handlerkit.serving": 8,
    # the facade
    "handlerkit": 9,
}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> int | None:
    """The layer of a module: its own entry, else its package's (``handlers.base`` → handlers)."""
    name = module
    while name:
        if name in LAYERS:
            return LAYERS[name]
        name = name.rpartition(".")[0]
    return None


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py") if "assets" not in p.parts}


def imports_of(module: str, path: Path) -> set[str]:
    """The handlerkit modules ``module`` imports (resolving ``from pkg import submodule``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names = []
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                names.append(candidate if candidate in MODULES else base)
        else:
            continue
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name.startswith("handlerkit") and name != module:
                found.add(name)
    return found


GRAPH = {module: imports_of(module, path) for module, path in MODULES.items()}


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in MODULES if layer_of(m) is None)
    assert not unplaced, f"give these modules a layer in LAYERS (DESIGN.md §3): {unplaced}"


def test_no_module_imports_from_a_layer_above():
    upward = []
    for module, targets in GRAPH.items():
        if module == "handlerkit":
            continue  # the facade re-exports everything, lazily
        for target in targets:
            if target == "handlerkit":
                continue  # `from handlerkit import __version__`
            if layer_of(target) > layer_of(module):
                upward.append(f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})")
    assert not upward, "upward imports:\n" + "\n".join(sorted(upward))


def test_no_import_cycles():
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(GRAPH.get(node, ())):
            if target == "handlerkit" or node == "handlerkit":
                continue
            if state.get(target) == 1:
                cycles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_checker_sees_cycles_and_upward_imports(tmp_path):
    """The walker above is only worth its verdicts if it finds a planted violation."""
    planted = tmp_path / "planted.py"
    planted.write_text("from handlerkit.harness import Harness\n\ndef f():\n    from handlerkit.diagnostics import checks\n")
    found = imports_of("handlerkit.errors", planted)
    assert found == {"handlerkit.harness", "handlerkit.diagnostics.checks"}
    assert all(layer_of(t) > layer_of("handlerkit.errors") for t in found)


# ---------------------------------------------------------------------------------------------
# Tests mirror the package
# ---------------------------------------------------------------------------------------------

TESTS = {p.stem for p in (ROOT / "tests").glob("test_*.py")}

def holds_code(path: Path) -> bool:
    """Whether a module holds code of its own: anything but a docstring, imports, ``__all__``
    (or another dunder name) and an ``if TYPE_CHECKING:`` block."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if targets and all(isinstance(t, ast.Name) and t.id.startswith("__") and t.id.endswith("__") for t in targets):
            continue
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            continue
        return True
    return False


def mirror_names(module: str, path: Path) -> list[str]:
    """The test modules any one of which tests ``module``: ``handlerkit/pkg/mod.py`` (or
    ``_mod.py``) → ``test_pkg_mod``, ``test_pkg``; ``handlerkit/mod.py`` → ``test_mod``; the facade
    → ``test_imports``; a sub-package's ``__init__`` → ``test_pkg``, or none when it holds no code."""
    parts = [part.strip("_") for part in module.split(".")[1:]]
    if not parts:
        return ["test_imports"]
    if path.name == "__init__.py" and not holds_code(path):
        return []
    return ["test_" + "_".join(parts[:n]) for n in range(len(parts), 0, -1)]


def mirror_gaps(modules: dict[str, Path], tests: set[str], root: Path = ROOT) -> list[str]:
    """Each module (its path under ``root``) with no test module named after it, and the names that would do."""
    gaps = []
    for module, path in sorted(modules.items()):
        names = mirror_names(module, path)
        if names and not tests.intersection(names):
            gaps.append(f"{path.relative_to(root).as_posix()}: no {' or '.join(f'tests/{n}.py' for n in names)}")
    return gaps


def test_every_module_has_a_test_module_named_after_it():
    gaps = mirror_gaps(MODULES, TESTS)
    assert not gaps, "tests mirror the package; add (or rename) a test module for each of:\n" + "\n".join(gaps)


def test_the_mirror_check_sees_modules_nobody_tests(tmp_path):
    """The check is only worth its verdict if it flags planted modules that have no test module."""
    files = {
        "__init__.py": "def facade(): ...\n",
        "_planted.py": "X = 1\n",
        "planted_pkg/__init__.py": '"""A package with code of its own."""\n\nVALUE = 1\n',
        "planted_pkg/_inner.py": "X = 1\n",
        "quiet_pkg/__init__.py": '"""Re-exports only."""\n\nfrom x import y\n\n__all__ = ["y"]\n',
        "quiet_pkg/loud.py": "X = 1\n",
    }
    for name, text in files.items():
        (tmp_path / "handlerkit" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "handlerkit" / name).write_text(text)
    planted = {module_name(p, tmp_path): p for p in (tmp_path / "handlerkit").rglob("*.py")}
    assert mirror_gaps(planted, set(), tmp_path) == [
        "handlerkit/__init__.py: no tests/test_imports.py",
        "handlerkit/_planted.py: no tests/test_planted.py",
        "handlerkit/planted_pkg/__init__.py: no tests/test_planted_pkg.py",
        "handlerkit/planted_pkg/_inner.py: no tests/test_planted_pkg_inner.py or tests/test_planted_pkg.py",
        "handlerkit/quiet_pkg/loud.py: no tests/test_quiet_pkg_loud.py or tests/test_quiet_pkg.py",
    ]  # quiet_pkg's __init__ holds no code: it needs none
    assert mirror_gaps(planted, {"test_imports", "test_planted", "test_planted_pkg", "test_quiet_pkg_loud"}, tmp_path) == []


def test_no_module_is_longer_than_one_sitting():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500}
    assert not long, f"split these modules (≲ 500 lines each): {long}"


def test_import_handlerkit_and_mock_context_load_no_torchserve_module():
    """torchserve is installed in the test environment; handlerkit must not pull it in."""
    pytest.importorskip("ts")
    code = (
        "import sys, handlerkit as hk\n"
        "hk.MockContext; hk.Request; hk.batch; hk.errors if hasattr(hk, 'errors') else None\n"
        "import handlerkit.errors\n"
        "print(sorted(m for m in sys.modules if m == 'ts' or m.startswith('ts.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=str(ROOT))
    assert out.stdout.strip() == "[]"


def test_prediction_exception_joins_torchserve_class_whenever_torchserve_is_loaded():
    """Under TorchServe's worker ts.utils.util is imported before the handler; in a notebook it
    may come later. Either way `except ts.utils.util.PredictionException` must catch ours."""
    pytest.importorskip("ts")
    for order in ("handlerkit first", "torchserve first"):
        first, second = ("import handlerkit.errors as e", "import ts.utils.util as u")
        if order == "torchserve first":
            first, second = second, first
        code = (
            f"{first}\n{second}\n"
            "try:\n    raise e.RequestError('bad image', 1, fix='send a PNG')\n"
            "except u.PredictionException as exc:\n    print(exc.error_code, exc.fix)\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT), env={**os.environ})
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "400 send a PNG", order


def test_importing_every_module_changes_nothing_outside_the_package():
    """No import-time side effects (STYLE.md): importing any handlerkit module installs no import
    hook, logging handler or warnings filter and leaves sys.path and the working directory alone
    (the heavy dependencies are imported first, so only handlerkit's own imports are judged)."""
    modules = sorted(m for m in MODULES if m != "handlerkit.serving._replica"  # imports Ray's actor machinery
                     # imports kserve, whose own imports add a meta-path hook (six) and warnings filters
                     and m != "handlerkit.serving.kserve._model"
                     and not m.endswith(".__main__"))  # `python -m handlerkit.cli` runs it, by design
    code = (
        "import importlib, logging, os, sys, warnings\n"
        "import torch, torchvision, PIL.Image, numpy, yaml, matplotlib, ipywidgets, pytest\n"
        "def state():\n"
        "    return (list(sys.meta_path), list(sys.path_hooks), list(sys.path), os.getcwd(),\n"
        "            list(logging.getLogger().handlers), logging.getLogger().level, list(warnings.filters),\n"
        "            torch.get_num_threads(), sys.getswitchinterval())\n"
        "before = state()\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "after = state()\n"
        "for label, b, a in zip(('meta_path', 'path_hooks', 'path', 'cwd', 'log handlers', 'log level',\n"
        "                        'warnings filters', 'torch threads', 'switch interval'), before, after):\n"
        "    if a != b:\n"
        "        print(label, b, '->', a)\n"
        "print('handlerkit' in {type(f).__module__.split('.')[0] for f in sys.meta_path})\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", out.stdout


def test_the_facade_lists_exactly_what_it_serves():
    """``__all__`` is a literal (linters and IDEs read it); it must name what ``__getattr__``
    serves, and the type checker's imports must cover the same names."""
    import handlerkit

    assert sorted(handlerkit.__all__) == sorted([*handlerkit._EXPORTS, "__version__"])
    tree = ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    typed = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             for alias in node.names if node.module and node.module.startswith("handlerkit")}
    typed |= {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
              and node.module == "handlerkit" for alias in node.names}
    assert typed == set(handlerkit._EXPORTS)
    for name in handlerkit.__all__:
        assert getattr(handlerkit, name) is not None
