"""The pictures of issue 28's "See it right" cases, saved as PNGs for a before/after comparison.

    PYTHONPATH=$PWD python docs/screenshots/pictures.py docs/screenshots/after

writes ``spectrogram.png`` (the audio model's preprocess output), ``wav_bytes.png`` (a WAV
request's body), ``explanation.png`` (the image classifier's captum attributions) and
``segmentation.png`` (the segmenter's inference output over its input images), and, when the
code can draw them, ``batch.png`` (``hk.show(batch)``) and ``segmenter_run.png`` (the whole run).
Run from the repository root (it reads ``fixtures/`` and ``tests/_new_users.py``).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import handlerkit as hk

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests._new_users import audio_dir, wav_bytes  # noqa: E402  (needs ROOT on the path)

MODELS, IMAGES = ROOT / "fixtures/models", ROOT / "fixtures/images"


def save(fig: object, path: Path) -> None:
    fig.savefig(path, dpi=100)  # type: ignore[attr-defined]
    print("wrote", path)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = audio_dir(Path(tmp) / "sounds")
        sounds = hk.Harness.open(model_dir)
        tones = [wav_bytes(220.0), wav_bytes(880.0), wav_bytes(2000.0), wav_bytes(None)]
        batch = hk.batch(*(hk.Request.from_bytes(t, "audio/wav") for t in tones))
        run = sounds.run(batch)
        save(hk.show(run.stages["preprocess"]), out / "spectrogram.png")
        save(hk.show(tones[0]), out / "wav_bytes.png")
        try:
            save(hk.show(batch), out / "batch.png")
        except Exception as exc:  # the before code may not draw it
            print("batch:", exc)

    classifier = hk.Harness("image_classifier", hk.MockContext.from_model_dir(MODELS / "image_classifier"))
    explained = classifier.run(hk.batch(hk.Request.from_file(IMAGES / "circle.png").with_headers(explain="True")))
    save(hk.show(explained.stages[next(reversed(explained.stages))]), out / "explanation.png")

    images = hk.batch(*(hk.Request.from_file(IMAGES / n) for n in ("circle.png", "star.jpg", "square.png")))
    segmenter = hk.Harness("image_segmenter", hk.MockContext.from_model_dir(MODELS / "image_segmenter"))
    run = segmenter.run(images)
    save(hk.show(run.stages["inference"]), out / "segmentation.png")
    save(hk.show(run), out / "segmenter_run.png")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/screenshots/after"))
