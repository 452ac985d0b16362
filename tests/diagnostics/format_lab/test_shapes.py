"""The format lab's input dimensions (:mod:`handlerkit.diagnostics.format_lab.shapes`): those
declared in the model config are exported dynamic, and ``dynamic_shapes=`` must name the model's inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _format_lab import ragged_batch, ranker_answers
from _new_users import ranker_dir, ranker_request

import handlerkit as hk
from handlerkit._compare import same_output
from handlerkit.errors import ConfigError, HandlerkitWarning


def configured_ranker(tmp_path: Path, dynamic_shapes: str) -> Path:
    """The ranker with ``handler: {dynamic_shapes: ...}`` in its model config."""
    model_dir = ranker_dir(tmp_path / "recs", base="handlerkit")
    (model_dir / "model-config.yaml").write_text(f"handler:\n  dynamic_shapes: {dynamic_shapes}\n")
    manifest_path = model_dir / "MAR-INF" / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["model"]["configFile"] = "model-config.yaml"
    manifest_path.write_text(json.dumps(manifest))
    return model_dir


def test_dimensions_declared_in_the_model_config_are_exported_dynamic(tmp_path):
    # Both lists have 4 items: the batch shows nothing varying, the config says item lists do.
    model_dir = configured_ranker(tmp_path, "{item_ids: [1], mask: [1]}")
    h = hk.Harness.open(model_dir)
    four = [ranker_request(1, [1, 2, 3, 4]), ranker_request(2, [5, 6, 7, 8])]
    with pytest.warns(HandlerkitWarning, match="saved export into recs/"):
        report = h.compare_formats(hk.batch(*map(hk.Request.json, four)), formats=[], save="export", repeat=1, warmup=0)

    assert report.dims is not None and report.dims.seen == {} and report.dims.declared == {1: [1], 2: [1]}
    assert report.dims.source == "model-config.yaml handler.dynamic_shapes"
    assert report.row("export").dynamic_dims == ["item_ids dim 1", "mask dim 1"]
    assert report.row("export").dims["item_ids"] == ["batch", "*"]
    assert report.saved is not None, report.refused
    assert "the batch made longer (item_ids dim 1 = 5, mask dim 1 = 5)" in report.saved.notes[-1]
    two = ranker_request(3, [10, 11])
    assert same_output(hk.Harness.open(model_dir).run(hk.batch(hk.Request.json(two))).output,
                       ranker_answers(tmp_path, two), 1e-3, 1e-3)  # fmt: skip


def test_dynamic_shapes_must_name_the_models_inputs(tmp_path):
    h = hk.Harness.open(ranker_dir(tmp_path / "recs", base="handlerkit"))
    with pytest.raises(ValueError, match=r"^dynamic_shapes= names input 'items' \(did you mean 'item_ids'\?\), and "
                       r"the model takes 3: user_ids, item_ids, mask \(by name"):  # fmt: skip
        h.compare_formats(ragged_batch(), formats=[], dynamic_shapes={"items": [1]})
    with pytest.raises(ValueError, match=r"^dynamic_shapes=: item_ids has dims 1 to 1 besides the batch \(its shape "
                       r"in the batch is \[2, 7\]\), not \[2\]"):  # fmt: skip
        h.compare_formats(ragged_batch(), formats=[], dynamic_shapes={1: [2]})
    configured = hk.Harness.open(configured_ranker(tmp_path / "configured", "{items: [1]}"))
    with pytest.raises(ConfigError, match=r"^model-config.yaml handler.dynamic_shapes names input 'items' \(did you"):
        configured.compare_formats(ragged_batch(), formats=[])
