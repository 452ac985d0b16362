"""Specialisations: torch's symbolic_shape_specialization records read into the user's file:line."""

from __future__ import annotations

import torch
from torch._logging import structured

from handlerkit.diagnostics.compile.specialisations import Specialisation, specialisations


def record(filename, line=7, source="L['x'].size()[0]"):
    return {
        "symbol": "s0",
        "sources": [source],
        "value": "4",
        "reason": "range_refined_to_singleton",
        "user_stack": [
            {"filename": torch.__file__, "line": 1, "name": "inner", "loc": "torch's own"},
            {"filename": filename, "line": line, "name": "forward", "loc": "if x.shape[0] == 4:"},
        ],
    }


def test_a_specialisation_names_the_dimension_the_guard_and_the_users_line():
    [spec] = specialisations([record("/models/model.py")])
    guard = "s0 == 4 (range_refined_to_singleton)"
    assert spec == Specialisation("x: dim 0", "4", guard, "/models/model.py", 7, "if x.shape[0] == 4:")
    assert spec.where == "/models/model.py:7"


def test_interned_file_names_are_resolved_and_repeats_listed_once():
    number = structured.intern_string("/models/interned_model.py")
    specs = specialisations([record(number, line=9), record(number, line=9), record("/m.py", source="L['y']")])
    assert [(s.dimension, s.where) for s in specs] == [("x: dim 0", "/models/interned_model.py:9"), ("L['y']", "/m.py:7")]


def test_a_record_without_a_stack_still_names_the_dimension():
    [spec] = specialisations([{"symbol": "s1", "sources": [], "value": "8"}])
    assert (spec.dimension, spec.value, spec.guard, spec.where) == ("s1", "8", "s1 == 8", "")
