"""fixtures/models/text_generator: the streaming text generator the builder trains
(``fixtures/builder/generator.py``), its checkable answers, and its handler streaming under the
Harness exactly as under TorchServe 0.12's worker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from worker.test_streaming_torchserve import _assert_same_as_torchserve

import handlerkit as hk
from fixtures.builder import generator
from fixtures.builder.training import load_model_class

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT / generator.MODEL_DIR


@pytest.fixture(scope="module")
def model():
    model = load_model_class(MODEL_DIR / "model.py")()
    model.load_state_dict(torch.load(MODEL_DIR / "model.pt", weights_only=True))
    return model.eval()


def test_the_committed_files_are_the_builders():
    assert (MODEL_DIR / "handler.py").read_text() == generator.HANDLER_SOURCE.replace(
        "MAX_NEW_CHARS", str(generator.MAX_NEW_CHARS)
    )
    chars = json.loads((MODEL_DIR / "chars.json").read_text())
    assert chars == generator.characters()
    assert (MODEL_DIR / "model.py").read_text() == generator.MODEL_SOURCE.format(
        characters=len(chars), embed_dim=generator.EMBED_DIM, hidden=generator.HIDDEN
    )
    assert (MODEL_DIR / "model-config.yaml").read_text() == generator.MODEL_CONFIG
    assert (MODEL_DIR / "MAR-INF" / "MANIFEST.json").read_text() == generator.manifest_json()
    record = json.loads((MODEL_DIR / "accuracy.json").read_text())
    assert record["lines_completed"] == record["lines"] == len(generator.LINES)


@pytest.mark.parametrize("line", generator.LINES)
def test_two_words_give_back_their_line(model, line):
    prompt = generator.prompt_of(line)
    assert prompt + generator.complete(model, generator.characters(), prompt) == line


def test_every_line_starts_with_its_own_two_words():
    prompts = [generator.prompt_of(line) for line in generator.LINES]
    assert len(set(prompts)) == len(prompts)


@pytest.mark.torchserve
def test_the_handler_streams_each_completion_as_torchserves_worker_does():
    lines = [generator.LINES[0], generator.LINES[5], generator.LINES[11]]
    batch = hk.batch(
        hk.Request.text(generator.prompt_of(lines[0])),
        hk.Request.json({"prompt": generator.prompt_of(lines[1])}),
        hk.Request.from_bytes(generator.prompt_of(lines[2]).encode(), "application/octet-stream"),
    )
    run = _assert_same_as_torchserve(MODEL_DIR, batch)
    rests = [line[len(generator.prompt_of(line)) :] for line in lines]
    assert run.output == rests  # the answer is the whole completion
    # One chunk per generated character, per request, in order; shorter replies leave the batch.
    assert [(s.index, "".join(c.text for c in s.chunks)) for s in run.streams] == list(enumerate(rests))
    assert [len(s.chunks) for s in run.streams] == [len(rest) for rest in rests]
    longest = max(range(3), key=lambda i: len(rests[i]))
    last_frame = max(c.frame for c in run.chunks)
    assert {c.index for c in run.chunks if c.frame == last_frame} == {longest}
    assert run.problems == [] and all(s.first_chunk_ms is not None for s in run.streams)


@pytest.mark.torchserve
def test_a_character_the_model_does_not_know_is_refused_in_preprocess():
    with hk.Service.open(MODEL_DIR) as service:
        h = hk.Harness(service)
        with pytest.raises(hk.StageError, match=r"preprocess failed in TextGenerator .*characters the model does not know: 'Q'"):
            h.run(hk.batch(hk.Request.text("Quiz the handler")))
        assert h.run(hk.batch(hk.Request.text("a handler "))).output == ["turns each request into an answer."]
