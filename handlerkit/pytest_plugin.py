"""handlerkit's pytest plugin: test a TorchServe handler in your own CI, without the server.

Installed with handlerkit (the ``pytest11`` entry point ``handlerkit``), so pytest loads it in
every run of every project in the environment: this module imports nothing but pytest until a
fixture is used. Configure the model once::

    # pyproject.toml                           # or pytest.ini: [pytest] hk_model_dir = model
    [tool.pytest.ini_options]
    hk_model_dir = "model"                     # a model dir or a .mar

and write tests with the fixtures and :mod:`handlerkit.testing`'s assertions::

    from handlerkit.testing import assert_contract

    def test_handler(hk_harness, hk_request):
        assert_contract(hk_harness(), hk_request.batch("images/cat.jpg"))

Options:
    ``hk_model_dir`` (ini): relative to the ini file's directory (pytest's rootdir).
    ``--hk-model-dir=PATH``: overrides it; relative to the directory pytest is started from,
        as every command-line path. Write it with ``=``: pytest looks for its rootdir and ini
        file before plugins are loaded, and would take a separate ``PATH`` for a test path.
    ``--hk-regen``: ``assert_matches_golden`` writes golden files instead of comparing; the
        run ends with the list of files written.

Fixtures (all ``hk_``-prefixed, so they cannot clash with a project's own):
    ``hk_context``: a fresh :class:`~handlerkit.worker.context.MockContext` of the configured model
        (``MockContext.from_mar`` for a ``.mar`` or ``.tar.gz``: extracted into a temp dir that
        is removed when the test ends), per test.
    ``hk_harness``: a factory, ``hk_harness(handler=None, context=None, **kwargs)`` → a
        :class:`~handlerkit.harness.Harness`; the handler defaults to the manifest's, the
        context to a fresh one of the configured model (its own for each harness: read it as
        ``h.context``); ``kwargs`` go to the Harness.
    ``hk_request``: a :class:`handlerkit.testing.RequestFiles` whose relative paths are taken
        from the test file's directory: ``hk_request.file("images/cat.jpg")``,
        ``.batch(...)``, ``.json(obj)``, ``.text(s)``, ``.form(...)``, ``.path(...)``.

Override ``hk_context`` in a ``conftest.py`` for a directory of tests that needs another model.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

__all__ = ["HarnessFactory", "model_path"]

_INI = "hk_model_dir"
_OPTION = "--hk-model-dir"
_UNSET = (
    "handlerkit: no model configured for hk_context/hk_harness: set the ini option hk_model_dir "
    "(pytest.ini: `hk_model_dir = path/to/model`, pyproject.toml: [tool.pytest.ini_options] "
    'hk_model_dir = "path/to/model") or pass --hk-model-dir=PATH; a model dir or a .mar'
)
_REGEN_STATE = pytest.StashKey[tuple[bool, int]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("handlerkit", "handlerkit (TorchServe handler tests)")
    group.addoption(
        _OPTION,
        dest="hk_model_dir",
        default=None,
        metavar="PATH",
        help="model dir or .mar for the hk_context/hk_harness fixtures, relative to the current "
        "directory; overrides the hk_model_dir ini option (write it with '=')",
    )
    group.addoption(
        "--hk-regen",
        dest="hk_regen",
        action="store_true",
        default=False,
        help="handlerkit.testing.assert_matches_golden writes golden files instead of comparing",
    )
    parser.addini(_INI, help="model dir or .mar for the hk_context/hk_harness fixtures, relative to the ini file")


def model_path(config: pytest.Config) -> tuple[Path, str] | None:
    """The configured model (dir or ``.mar``) and where it was set, or None when it is not."""
    value = config.getoption("hk_model_dir", None)
    if value:
        return Path(config.invocation_params.dir, os.path.expanduser(value)), _OPTION
    value = config.getini(_INI)
    if value:
        base = config.inipath.parent if config.inipath is not None else config.rootpath
        return Path(base, os.path.expanduser(str(value))), f"the ini option {_INI}"
    return None


def _configured_context(request: pytest.FixtureRequest) -> Any:
    """The configured model's context; an archive's temp dir goes when the test ends."""
    __tracebackhide__ = True
    from handlerkit.errors import HandlerkitError

    found = model_path(request.config)
    if found is None:
        pytest.fail(_UNSET, pytrace=False)
    path, source = found
    if not path.exists():
        pytest.fail(
            f"handlerkit: {source} names {path}, which does not exist (fix the path; "
            f"{'the ini value is relative to the ini file' if source != _OPTION else 'it is relative to the current directory'})",
            pytrace=False,
        )
    from handlerkit.worker.context import MockContext

    try:
        context = MockContext.from_model_dir(path)  # an archive is unpacked into a temp dir: ctx.archive
    except HandlerkitError as exc:
        pytest.fail(f"handlerkit: cannot load the model that {source} names ({path}): {exc}", pytrace=False)
    archive = getattr(context, "archive", None)
    if archive is not None:
        request.addfinalizer(archive.cleanup)
    return context


@pytest.fixture
def hk_context(request: pytest.FixtureRequest) -> Any:
    """A fresh MockContext of the model that ``hk_model_dir`` / ``--hk-model-dir`` names."""
    return _configured_context(request)


class HarnessFactory:
    """What ``hk_harness`` gives: call it for a new Harness (see the module docstring)."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request

    def __call__(self, handler: Any = None, context: Any = None, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        from handlerkit.harness import Harness

        if context is None:
            context = _configured_context(self._request)
        return Harness(handler, context, **kwargs)  # None: the manifest's handler

    def __repr__(self) -> str:
        found = model_path(self._request.config)
        return f"<hk_harness factory: model {found[0] if found else 'not configured'}>"


@pytest.fixture
def hk_harness(request: pytest.FixtureRequest) -> HarnessFactory:
    """``hk_harness(handler=None, context=None, **kwargs)`` → a new Harness (see the module doc)."""
    return HarnessFactory(request)


@pytest.fixture
def hk_request(request: pytest.FixtureRequest) -> Any:
    """Requests from files relative to the test file's directory (:class:`handlerkit.testing.RequestFiles`)."""
    from handlerkit.testing import RequestFiles

    return RequestFiles(request.path.parent)


# ---------------------------------------------------------------------------- golden files
def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("hk_regen", False):
        import handlerkit.testing as testing

        config.stash[_REGEN_STATE] = (testing._regen, len(testing.written))
        testing._regen = True


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = config.stash.get(_REGEN_STATE, None)
    testing = sys.modules.get("handlerkit.testing")
    if state is None or testing is None:
        return
    written = testing.written[state[1] :]
    terminalreporter.section("handlerkit --hk-regen")
    if not written:
        terminalreporter.write_line("no golden file written: no test called assert_matches_golden")
        return
    terminalreporter.write_line(f"wrote {len(written)} golden file(s) instead of comparing them; review and commit:")
    for path in written:
        try:
            shown = path.relative_to(config.rootpath)
        except ValueError:
            shown = path
        terminalreporter.write_line(f"  {shown}")


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(_REGEN_STATE, None)
    testing: Any = sys.modules.get("handlerkit.testing")
    if state is not None and testing is not None:
        testing._regen = state[0]
        del testing.written[state[1] :]


def pytest_report_header(config: pytest.Config) -> list[str]:
    found = model_path(config)
    return [f"handlerkit: model {found[0]} (from {found[1]})"] if found is not None else []
