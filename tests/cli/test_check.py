"""``handlerkit check --protocol v2 URL``: the Open Inference Protocol v2 check from a terminal,
its exit codes (0 all pass, 1 a rule failed, 2 bad input or nothing answering), and the
handler check's own command line kept as it was."""

from __future__ import annotations

import json

import pytest
from _cli import CIRCLE, MODEL, STAR, cli, cli_json, handler_dir
from _ts_server import free_ports
from _v2_fake import MODEL as SERVED  # the fake server's model name
from _v2_fake import fake_v2_server


def test_a_conforming_server_is_exit_code_0_with_its_table(capsys):
    with fake_v2_server() as url:
        code, out, err = cli(capsys, "check", "--protocol", "v2", url)
    assert (code, err) == (0, "")
    assert " ".join(out.split()).startswith(f"Open Inference Protocol v2: 24 of 24 rules pass; model {SERVED} (found by")
    assert "GET /v2/health/live" in out and "FAIL" not in out


def test_a_failed_rule_is_exit_code_1_and_json_has_every_row(capsys):
    with fake_v2_server("unknown_ready_200", "no_listing") as url:
        code, out, _ = cli(capsys, "check", "--protocol", "v2", url, "--model", SERVED, "--json")
    data = json.loads(out)
    assert code == 1 and data["exit_code"] == 1 and data["ok"] is False
    assert data["model"] == SERVED and data["discovered_by"] is None
    (failure,) = [row for row in data["rows"] if not row["ok"]]
    assert failure["endpoint"] == "GET /v2/models/handlerkit-no-such-model/ready"
    assert (failure["status"], failure["detail"]) == (200, "expected a 4xx status, got 200")


def test_nothing_answering_is_exit_code_2_on_one_line(capsys):
    (port,) = free_ports(1)
    code, out, err = cli(capsys, "check", "--protocol", "v2", f"http://127.0.0.1:{port}", "--timeout", "2")
    assert (code, out) == (2, "")
    assert err.startswith(f"handlerkit: error: expected an Open Inference Protocol v2 server at http://127.0.0.1:{port}")
    assert err.endswith("(fix: start the server first, or check the URL's host and port)\n") and err.count("\n") == 1


def test_usage_errors_of_the_two_forms_are_exit_code_2(capsys):
    code, _, err = cli(capsys, "check", "--protocol", "v2", "http://127.0.0.1:9", "request.json")
    assert code == 2 and "--protocol v2 takes one URL and no FILES: got http://127.0.0.1:9 request.json" in err
    code, _, err = cli(capsys, "check", "fixtures/models/image_classifier", "--model", "m")
    assert code == 2 and "--model NAME is for a served model: it needs --protocol v2 URL" in err
    code, _, err = cli(capsys, "check", "fixtures/models/image_classifier")
    assert code == 2 and "check needs FILES: one request body per file" in err
    code, _, err = cli(capsys, "check", "--protocol", "v3", "http://127.0.0.1:9")
    assert code == 2 and "argument --protocol: invalid choice: 'v3'" in err
    code, _, err = cli(capsys, "check", "--protocol", "v2", "localhost:8080")
    assert code == 2 and "expected the server's base URL, like http://127.0.0.1:8080: got 'localhost:8080'" in err


def test_inputs_from_a_file_and_a_file_that_is_no_json(capsys, tmp_path):
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["hi"]}]}))
    with fake_v2_server() as url:
        code, out, _ = cli(capsys, "check", "--protocol", "v2", url, "--inputs", str(request), "--json")
        assert code == 0 and any("(BYTES, flat data)" in row["endpoint"] for row in json.loads(out)["rows"])
        (tmp_path / "bad.json").write_text("{not json")
        code, _, err = cli(capsys, "check", "--protocol", "v2", url, "--inputs", str(tmp_path / "bad.json"))
    assert code == 2 and f"--inputs {tmp_path / 'bad.json'}: expected a JSON file of v2 inputs" in err
    code, _, err = cli(capsys, "check", "fixtures/models/image_classifier", "x.png", "--inputs", str(request))
    assert code == 2 and "--inputs JSON is for a served model: it needs --protocol v2 URL" in err


def test_help_says_the_positional_is_a_url_under_protocol_v2(capsys):
    code, out, _ = cli(capsys, "check", "--help")
    assert code == 0
    assert "MODEL [FILES ...]" in out and "--protocol {v2}" in out and "--model NAME" in out
    assert "with --protocol v2, a server's URL" in " ".join(out.split())


# ------------------------------------------------------------------------- the handler check


def test_check_passes_on_the_classifier(capsys):
    code, out, _ = cli(capsys, "check", MODEL, CIRCLE, "--no-progress")
    assert code == 0 and "check of ImageClassifier on 1 request(s): ok" in out
    code, data = cli_json(capsys, "check", MODEL, CIRCLE, STAR)
    assert code == 0 and data["ok"] is True and data["problems"] == [] and len(data["parity"]) == 2


def test_check_failing_is_exit_code_1_with_the_problem_and_fix(tmp_path, capsys):
    model = handler_dir(tmp_path / "m", "def handle(data, context):\n    return ['one'] if data else []\n")
    requests = [tmp_path / "a.txt", tmp_path / "b.txt"]
    for r in requests:
        r.write_text("x")
    with pytest.warns(Warning):
        code, data = cli_json(capsys, "check", model, *requests)
    assert code == 1 and data["ok"] is False
    assert any("one item per request" in p["message"] or "1 item" in p["message"] for p in data["problems"])
    assert all(p["fix"] for p in data["problems"] if p["severity"] == "error")
