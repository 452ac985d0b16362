"""handlerkit.handlers (the package): its names, each imported on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

import handlerkit.handlers as handlers


def test_importing_the_package_imports_no_handler_module_and_no_torch():
    code = (
        "import sys, handlerkit.handlers as h\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('handlerkit.handlers.')))\n"
        "h.TextHandler\n"
        "print(sorted(m for m in sys.modules if m.startswith('handlerkit.handlers.') and 'vision' in m))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["[]", "[]"]  # the text handler does not load the vision ones


def test_every_name_is_the_class_of_its_module():
    from handlerkit.handlers.image_segmenter import ImageSegmenter

    assert handlers.__all__ == sorted(handlers.__all__) == sorted(handlers._EXPORTS)
    for name in handlers.__all__:
        cls = getattr(handlers, name)
        assert cls.__name__ == name and issubclass(cls, handlers.PerRequestErrors)  # a bad request answered alone
        assert name == "PerRequestErrors" or issubclass(cls, handlers.BaseHandler)
    assert handlers.ImageSegmenter is ImageSegmenter


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="module 'handlerkit.handlers' has no attribute 'ImageClasifier'"):
        handlers.ImageClasifier  # noqa: B018
