"""handlerkit.handlers.vocabulary: vocab.txt, and TorchServe's source_vocab.pt (a mapping, or a
pickled torchtext vocabulary)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from handlerkit.errors import ModelLoadError
from handlerkit.handlers.vocabulary import Vocabulary, load_source_vocab


class LegacyVocab:
    """Stands in for a pickled torchtext vocabulary (its class is no torch class)."""

    def __init__(self, stoi):
        self._stoi = dict(stoi)

    def get_stoi(self):
        return dict(self._stoi)


STOI = {"<unk>": 0, "<pad>": 1, "rain": 2, "heavy": 3, "heavy rain": 4}


def test_a_file_and_a_mapping_give_the_same_rows(tmp_path):
    (tmp_path / "vocab.txt").write_text("".join(f"{e}\n" for e in STOI), encoding="utf-8")
    from_file = Vocabulary.from_file(str(tmp_path / "vocab.txt"))
    from_map = Vocabulary.from_mapping(STOI)
    assert from_file.itos == from_map.itos == list(STOI)
    assert from_map.lookup(["heavy rain", "snow"]) == [4, 0] and from_map["rain"] == 2
    assert from_map.max_words == 2


def test_the_unknown_row_is_where_the_mapping_puts_unk():
    moved = {"<pad>": 0, "<unk>": 1, "rain": 2}
    vocab = Vocabulary.from_mapping(moved)
    assert vocab.unk_index == 1 and vocab["snow"] == 1 and vocab.lookup(["snow", "rain"]) == [1, 2]
    assert "unknown='<unk>'" in repr(vocab)


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"rain": 0, "snow": 1}, "has no '<unk>' entry: a word it lacks would have no row"),
        ({"<unk>": 0, "rain": 2}, "rows are missing or repeated"),
        ({"<unk>": 0, "rain": 0}, "rows are missing or repeated"),
        ({"<unk>": 0, 7: 1}, "it has 7 → 1"),
    ],
)
def test_a_mapping_that_is_no_vocabulary_is_refused(mapping, message):
    with pytest.raises(ModelLoadError, match=message):
        Vocabulary.from_mapping(mapping, "source_vocab.pt")


def test_source_vocab_saved_as_a_mapping(tmp_path):
    path = tmp_path / "source_vocab.pt"
    torch.save(STOI, path)
    assert load_source_vocab(str(path)).itos == list(STOI)


def test_a_torchtext_vocabulary_without_torchtext_says_so(tmp_path, monkeypatch):
    path = tmp_path / "source_vocab.pt"
    torch.save(LegacyVocab(STOI), path)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchtext" else real(name, *a))
    with pytest.raises(ModelLoadError, match="torchtext vocabulary needs torchtext to be read, and torchtext is not installed") as info:
        load_source_vocab(str(path))
    assert "vocab.txt" in info.value.fix and "pip install torchtext" in info.value.fix


def test_a_torchtext_vocabulary_is_read_where_torchtext_is_installed(tmp_path, monkeypatch):
    path = tmp_path / "source_vocab.pt"
    torch.save(LegacyVocab(STOI), path)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "torchtext" else real(name, *a))
    assert load_source_vocab(str(path)).lookup(["heavy", "snow"]) == [3, 0]


def test_something_else_in_source_vocab_is_named(tmp_path):
    path = tmp_path / "source_vocab.pt"
    torch.save([1, 2, 3], path)
    with pytest.raises(ModelLoadError, match="holds a list, not a vocabulary"):
        load_source_vocab(str(path))
