"""handlerkit.formats.saved: a format saved into a model dir, served by hk.BaseHandler and TorchServe 0.12.

The fixture classifier is copied to a temporary dir; each format's file is written with
``formats.export_model`` (TorchScript in about a second, ONNX in three), then the dir is opened
afresh and must answer as the original eager model did. The last test saves TorchScript with
the format lab's ``save=``, archives the dir and serves it under a real TorchServe 0.12 server
with TorchServe's own ``image_classifier`` (marked ``server``, as tests/integration/test_torchserve_server.py).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from _new_users import ranker_dir, ranker_request
from _ts_server import missing_requirements, serving

import handlerkit as hk
from conftest import MLP_MODEL_PY, eager_manifest, write_model_dir
from handlerkit._compare import same_output
from handlerkit.errors import HandlerkitError, HandlerkitWarning, StageError
from handlerkit.formats import ArtifactShapeError, export_model
from handlerkit.formats.saved import RECORD, plan_save, save_format
from handlerkit.handlers.base import BaseHandler

_missing = missing_requirements()

ROOT = Path(__file__).resolve().parents[2]
CLASSIFIER = ROOT / "fixtures" / "models" / "image_classifier"
IMAGES = [ROOT / "fixtures" / "images" / f"{name}.png" for name in ("circle", "cross", "square")]


def classifier_copy(tmp_path: Path) -> Path:
    return Path(shutil.copytree(CLASSIFIER, tmp_path / "clf"))


def batch() -> hk.Batch:
    return hk.batch(*(hk.Request.from_file(p) for p in IMAGES))


def answers(model_dir: Path) -> tuple[list[Any], Any]:
    """The dir opened afresh through hk.Service (as the CLI and engines open it): answers and decisions."""
    with hk.Service.open(model_dir) as service:
        service.initialize()
        return service.handle(batch()), service.handler.decisions


def exported(model_dir: Path, fmt: str, tmp_path: Path) -> Path:
    """The dir's eager model written in ``fmt`` outside the dir."""
    h = hk.Harness.open(model_dir)
    h.initialize()
    example = torch.zeros(2, 3, 224, 224)
    path = tmp_path / f"exported-{fmt}"
    return Path(export_model(h.handler.model, (example,), path, fmt, torchscript="script"))


def manifest(model_dir: Path) -> dict[str, Any]:
    return json.loads((model_dir / "MAR-INF" / "MANIFEST.json").read_text())["model"]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_torchscript_saved_answers_as_eager_and_keeps_the_weights(tmp_path):
    model_dir = classifier_copy(tmp_path)
    eager, _ = answers(model_dir)
    weights = digest(model_dir / "model.pt")

    with warnings.catch_warnings():
        warnings.simplefilter("error", HandlerkitWarning)  # TorchServe's own BaseHandler serves TorchScript
        saved = save_format(model_dir, "torchscript", artifact=exported(model_dir, "torchscript", tmp_path))

    assert saved.torchserve_serves and saved.artifact == "model.torchscript.pt" and (model_dir / "model.torchscript.pt").is_file()
    assert manifest(model_dir)["serializedFile"] == "model.torchscript.pt"
    assert "modelFile" not in manifest(model_dir)  # TorchServe would read the file as eager weights
    assert digest(model_dir / "model.pt") == weights and (model_dir / "model.py").is_file()
    assert saved.pt2 is None and "loads it (a .pt without modelFile is TorchScript)" in saved.torchserve
    served, decisions = answers(model_dir)
    assert decisions.model_format == "torchscript"
    assert same_output(served, eager, 1e-4, 1e-4)
    record = json.loads((model_dir / RECORD).read_text())
    assert record == {
        "original": {"serializedFile": "model.pt", "modelFile": "model.py"},
        "saved": {"torchscript": "model.torchscript.pt"},
        "serving": "torchscript",
    }


