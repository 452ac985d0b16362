"""A bad request answered alone, served: four concurrent requests, one a truncated WAV, to the
audio handler of ``tests/_new_users.py`` once it validates its WAVs (``audio_dir(validating=True)``:
TorchServe's BaseHandler with ``hk.PerRequestErrors`` mixed in, ``self.refuse`` for a WAV it
cannot read), with ``batchSize: 4`` and a ``maxBatchDelay`` long enough that the four are one
batch. Three clients get 200 and their answers, the fourth 400 and its own
``{"code", "error", "fix"}``. The same handler raising ``hk.RequestError`` instead fails the whole
batch: every client gets that 400 (TorchServe's meaning).

- **Ray Serve**, as ``handlerkit serve`` deploys it (:func:`handlerkit.serving.ray.app`), both
  handlers in one local Ray instance; each request's ``X-Batch-Size`` response header (set by the
  handler) shows the four were one batch;
- **KServe**, through ``handlerkit serve --engine kserve`` (KServe's v1 route, the WAV base64 in
  an instance): KServe's model server has no batching of its own, so each request is a batch of
  one (batching on KServe is for a later issue): the same outcome, three 200 and one 400;
- **TorchServe 0.12** itself, the reference: the same archive and requests give the same
  answers, so the per-request status is TorchServe's contract, not handlerkit's.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _new_users import AUDIO_SEND, TRUNCATED_WAV_ERROR, audio_dir, truncated_wav, wav_bytes
from _ts_server import Response, archive, missing_requirements, request, serving

import handlerkit as hk

#: One batch of four: the frontend waits up to 5 s for the fourth (a full batch leaves at once).
CONFIG = "minWorkers: 1\nmaxWorkers: 1\nbatchSize: 4\nmaxBatchDelay: 5000\nresponseTimeout: 120\n"
BODIES = [wav_bytes(440.0), wav_bytes(None), truncated_wav(), wav_bytes(3000.0)]
BAD = 2
REFUSED = {"code": 400, "error": TRUNCATED_WAV_ERROR, "fix": AUDIO_SEND}
WAV = {"Content-Type": "audio/wav"}


def _model_dir(path: Path, bad_wav: str) -> Path:
    model = audio_dir(path, validating=True, bad_wav=bad_wav)
    (model / "model-config.yaml").write_text(CONFIG)
    manifest = json.loads((model / "MAR-INF" / "MANIFEST.json").read_text())
    manifest["model"]["configFile"] = "model-config.yaml"  # as torch-model-archiver --config-file writes it
    (model / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest))
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sounds")
    return {bad_wav: _model_dir(root / bad_wav, bad_wav) for bad_wav in ("refuse", "raise")}


@pytest.fixture(scope="module")
def alone(models: dict[str, Path]) -> list[Any]:
    """What the harness answers each good request alone (None for the bad one)."""
    h = hk.Harness.open(models["refuse"])
    return [None if i == BAD else h.run(hk.batch(hk.Request.from_bytes(body, "audio/wav"))).output[0]
            for i, body in enumerate(BODIES)]  # fmt: skip


def _concurrently(send: Callable[[bytes], Response], bodies: list[bytes]) -> list[Response]:
    """``send(body)`` for every body at once, each from its own thread; the answers in order."""
    barrier = threading.Barrier(len(bodies))
    results: list[Any] = [None] * len(bodies)

    def post(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            results[i] = send(bodies[i])
        except BaseException as exc:  # reported below
            results[i] = exc

    threads = [threading.Thread(target=post, args=(i,), daemon=True) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=150)
    missing = [(i, r) for i, r in enumerate(results) if not isinstance(r, Response)]
    assert not missing, f"requests without an answer: {missing}"
    return results


def _same_answer(served: Any, local: Any) -> bool:
    # The handler rounds each probability to 4 places: a request batched with others may land
    # on the other side of a rounding step than alone (the model's floats differ by ~1e-7).
    return served.keys() == local.keys() and all(abs(served[k] - local[k]) <= 1.01e-4 for k in served)


def _assert_one_refused(answers: list[Response], bodies: list[Any], alone: list[Any], batch_size: str | None) -> None:
    statuses = [r.status for r in answers]
    assert statuses == [200, 200, 400, 200], [str(r) for r in answers]
    assert bodies[BAD] == REFUSED
    for i, body in enumerate(bodies):
        if i != BAD:
            assert _same_answer(body, alone[i]), (i, body, alone[i])
    if batch_size is not None:  # what the handler saw: one batch of four
        assert [r.header("X-Batch-Size") for r in answers] == [batch_size] * 4


# ---------------------------------------------------------------------------------- Ray Serve
@pytest.fixture(scope="module")
def ray_port(models: dict[str, Path]) -> Iterator[int]:
    from _serving import ray_apps

    with ray_apps({"refusing": models["refuse"], "raising": models["raise"]}) as port:
        yield port


def _ray_post(port: int, prefix: str) -> Callable[[bytes], Response]:
    return lambda body: request(port, "POST", f"/{prefix}/predictions/sounds", body, WAV, timeout=120)


@pytest.mark.ray
def test_ray_answers_the_bad_wav_of_a_batch_alone(ray_port: int, alone: list[Any]) -> None:
    answers = _concurrently(_ray_post(ray_port, "refusing"), BODIES)
    _assert_one_refused(answers, [r.json() for r in answers], alone, batch_size="4")


@pytest.mark.ray
def test_ray_fails_the_whole_batch_when_the_handler_raises(ray_port: int) -> None:
    answers = _concurrently(_ray_post(ray_port, "raising"), BODIES)
    assert [r.status for r in answers] == [400] * 4, [str(r) for r in answers]  # the good ones too: one batch
    documents = [r.json() for r in answers]
    assert all(document == documents[0] for document in documents)
    assert documents[0]["type"] == "InternalServerException" and documents[0]["code"] == 400
    assert re.fullmatch(rf"request [0-3]: {TRUNCATED_WAV_ERROR}\n  fix: {re.escape(AUDIO_SEND)}", documents[0]["message"])


# ---------------------------------------------------------------------------------- KServe
@pytest.fixture(scope="module")
def kserve_url(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``handlerkit serve MODEL --engine kserve``, as an operator runs it: the v1 URL it prints."""
    err = tmp_path_factory.mktemp("kserve") / "stderr.txt"
    command = [sys.executable, "-m", "handlerkit.cli", "serve", str(models["refuse"]), "--engine", "kserve",
               "--port", "0", "--for", "300"]  # fmt: skip
    with open(err, "w") as stderr:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        lines = [proc.stdout.readline() for _ in range(2)]  # type: ignore[union-attr]
        found = re.fullmatch(r"  v1: (http://127\.0\.0\.1:\d+/v1/models/sounds) .*\n", lines[1])
        assert found, (lines, err.read_text()[-3000:])
        yield found.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_kserve_answers_the_bad_wav_alone(kserve_url: str, alone: list[Any]) -> None:
    port = int(kserve_url.split(":")[2].split("/")[0])

    def send(body: bytes) -> Response:
        document = {"instances": [{"data": base64.b64encode(body).decode("ascii")}]}
        return request(port, "POST", "/v1/models/sounds:predict", json.dumps(document).encode(),
                       {"Content-Type": "application/json"}, timeout=120)  # fmt: skip

    answers = _concurrently(send, BODIES)
    bodies = [r.json()["predictions"] for r in answers]
    assert all(len(body) == 1 for body in bodies), bodies  # one instance each
    # No batching on KServe's model server: each request is a batch of one.
    _assert_one_refused(answers, [body[0] for body in bodies], alone, batch_size=None)


