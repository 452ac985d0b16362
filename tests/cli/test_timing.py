"""``handlerkit time``: each stage timed over repeated runs, and ``--sweep`` across batch sizes."""

from __future__ import annotations

from _cli import CIRCLE, MODEL, cli, cli_json


def test_time_prints_a_row_per_stage(capsys):
    code, out, _ = cli(capsys, "time", MODEL, CIRCLE, "--repeat", "2", "--warmup", "0")
    assert code == 0 and "timing: batch_size=1, warmup=0, repeat=2, device=cpu" in out
    rows = [line.split()[0] for line in out.splitlines() if line.split() and line.split()[0] in
            ("preprocess", "inference", "postprocess", "end_to_end")]
    assert rows == ["preprocess", "inference", "postprocess", "end_to_end"]


def test_time_sweep_json_has_a_row_per_batch_size(capsys):
    code, data = cli_json(capsys, "time", MODEL, CIRCLE, "--sweep", "1,3", "--repeat", "2", "--warmup", "0")
    assert code == 0 and data["kind"] == "sweep"
    assert [row["batch_size"] for row in data["rows"]] == [1, 3]
    assert all(row["throughput_rps"] > 0 for row in data["rows"])
    assert [r["repeat"] for r in data["reports"]] == [2, 2]


def test_time_sweep_without_sizes_uses_1_2_4_8(capsys):
    code, data = cli_json(capsys, "time", MODEL, CIRCLE, "--sweep", "--repeat", "1", "--warmup", "0")
    assert code == 0 and [row["batch_size"] for row in data["rows"]] == [1, 2, 4, 8]


def test_time_sweep_before_the_model_does_not_take_the_model_for_its_sizes(capsys):
    code, data = cli_json(capsys, "time", "--sweep", MODEL, CIRCLE, "--repeat", "1", "--warmup", "0")
    assert code == 0 and data["kind"] == "sweep" and [r["batch_size"] for r in data["rows"]] == [1, 2, 4, 8]
    assert all(key == "batch_size" or key.endswith(("_ms", "_rps")) for key in data["rows"][0])  # units in keys
    code, data = cli_json(capsys, "time", "--sweep", "1,2", MODEL, CIRCLE, "--repeat", "1", "--warmup", "0")
    assert code == 0 and [r["batch_size"] for r in data["rows"]] == [1, 2]