def test_replace_removes_earlier_saves_and_eager_goes_back_to_the_weights(tmp_path):
    model_dir = classifier_copy(tmp_path)
    eager, _ = answers(model_dir)
    onnx_file = exported(model_dir, "onnx", tmp_path)  # from the eager model, before it serves TorchScript
    save_format(model_dir, "torchscript", artifact=exported(model_dir, "torchscript", tmp_path))
    with pytest.warns(HandlerkitWarning, match=r"saved onnx into clf/, which TorchServe 0.12's own BaseHandler "
                      r"does not serve(.|\n)*fix: serve the dir with a handler that subclasses hk.BaseHandler"):  # fmt: skip
        kept = save_format(model_dir, "onnx", artifact=onnx_file)
    assert kept.removed == [] and (model_dir / "model.torchscript.pt").is_file()  # kept unless asked

    with pytest.warns(HandlerkitWarning, match=r"override inference to call self.model.run"):
        onnx = save_format(model_dir, "onnx", artifact=onnx_file, replace=True)
    assert onnx.removed == ["model.torchscript.pt"] and not (model_dir / "model.torchscript.pt").exists()
    served, decisions = answers(model_dir)
    assert decisions.model_format == "onnx" and same_output(served, eager, 1e-4, 1e-4)
    assert "default inference calls the session like a module and fails" in onnx.torchserve

    back = save_format(model_dir, "eager", replace=True)
    assert back.removed == ["model.onnx"] and (model_dir / "model.pt").is_file()
    assert manifest(model_dir)["serializedFile"] == "model.pt" and manifest(model_dir)["modelFile"] == "model.py"
    served, decisions = answers(model_dir)
    assert decisions.model_format == "eager" and served == eager


def test_compile_sets_pt2_and_an_exported_format_turns_it_off(tmp_path):
    model_dir = write_model_dir(tmp_path / "mlp", MLP_MODEL_PY)
    saved = save_format(model_dir, "compile", compile_options={"backend": "eager"})
    assert saved.pt2 == {"compile": {"enable": True, "backend": "eager"}}
    assert manifest(model_dir)["configFile"] == "model-config.yaml"
    assert saved.notes == ["MAR-INF/MANIFEST.json was inferred from the files; it is written now"]
    h = hk.Harness.open(model_dir, BaseHandler)
    h.initialize()
    assert h.handler.decisions.compile.requested and h.handler.decisions.compile.options == {"backend": "eager"}
    eager = h.run([[1.0, 2.0, 3.0, 4.0]]).output

    example = (torch.zeros(2, 4),)
    artifact = export_model(h.handler.model._orig_mod, example, tmp_path / "mlp.pt2", "export")
    with pytest.warns(HandlerkitWarning, match=r"saved export into mlp/.*does not load a .pt2"):
        off = save_format(model_dir, "export", artifact=artifact)
    assert off.pt2 == {"compile": {"enable": False, "backend": "eager"}}
    h = hk.Harness.open(model_dir, BaseHandler)
    assert same_output(h.run([[1.0, 2.0, 3.0, 4.0]]).output, eager, 1e-5, 1e-5)
    assert h.handler.decisions.model_format == "export" and not h.handler.decisions.compile.requested
    assert "handlerkit only" in off.torchserve


def test_a_file_handlerkit_did_not_write_is_never_overwritten(tmp_path):
    model_dir = write_model_dir(tmp_path / "mlp", MLP_MODEL_PY, manifest=eager_manifest())
    (model_dir / "model.onnx").write_bytes(b"the user's own")
    with pytest.raises(HandlerkitError, match=r"model.onnx is already there and handlerkit did not write it") as info:
        plan_save(model_dir, "onnx")
    assert info.value.fix == "move or rename model.onnx, then save again"
    assert (model_dir / "model.onnx").read_bytes() == b"the user's own"


def test_bad_arguments_are_refused(tmp_path):
    model_dir = write_model_dir(tmp_path / "mlp", MLP_MODEL_PY)
    with pytest.raises(ValueError, match=r"cannot save format 'onx' \(did you mean 'onnx'\?\)"):
        plan_save(model_dir, "onx")
    with pytest.raises(ValueError, match=r"saving 'onnx' takes the exported file: got artifact=None"):
        save_format(model_dir, "onnx")
    with pytest.raises(ValueError, match=r"saving 'compile' takes no artifact"):
        save_format(model_dir, "compile", artifact=model_dir / "model.pt")
    with pytest.raises(HandlerkitError, match=r"saved into a model dir, and '.*nowhere' is none"):
        plan_save(tmp_path / "nowhere", "eager")


