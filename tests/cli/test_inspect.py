"""``handlerkit inspect``: a model dir's manifest, config, handler and format, without running it."""

from __future__ import annotations

import json
import shutil

from _cli import MODEL, cli, cli_json, handler_dir


def test_inspect_a_model_dir(capsys):
    code, out, _ = cli(capsys, "inspect", MODEL)
    assert code == 0
    assert out.splitlines()[0] == "image_classifier (dir): model image_classifier 1.0, handler ImageClassifier, eager: loads"
    code, data = cli_json(capsys, "inspect", MODEL)
    assert data["manifest"] == json.loads((MODEL / "MAR-INF" / "MANIFEST.json").read_text())
    assert data["handler"]["origin"] == "handlerkit" and data["handler"]["kind"] == "class"
    assert data["model"]["format"] == "eager" and data["config"]["batchSize"] == 4
    assert {f["name"] for f in data["files"]} >= {"model.pt", "model.py", "MAR-INF/MANIFEST.json"}


def test_inspect_does_not_run_initialize(tmp_path, capsys):
    model = handler_dir(tmp_path / "m", "class H:\n    def initialize(self, context):\n"
                        "        raise RuntimeError('initialize ran')\n    def handle(self, data, context):\n"
                        "        return []\n")
    code, data = cli_json(capsys, "inspect", model)
    assert data["handler"]["name"] == "H" and data["handler"]["origin"] == "model_dir"
    assert data["inferred"]["handler"] == "handler.py is in the dir" and "inferred" in data["notes"][0]
    assert data["model"]["format"] == "none (the handler loads its own model)" and code == 0


def test_inspect_reports_what_would_stop_torchserve(tmp_path, capsys):
    model = tmp_path / "broken"
    shutil.copytree(MODEL, model)
    manifest = json.loads((model / "MAR-INF" / "MANIFEST.json").read_text())
    manifest["model"]["handler"] = "no_such_handler.py"
    (model / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest))
    (model / "model-config.yaml").write_text("batchSize: '8'\n")
    (model / "model.pt").unlink()
    code, out, _ = cli(capsys, "inspect", model)
    assert code == 1 and "3 problem(s)" in out.splitlines()[0]
    _, data = cli_json(capsys, "inspect", model)
    assert sorted(p["what"] for p in data["problems"]) == ["config", "handler", "model"]
    assert all(p["fix"] for p in data["problems"])