# ---------------------------------------------------------------------------------- TorchServe 0.12
_missing = missing_requirements()


@pytest.fixture(scope="module")
def torchserve(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    store = tmp_path_factory.mktemp("store")
    mars = {
        f"sounds_{bad_wav}": archive(
            name=f"sounds_{bad_wav}", version="1.0", model_file=model / "model.py",
            serialized_file=model / "model.pt", handler=model / "handler.py",
            extra_files=[model / "index_to_name.json"], config_file=model / "model-config.yaml", export_path=store,
        )
        for bad_wav, model in models.items()
    }  # fmt: skip
    with serving(tmp_path_factory.mktemp("ts"), mars, 120) as server:
        yield server


@pytest.mark.torchserve
@pytest.mark.server
@pytest.mark.skipif(_missing is not None, reason=f"real TorchServe server: {_missing}")
def test_torchserve_answers_as_handlerkit_serve_does(torchserve: Any, alone: list[Any]) -> None:
    answers = _concurrently(lambda body: torchserve.predict("sounds_refuse", body, WAV, timeout=120), BODIES)
    _assert_one_refused(answers, [r.json() for r in answers], alone, batch_size="4")
    answers = _concurrently(lambda body: torchserve.predict("sounds_raise", body, WAV, timeout=120), BODIES)
    assert [r.status for r in answers] == [400] * 4, [str(r) for r in answers]
    documents = [r.json() for r in answers]
    assert all(document == documents[0] for document in documents)
    assert re.fullmatch(rf"request [0-3]: {TRUNCATED_WAV_ERROR}\n  fix: {re.escape(AUDIO_SEND)}", documents[0]["message"])