@pytest.mark.torchserve
def test_torchserve_worker_serves_the_saved_torchscript(tmp_path):
    from _vision_examples import ts_answers, ts_handler, ts_service

    model_dir = classifier_copy(tmp_path)
    eager, _ = answers(model_dir)
    save_format(model_dir, "torchscript", artifact=exported(model_dir, "torchscript", tmp_path))

    service = ts_service(model_dir, batch_size=4)
    assert isinstance(ts_handler(service).model, torch.jit.ScriptModule)
    assert same_output(ts_answers(service, batch()), eager, 1e-4, 1e-4)


@pytest.mark.torchserve
@pytest.mark.server
@pytest.mark.skipif(_missing is not None, reason=f"real TorchServe server: {_missing}")
def test_real_torchserve_serves_the_saved_torchscript_as_handlerkit_serves_the_eager_dir(tmp_path):
    from handlerkit import archive

    model_dir = classifier_copy(tmp_path)
    eager, _ = answers(model_dir)
    report = hk.Harness.open(model_dir).compare_formats(batch(), formats=[], save="torchscript", repeat=1, warmup=0)
    assert report.saved is not None and report.saved.torchserve_serves
    mar = archive.build(model_dir, tmp_path / "store", model_name="shapes_torchscript")
    packed = archive.inspect_archive(mar).manifest["model"]
    assert packed["serializedFile"] == "model.torchscript.pt" and "modelFile" not in packed
    assert packed["handler"] == "image_classifier"  # TorchServe's own, on its own BaseHandler

    with serving(tmp_path / "ts", {"shapes_torchscript": mar}, 180) as ts:
        served = []
        for image in IMAGES:
            resp = ts.predict("shapes_torchscript", image.read_bytes(), {"Content-Type": "image/png"})
            assert resp.status == 200, f"{resp}\n{ts.diagnostics(lines=25)}"
            served.append(resp.json())
    assert same_output(served, eager, 1e-4, 1e-4), (served, eager)
    assert [max(answer, key=answer.get) for answer in served] == ["circle", "cross", "square"]


@pytest.mark.parametrize(("fmt", "artifact"), [("onnx", "model.onnx"), ("export", "model.export.pt2")])
def test_a_saved_file_that_refuses_a_length_names_the_dimension_and_the_reexport(tmp_path, fmt, artifact):
    # A ranker saved the old way: exported from a batch padded to 7 items, its batch alone dynamic.
    model_dir = ranker_dir(tmp_path / "recs", base="handlerkit")
    eager = hk.Harness.open(model_dir)
    eager.initialize()
    example = (torch.tensor([1, 2]), torch.zeros(2, 7, dtype=torch.long), torch.ones(2, 7, dtype=torch.bool))
    exported = export_model(eager.handler.model, example, tmp_path / f"fixed.{artifact.rsplit('.', 1)[1]}", fmt)
    save_format(model_dir, fmt, artifact=exported, warn=False)

    h = hk.Harness.open(model_dir)
    with pytest.raises(StageError) as caught:
        h.run(hk.batch(hk.Request.json(ranker_request(1, [3, 5]))))
    error = caught.value
    assert isinstance(error.original, ArtifactShapeError) and error.stage == "inference"
    assert (
        f"ArtifactShapeError: {artifact} was exported for item_ids dim 1 = 7 and mask dim 1 = 7; this call gives 2 and 2 ("
        in error.message
    )
    assert error.original.refused == [("item_ids", 1, "= 7", 2), ("mask", 1, "= 7", 2)]
    assert error.fix == (
        f"re-export it with item_ids dim 1 and mask dim 1 dynamic: handlerkit formats {model_dir.resolve()} FILES "
        f"--formats {fmt} --save {fmt} --replace --dynamic item_ids:1,mask:1 (in a notebook: h.compare_formats(batch, "
        f"save={fmt!r}, replace=True, dynamic_shapes={{'item_ids': [1], 'mask': [1]}})); FILES whose requests differ "
        "in those sizes make the lab find them by itself"
    )
    assert "correct it there" not in str(error)
    # A batch of the exported length is served as before.
    assert h.run(hk.batch(hk.Request.json(ranker_request(1, [1, 2, 3, 4, 5, 6, 7])))).output[0][0]["item_id"] in range(
        1, 8
    )
