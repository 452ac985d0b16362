"""Where in the user's code an exception was raised (:mod:`handlerkit.worker.locations`): one
line per user file it passed through, named as a path or as IPython names a notebook cell."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from handlerkit.worker.locations import (
    cell_name,
    defined_in_cell,
    named,
    raised_at,
    raised_in,
    refresh_sources,
    shown_at,
)

MODEL_PY = "def forward(x):\n    return helper(x)\n\n\ndef helper(x):\n    return x['missing']\n"
HANDLER_PY = "import json\n\n\ndef handle(model, data):\n    return model.forward(json.loads(data))\n"


def load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem + "_for_locations", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_innermost_line_of_each_user_file_outermost_first_libraries_left_out(tmp_path):
    (tmp_path / "model.py").write_text(MODEL_PY)
    (tmp_path / "handler.py").write_text(HANDLER_PY)
    model, handler = load(tmp_path / "model.py"), load(tmp_path / "handler.py")
    with pytest.raises(KeyError) as info:
        handler.handle(model, "{}")
    test_file, *user = raised_in(info.value)  # this test's own line first: it is the outermost user file
    assert test_file[0] == __file__ and test_file[2] == 'handler.handle(model, "{}")'
    assert user == [
        (str(tmp_path / "handler.py"), 5, "return model.forward(json.loads(data))"),
        (str(tmp_path / "model.py"), 6, "return x['missing']"),  # helper's line, not forward's: one per file
    ]
    assert raised_at(info.value) == (str(tmp_path / "model.py"), 6, "return x['missing']")
    with pytest.raises(json.JSONDecodeError) as info:  # raised inside the json library
        handler.handle(model, "not json")
    assert raised_at(info.value) == (str(tmp_path / "handler.py"), 5, "return model.forward(json.loads(data))")


def test_an_exception_raised_in_a_library_is_located_at_the_users_call():
    with pytest.raises(json.JSONDecodeError) as info:
        json.loads("not json")
    assert [(file, source) for file, _, source in raised_in(info.value)] == [(__file__, 'json.loads("not json")')]
    assert raised_at(ValueError("never raised")) is None  # no traceback at all


def test_a_syntax_error_is_located_where_it_says(tmp_path):
    (tmp_path / "handler.py").write_text("def handle(data, context)\n    return data\n")
    with pytest.raises(SyntaxError) as info:
        load(tmp_path / "handler.py")
    assert raised_at(info.value) == (str(tmp_path / "handler.py"), 1, "def handle(data, context)")


def test_a_file_is_named_by_its_path_and_a_cell_as_ipython_names_it():
    assert cell_name("<ipython-input-3-0123abcd>") == "Cell In[3]"
    assert cell_name("/tmp/ipykernel_4242/1234567.py") == "a notebook cell"  # no shell here: no count
    assert cell_name("/models/recs/handler.py") is None
    assert shown_at(("/models/recs/handler.py", 19, "x")) == "/models/recs/handler.py:19"
    assert named(("/models/recs/handler.py", 19, "x")) == "handler.py line 19"
    assert shown_at(("<ipython-input-3-0123abcd>", 7, "x")) == named(("<ipython-input-3-0123abcd>", 7, "x")) == "Cell In[3], line 7"


def test_a_class_defined_in_a_cell_is_found_by_its_methods_code():
    namespace: dict = {}
    exec(compile("class Handler:\n    def handle(self, data, context):\n        return data\n", "<ipython-input-5-abc123>", "exec"), namespace)
    assert defined_in_cell(namespace["Handler"]) == "Cell In[5]"
    assert defined_in_cell(namespace["Handler"].handle) == "Cell In[5]"
    assert defined_in_cell(Path) is None  # from a file


def test_a_changed_file_shows_its_new_line(tmp_path):
    (tmp_path / "handler.py").write_text(HANDLER_PY)
    handler = load(tmp_path / "handler.py")
    with pytest.raises(AttributeError) as info:
        handler.handle(None, "{}")
    assert raised_at(info.value)[2] == "return model.forward(json.loads(data))"
    (tmp_path / "handler.py").write_text(HANDLER_PY.replace("return model", "return  model"))
    refresh_sources([str(tmp_path / "handler.py")])
    assert raised_at(info.value)[2] == "return  model.forward(json.loads(data))"  # the file as it is now
