"""handlerkit._compare: the one rule batch parity and golden files use to call two outputs the same."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy
import pytest
import torch

from handlerkit._compare import Difference, differences, same_output, shown

NAN, INF = math.nan, math.inf


@pytest.mark.parametrize(
    "expected, actual, same",
    [
        (1.0, 1.00005, True),            # within atol
        (1000.0, 1000.09, True),         # within rtol * |expected|
        (1.0, 1.001, False),
        (1, 1.0, True),
        (NAN, NAN, True),
        (NAN, 1.0, False),
        (1.0, NAN, False),
        (INF, INF, True),
        (INF, -INF, False),
        (INF, 1e308, False),
        (True, 1, False),                # a bool is not a number here
        (True, True, True),
        ("cat", "cat", True),
        ("cat", "dog", False),
        (b"a", bytearray(b"a"), False),  # equal, but another type
        (None, None, True),
        ({"a": 1.0, "b": 2.0}, {"b": 2.0, "a": 1.0}, True),  # key order ignored
        ({"a": 1.0}, {"a": 1.0, "b": 2.0}, False),
        ([1.0, 2.0], (1.0, 2.0), True),  # lists and tuples alike
        ([1.0, 2.0], [1.0], False),
        ([[1.0, {"x": NAN}]], [[1.0, {"x": NAN}]], True),
        (torch.tensor([1.0, NAN]), torch.tensor([1.00001, NAN]), True),
        (torch.tensor([1.0]), torch.tensor([[1.0]]), False),
        (torch.tensor([1.0]), torch.tensor([1.1]), False),
        (numpy.array([1.0, 2.0]), numpy.array([1.0, 2.0]), True),
        (torch.ones(2, dtype=torch.int64), torch.ones(2), True),
    ],
)
def test_the_rule(expected, actual, same):
    assert same_output(actual, expected) is same
    assert (list(differences(expected, actual)) == []) is same


def test_the_tolerance_is_relative_to_the_expected_value():
    assert same_output(110.0, 100.0, atol=0.0, rtol=0.1)  # 10 <= 0.1 * 100
    assert not same_output(100.0, 110.0, atol=0.0, rtol=0.09)  # 10 > 0.09 * 110


def test_each_difference_says_where_and_what():
    expected = {"boxes": [[1.0, 2.0]], "labels": ["cat"], "score": 0.9, "gone": 1}
    actual = {"boxes": [[1.0, 2.5]], "labels": ["cat", "dog"], "score": "0.9", "new": 2}
    found = list(differences(expected, actual))
    assert found == [
        Difference("", "missing keys", expected, actual, ("gone",)),
        Difference("", "new keys", expected, actual, ("new",)),
        Difference("['boxes'][0][1]", "number", 2.0, 2.5),
        Difference("['labels']", "length", ["cat"], ["cat", "dog"]),
        Difference("['score']", "value", 0.9, "0.9"),
    ]


def test_shown_cuts_long_reprs():
    assert shown("abc") == "'abc'"
    assert shown(list(range(100)), 20) == "[0, 1, 2, 3, 4, 5..."
    assert len(shown(list(range(100)), 20)) == 20


def test_importing_it_does_not_import_torch():
    code = "import sys, handlerkit._compare as c; c.same_output([1.0], [1.0]); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
