"""A text model's vocabulary: entry ↔ embedding row, read from handlerkit's ``vocab.txt`` or from
TorchServe's ``source_vocab.pt``.

**vocab.txt**: UTF-8, one entry per line; the line number, counted from 0, is the entry's row in
the model's embedding. The first line (row 0) is the entry for everything not in the file
(conventionally ``<unk>``); an n-gram entry is its words joined by one space (``new york``). No
blank lines, no duplicates, no surrounding spaces.

**source_vocab.pt** (what pytorch/serve's ``examples/text_classification`` saves, named by the
manifest's ``sourceVocab`` or found in the model dir): either a mapping entry → row (a
torchtext vocabulary's ``get_stoi()``, saved with ``torch.save``), read with
``weights_only=True``; or a pickled torchtext vocabulary, which only torchtext can unpickle:
with torchtext installed it is read (the model dir is trusted, as TorchServe's worker trusts
it), without it the error says so. Where TorchServe's handler would fail on a word the mapping
lacks (``KeyError``), this one maps it to the unknown entry: ``<unk>``'s row, which the
mapping must have.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping
from typing import Any

from handlerkit.errors import ModelLoadError

__all__ = ["Vocabulary", "load_source_vocab"]

_UNKNOWN = "<unk>"


class Vocabulary:
    """Entry ↔ embedding row; anything unknown maps to :attr:`unk_index` (module docstring).

    ``vocab[entry]`` gives the row as torchtext's ``Vocab`` with a default index does, so a
    TorchServe handler written against ``self.source_vocab[token]`` keeps working.
    """

    def __init__(self, entries: Iterable[str], path: str | None = None, unk_index: int = 0):
        self.itos: list[str] = list(entries)
        self.path = path
        #: The row of everything not in the vocabulary (row 0 in a vocab.txt).
        self.unk_index = unk_index
        self.stoi: dict[str, int] = {}
        problems = []
        for i, entry in enumerate(self.itos):
            if not entry or entry != " ".join(entry.split()):
                problems.append(f"line {i + 1}: {entry!r} is blank or has extra spaces")
            elif entry in self.stoi:
                problems.append(f"line {i + 1}: {entry!r} repeats line {self.stoi[entry] + 1}")
            else:
                self.stoi[entry] = i
        if not self.itos:
            problems.append("it has no entries (the first line must be the unknown entry, e.g. <unk>)")
        if problems:
            where = path or "the vocabulary"
            raise ModelLoadError(
                f"{where}: "
                + "; ".join(problems[:5])
                + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""),
                path=path,
                fix="write one entry per line, each once, words separated by one space; the first line is the unknown entry",
            )
        #: The most words in one entry: the vocabulary's n-gram order.
        self.max_words = max(len(entry.split(" ")) for entry in self.itos)

    @classmethod
    def from_file(cls, path: str) -> Vocabulary:
        """Read a vocabulary file (UTF-8, one entry per line)."""
        try:
            with open(path, encoding="utf-8", newline="") as f:
                text = f.read()
        except UnicodeDecodeError as exc:
            raise ModelLoadError(f"{path} is not UTF-8 ({exc})", path=path, fix="save it as UTF-8") from exc
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()  # the final newline
        return cls([line.removesuffix("\r") for line in lines], path=path)

    def to_text(self) -> str:
        """The file's content: one entry per line, a final newline."""
        return "".join(entry + "\n" for entry in self.itos)

    def __len__(self) -> int:
        return len(self.itos)

    def __getitem__(self, entry: str) -> int:
        return self.stoi.get(entry, self.unk_index)

    def __contains__(self, entry: object) -> bool:
        return entry in self.stoi

    def lookup(self, entries: Iterable[str]) -> list[int]:
        """The rows of ``entries``, unknown ones as :attr:`unk_index`."""
        get, unk = self.stoi.get, self.unk_index
        return [get(entry, unk) for entry in entries]

    @classmethod
    def from_mapping(cls, mapping: Mapping[Any, Any], path: str | None = None) -> Vocabulary:
        """From entry → row (rows 0 … n-1, each once), the unknown entry being ``<unk>``."""
        rows = sorted(mapping.items(), key=lambda kv: kv[1] if isinstance(kv[1], int) else -1)
        problems = [
            f"{entry!r} → {row!r}" for entry, row in rows if not isinstance(entry, str) or not isinstance(row, int)
        ]
        if problems or [row for _, row in rows] != list(range(len(rows))):
            raise ModelLoadError(
                f"{path or 'the vocabulary'}: a mapping must give each entry (a str) its own row, 0 to "
                f"{len(rows) - 1}"
                + (f"; it has {', '.join(problems[:3])}" if problems else "; rows are missing or repeated"),
                path=path,
                fix="save vocab.get_stoi() of the vocabulary the model was trained with",
            )
        if _UNKNOWN not in mapping:
            raise ModelLoadError(
                f"{path or 'the vocabulary'} has no {_UNKNOWN!r} entry: a word it lacks would have no row "
                "(TorchServe's handler fails on one with a KeyError)",
                path=path,
                fix=f"add {_UNKNOWN!r} to the vocabulary the model was trained with, or write vocab.txt with the unknown entry first",
            )
        return cls([entry for entry, _ in rows], path=path, unk_index=mapping[_UNKNOWN])

    def __repr__(self) -> str:
        unknown = self.itos[self.unk_index]
        return f"Vocabulary({len(self)} entries, up to {self.max_words}-word entries, unknown={unknown!r})"


def load_source_vocab(path: str) -> Vocabulary:
    """TorchServe's ``source_vocab.pt``: a mapping entry → row, or a pickled torchtext vocabulary
    (module docstring).

    Raises:
        ModelLoadError: not a vocabulary; a torchtext one without torchtext installed.
    """
    import torch

    try:
        loaded = torch.load(path, weights_only=True)
    except Exception as exc:  # weights_only refuses any class but torch's own: a torchtext Vocab
        if importlib.util.find_spec("torchtext") is None:
            raise ModelLoadError(
                f"{path} is not a plain mapping ({type(exc).__name__}: {str(exc).splitlines()[0]}); a pickled "
                "torchtext vocabulary needs torchtext to be read, and torchtext is not installed",
                path=path,
                fix="pip install torchtext (its last release pins an old torch), or, where torchtext runs, write "
                "'\\n'.join(vocab.get_itos()) to vocab.txt in the model dir",
            ) from exc
        loaded = torch.load(path, weights_only=False)  # the model dir is trusted, as by TorchServe's worker
    if isinstance(loaded, Mapping):
        return Vocabulary.from_mapping(loaded, path)
    stoi = getattr(loaded, "get_stoi", None)  # torchtext >= 0.10
    mapping = stoi() if callable(stoi) else getattr(loaded, "stoi", None)  # the legacy Vocab
    if isinstance(mapping, Mapping):
        return Vocabulary.from_mapping(mapping, path)
    raise ModelLoadError(
        f"{path} holds a {type(loaded).__name__}, not a vocabulary (a mapping entry → row, or a torchtext vocabulary)",
        path=path,
        fix="save vocab.get_stoi() with torch.save, or write vocab.txt",
    )
