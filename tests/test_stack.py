"""handlerkit._stack.user_stacklevel: a warning issued however deep inside handlerkit points at the
first frame outside it (the user's cell or handler).

Frames "inside handlerkit" are made by compiling code under a file name in the package's folder:
nothing is written there, and the frames are the same to ``user_stacklevel``.
"""

from __future__ import annotations

import inspect
import warnings
from pathlib import Path

import handlerkit
from handlerkit._stack import user_stacklevel

PACKAGE = Path(handlerkit.__file__).resolve().parent

WARNS = '''
import warnings
from handlerkit._stack import user_stacklevel


def warn_here(message):
    warnings.warn(message, UserWarning, stacklevel=user_stacklevel())


def one_level(message):
    warn_here(message)


def two_levels(message):
    one_level(message)


def level_of():
    return user_stacklevel()
'''


def module_at(filename: Path) -> dict:
    """WARNS run as if it were the file ``filename``: its frames carry that name."""
    namespace: dict = {}
    exec(compile(WARNS, str(filename), "exec"), namespace)
    return namespace


def test_called_from_outside_handlerkit_it_points_at_the_caller():
    assert user_stacklevel() == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1
        warnings.warn("here", UserWarning, stacklevel=user_stacklevel())
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)


def test_a_warning_deep_inside_handlerkit_points_at_the_users_line():
    inside = module_at(PACKAGE / "_planted_by_test_stack.py")
    assert inside["level_of"]() == 2  # level_of's frame is handlerkit's, this test's is the user's
    for name, depth in (("warn_here", 0), ("one_level", 1), ("two_levels", 2)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            line = inspect.currentframe().f_lineno + 1
            inside[name](f"{depth} frames between")
        (warning,) = caught
        assert (warning.filename, warning.lineno) == (__file__, line), name


def test_a_sibling_folder_whose_name_starts_like_the_package_is_outside():
    """``.../handlerkit_plugins/x.py`` is not inside ``.../handlerkit``: the separator counts."""
    beside = module_at(PACKAGE.parent / f"{PACKAGE.name}_plugins" / "x.py")
    assert beside["level_of"]() == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        beside["two_levels"]("from a plugin")
    assert caught[0].filename == str(PACKAGE.parent / f"{PACKAGE.name}_plugins" / "x.py")
    assert caught[0].lineno == WARNS.splitlines().index("def warn_here(message):") + 2
