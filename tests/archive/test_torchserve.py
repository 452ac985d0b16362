"""Round trips between handlerkit.archive and the real TorchServe 0.12.

- An archive built by ``handlerkit.archive.build`` — as a ``.mar``, a ``.tar.gz`` and a
  ``no-archive`` folder — is served by a live TorchServe (one server for the module, on
  loopback, started and stopped with tests/_ts_server.py's helpers), which answers what
  ``Harness.run`` on the same archive (``MockContext.from_mar``) predicts, and reports the
  manifest's version and the archived model config.
- So is a ``.tar.gz`` built from a project's model dir (no manifest; a training script and a
  ``.env`` beside the model): the handler imports a module of the dir, which the archive holds
  because the handler imports it, and the worker finds it.

The other way round (an archive built by the real ``torch-model-archiver`` opens in handlerkit
with the same manifest) needs no server: tests/archive/test_archive.py.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _ts_server import TorchServe, missing_requirements, serving

_missing = missing_requirements()
pytestmark = [
    pytest.mark.torchserve,
    pytest.mark.server,
    pytest.mark.skipif(_missing is not None, reason=f"real TorchServe server: {_missing}"),
]

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "fixtures" / "models" / "image_classifier"
IMAGES = [REPO / "fixtures" / "images" / name for name in ("circle.png", "star.jpg")]
ATOL = 1e-5
STARTUP_TIMEOUT_S = 180

#: handlerkit's ImageClassifier in a handler file, so the worker imports handlerkit.
HANDLER = '''\
"""handlerkit's ImageClassifier, archived by handlerkit.archive (tests/archive/test_torchserve.py)."""
from handlerkit.handlers.image_classifier import ImageClassifier


class Shapes(ImageClassifier):
    pass
'''

#: A handler importing a module of its model dir (TorchServe wants one class in the handler module).
PROJECT_HANDLER = '''\
from shapes_base import ShapesBase


class Shapes(ShapesBase):
    pass
'''
PROJECT_FILES = {
    "handler.py": PROJECT_HANDLER,
    "shapes_base.py": "from handlerkit.handlers.image_classifier import ImageClassifier\n\n\n"
                      "class ShapesBase(ImageClassifier):\n    pass\n",
    "train.py": "raise SystemExit('not for serving')\n",
    ".env": "TOKEN=secret\n",
}

#: Model name -> archive format; shapes_project is built from a project's model dir, the others from DEMO.
FORMS = {"shapes_mar": "default", "shapes_tgz": "tgz", "shapes_dir": "no-archive", "shapes_project": "tgz"}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Model name -> what handlerkit.archive.build wrote into a fresh model store."""
    from handlerkit import archive

    root = tmp_path_factory.mktemp("hk-archives")
    handler = root / "src" / "shapes_handler.py"
    handler.parent.mkdir()
    handler.write_text(HANDLER)
    store = root / "store"
    project = root / "project"
    project.mkdir()
    for name in ("model.py", "model.pt", "model-config.yaml", "index_to_name.json"):
        shutil.copy(DEMO / name, project / name)
    for name, text in PROJECT_FILES.items():
        (project / name).write_text(text)
    built = {
        name: archive.build(DEMO, store, model_name=name, handler=str(handler), version="2.5", archive_format=fmt)
        for name, fmt in FORMS.items() if name != "shapes_project"
    }
    built["shapes_project"] = archive.build(project, store, model_name="shapes_project", version="2.5",
                                            archive_format=FORMS["shapes_project"])  # fmt: skip
    packed = {f.name for f in archive.inspect_archive(built["shapes_project"]).files}
    assert packed == {"handler.py", "shapes_base.py", "model.py", "model.pt", "model-config.yaml", "index_to_name.json",
                      "MAR-INF/MANIFEST.json"}  # fmt: skip
    return built


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, built: dict[str, Path]) -> Iterator[TorchServe]:
    """One TorchServe serving every form, stopped at the end whatever happened."""
    with serving(tmp_path_factory.mktemp("ts-archive"), built, STARTUP_TIMEOUT_S) as ts:
        yield ts


def _harness(path: Path) -> Any:
    import handlerkit as hk

    ctx = hk.MockContext.from_model_dir(path)  # a .mar / .tar.gz is opened with from_mar
    h = hk.Harness(ctx.manifest["model"]["handler"], ctx)
    h.initialize()
    return h


def assert_same_prediction(served: dict[str, float], local: dict[str, float], what: str) -> None:
    assert list(served) == list(local) or set(served) == set(local), f"{what}: {served} vs {local}"
    worst = max(abs(served[k] - local[k]) for k in served)
    assert worst <= ATOL, f"{what}: differs by {worst:.2e}: server {served} vs harness {local}"


@pytest.mark.parametrize("name", sorted(FORMS))
def test_a_handlerkit_archive_serves_what_the_harness_predicts(server: TorchServe, built: dict[str, Path], name: str) -> None:
    import handlerkit as hk

    h = _harness(built[name])
    for image in IMAGES:
        content_type = "image/png" if image.suffix == ".png" else "image/jpeg"
        resp = server.predict(name, image.read_bytes(), {"Content-Type": content_type})
        assert resp.status == 200, f"{resp}\n{server.diagnostics(lines=25)}"
        run = h.run(hk.batch(hk.Request.from_file(image), decode=True))
        assert run.problems == []
        assert_same_prediction(resp.json(), run.output[0], f"{name} {image.name}")
    assert max(run.output[0], key=run.output[0].get) == "star"


def test_torchserve_reads_the_manifest_and_config_handlerkit_wrote(server: TorchServe, built: dict[str, Path]) -> None:
    for name in FORMS:
        described = server.management("GET", f"/models/{name}")
        assert described.status == 200, f"{described}\n{server.diagnostics(lines=25)}"
        (model,) = described.json()
        assert model["modelVersion"] == "2.5", model
        assert (model["batchSize"], model["maxBatchDelay"]) == (4, 50), model  # the archived model-config.yaml
        assert [w["status"] for w in model["workers"]] == ["READY"], model
