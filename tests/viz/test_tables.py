"""handlerkit/viz/tables.py: JSON-like values (what a postprocess answers) as a table: dict rows
by key, list rows by position, anything else one value column; bounded, cells cut to fit."""

from __future__ import annotations

from handlerkit.viz.draw import figure
from handlerkit.viz.tables import LINE, MAX_COLUMNS, MAX_ROWS, cell_text, json_table_panel


def test_dicts_are_rows_and_their_keys_columns_in_order_of_first_appearance():
    rows = [{"label": "cat", "probability": 0.91234}, {"label": "dog", "extra": [1, 2], "probability": 0.5}]
    panel = json_table_panel(rows, "t")
    assert panel.kind == "table" and panel.data["columns"] == ["label", "probability", "extra"]
    assert panel.data["cells"] == [["cat", "0.9123", ""], ["dog", "0.5", "[1, 2]"]]
    assert panel.data["rows"] == ["[0]", "[1]"] and panel.notes == []


def test_strings_and_other_values_are_one_value_column_and_a_dict_alone_one_row():
    assert json_table_panel(["a cat", "a\nline"], "t").data["cells"] == [["a cat"], ["a\\nline"]]
    alone = json_table_panel({"label": "cat", "ok": True, "why": None}, "t")
    assert alone.data["columns"] == ["label", "ok", "why"] and alone.data["cells"] == [["cat", "true", "null"]]
    text = json_table_panel("one answer", "t")
    assert text.data["columns"] == ["value"] and text.data["cells"] == [["one answer"]]


def test_ragged_lists_are_rows_by_position():
    panel = json_table_panel([[1, "a"], [2]], "t")
    assert panel.data["columns"] == ["[0]", "[1]"] and panel.data["cells"] == [["1", "a"], ["2", ""]]


def test_the_table_is_bounded_and_says_what_it_left_out():
    rows = [{f"k{j}": j for j in range(MAX_COLUMNS + 2)} for _ in range(MAX_ROWS + 5)]
    panel = json_table_panel(rows, "t")
    assert len(panel.data["cells"]) == MAX_ROWS and len(panel.data["columns"]) == MAX_COLUMNS
    assert panel.notes == [f"first {MAX_ROWS} of {MAX_ROWS + 5} rows", f"first {MAX_COLUMNS} of {MAX_COLUMNS + 2} keys"]
    long = json_table_panel(["x" * 500], "t")
    assert long.data["cells"] == [["x" * (LINE - 1) + "…"]] and long.notes == [f"cells cut at {LINE} characters"]


def test_a_cell_is_compact_json_bounded_in_depth_and_width():
    assert cell_text({"a": [1, 2.5, {"b": None}]}, 80) == '{"a": [1, 2.5, {"b": null}]}'
    assert cell_text([[[[["deep"]]]]], 80) == "[[[[…]]]]"
    assert cell_text(list(range(100)), 12) == "[0, 1, 2, 3…"
    assert cell_text(object(), 20) == "object"


def test_the_figure_draws_a_header_row_and_a_label_per_row():
    fig = figure([json_table_panel([{"label": "cat", "p": 0.9}, {"label": "dog", "p": 0.1}], "t")])
    (table,) = fig.axes[0].tables
    cells = {key: cell.get_text().get_text() for key, cell in table.get_celld().items()}
    assert cells[(0, 0)] == "label" and cells[(0, 1)] == "p"  # the header
    assert cells[(1, -1)] == "[0]" and cells[(2, 0)] == "dog" and cells[(2, 1)] == "0.1"
    assert len(cells) == 3 * 2 + 2  # 3 rows of 2 columns (header included) + 2 row labels
