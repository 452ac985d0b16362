"""The text helpers every module shares (:mod:`handlerkit._text`): numbers, byte sizes, tables
in text and HTML, wrapped paragraphs, "did you mean"."""

from __future__ import annotations

import pytest

from handlerkit._text import (
    STYLE,
    did_you_mean,
    format_bytes,
    format_number,
    html_block,
    numeric_columns,
    render_html,
    render_text,
    suggestion,
    wrap_text,
)


@pytest.mark.parametrize(
    ("value", "text"),
    [(100.0, "100"), (61890.9, "61891"), (45.192, "45.2"), (3.104, "3.10"), (0.012345, "0.0123"),
     (0.0001234, "1.23e-04"), (-2.5, "-2.50"), (0.0, "0"), (7, "7"), (float("nan"), "nan")],
)
def test_a_number_has_three_significant_digits_and_whole_numbers_stay_whole(value, text):
    assert format_number(value) == text


@pytest.mark.parametrize(
    ("n", "text"),
    [(None, "n/a"), (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (12_900_000, "12.3 MiB"),
     (-2048, "-2.0 KiB"), (5 * 1024**5, "5120.0 TiB")],
)
def test_byte_sizes_are_in_binary_units(n, text):
    assert format_bytes(n) == text


def test_columns_of_numbers_only_are_numeric():
    rows = [[1, "x", None, 3], [2.5, "y", True, None]]
    assert numeric_columns(["n", "text", "flag", "sparse"], rows) == [True, False, False, True]  # a bool is no number


def test_a_table_may_wrap_long_text_cells_and_keeps_numbers_whole():
    long = "a guard that fails because the tensor size changed from two to four " * 3
    lines = render_text(["size", "why"], [[123456789, long], [2, "short"]], wrap=30).splitlines()
    assert max(len(line) for line in lines) <= len("123456789") + 2 + 30
    assert lines[2].startswith("123456789  a guard that fails")  # the number on the row's first line
    assert " ".join(" ".join(lines[2:-1]).split()).replace("123456789 ", "") == " ".join(long.split())
    assert lines[-1].split() == ["2", "short"]
    unwrapped = render_text(["why"], [[long], ["short"]]).splitlines()  # without wrap: the 100-column limit
    assert max(len(line) for line in unwrapped) <= 100 and len(unwrapped) == 2 + 3 + 1 and unwrapped[-1] == "short"


def test_a_table_too_wide_for_the_width_becomes_one_block_per_row():
    headers = ["a", "bb", "c", "d", "e", "f", "g"]
    lines = render_text(headers, [["x" * 30] * 6 + [""], ["y"] * 7], title="wide", width=60).splitlines()
    assert lines == ["wide", *(f"{h:2}  {'x' * 30}" for h in headers[:6]), "", *(f"{h:2}  y" for h in headers)]


def test_the_html_table_escapes_cells_and_marks_text_and_numbers():
    markup = render_html(["name", "ms"], [["<a>", 1.5]], "timings")
    assert markup.startswith("<div class='handlerkit'>" + STYLE + "<table class='handlerkit'>")
    assert "<caption style='text-align:left'><b>timings</b></caption>" in markup
    assert "<th class='hk-text' style='text-align:left'>name</th><th class='hk-num' style='text-align:right'>ms</th>" in markup
    assert "<td class='hk-text' style='text-align:left;white-space:nowrap'>&lt;a&gt;</td>" in markup
    assert "<td class='hk-num' style='text-align:right;white-space:nowrap'>1.50</td>" in markup
    bare = render_html(["name"], [["a guard on a tensor size that changed from two to four"]], style=False)
    assert STYLE not in bare and html_block(bare).count(STYLE) == 1
    assert "style='text-align:left'>a guard" in bare  # long text may wrap between words
    long_word = render_html(["path"], [["/tmp/pytest-of-user/pytest-12/model_dir/handler.py"]])
    assert "style='text-align:left;word-break:break-all'" in long_word  # a path may break anywhere


def test_a_paragraph_wraps_with_indented_continuation_lines():
    assert wrap_text("one two three four five\nsix", 10, "  ") == "one two\n  three\n  four\n  five\nsix"
    assert wrap_text("a\n\nb") == "a\n\nb"  # an empty line is kept


def test_did_you_mean_ignores_case_and_separators_then_prefers_a_unique_prefix_then_spelling():
    assert did_you_mean("batch_size", ["batchSize", "maxBatchDelay"]) == "batchSize"
    assert did_you_mean("aot", ["aot_compile", "eager"], prefix=True) == "aot_compile"
    assert did_you_mean("aot", ["aot_compile", "eager"]) is None  # without prefix: too far a spelling
    assert did_you_mean("co", ["compile", "config"], prefix=True) is None  # too short a prefix
    assert did_you_mean("responsTimeout", ["responseTimeout", "batchSize"]) == "responseTimeout"
    assert suggestion("responsTimeout", ["responseTimeout"]) == " (did you mean 'responseTimeout'?)"
    assert suggestion("zzz", ["batchSize"]) == ""
