"""TextHandler: TorchServe's text normalisation, a vocabulary file, n-grams, per-request errors.

The steps are TorchServe 0.12's (``ts/torch_handler/text_handler.py`` and
``text_classifier.py``), in its order, written without torchtext:

1. :func:`remove_html_tags` — tags ``<...>`` and entities ``&amp;``, ``&#39;``, ``&#x27;``;
2. lower case;
3. :func:`expand_contractions` — ``don't`` → ``do not`` (``_contractions.CONTRACTIONS``),
   then every ``'`` is dropped;
4. :func:`remove_accents` — NFKD, then every non-ASCII character is dropped (so ``café`` →
   ``cafe``, and text in other scripts disappears);
5. :func:`remove_punctuation` — ``string.punctuation`` deleted (``state-of-the-art`` →
   ``stateoftheart``);
6. :func:`basic_english_tokenize` — torchtext's ``basic_english`` tokenizer;
7. :func:`ngrams` — the tokens, then every 2-gram, ... up to ``ngrams`` (2, as TorchServe).

Where the result differs from TorchServe's, it is on purpose: a tag or entity becomes a space
(TorchServe deletes it, so ``movie.<br />The`` gives the token ``moviethe``), and a contraction
is expanded only as a whole word, longest first (TorchServe's pattern matches inside words —
``visit's`` → ``visit is`` — and stops at ``can't`` in ``can't've``), and ``'cause`` gives
``because`` (TorchServe's keeps the apostrophe for the first letter: ``ecause``).

**The vocabulary** (:mod:`handlerkit.handlers.vocabulary`): ``vocab.txt`` in the model dir (or
``handler: {vocab: <file>}``), one entry per line in row order, the unknown entry first; where
there is none, TorchServe's own: the manifest's ``sourceVocab``, else ``source_vocab.pt`` (a
mapping entry → row, or a pickled torchtext vocabulary).
"""

from __future__ import annotations

import os
import re
import string
import unicodedata
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from handlerkit._stack import user_stacklevel
from handlerkit.errors import ConfigError, HandlerkitError, HandlerkitWarning, ModelLoadError, RequestError
from handlerkit.handlers._contractions import CONTRACTIONS
from handlerkit.handlers.base import BaseHandler, HandlerDecisions, timed
from handlerkit.handlers.request_errors import payload_kind, request_error
from handlerkit.handlers.vocabulary import Vocabulary, load_source_vocab
from handlerkit.worker.batches import payload as request_payload

__all__ = [
    "TextBatch",
    "TextHandler",
    "TextScores",
    "Vocabulary",
    "basic_english_tokenize",
    "expand_contractions",
    "ngrams",
    "normalise",
    "remove_accents",
    "remove_html_tags",
    "remove_punctuation",
]

# ---------------------------------------------------------------------------- normalisation
# A tag runs from "<" to the next ">" on the same line; entities are named, decimal or hex.
_HTML = re.compile(r"<[^>\n]*>|&(?:[a-z0-9]+|#[0-9]{1,6}|#x[0-9a-f]{1,6});")
# Longest first, so "can't've" wins over "can't"; whole words only.
_CONTRACTION = re.compile(
    r"(?<!\w)(?:" + "|".join(re.escape(c) for c in sorted(CONTRACTIONS, key=len, reverse=True)) + r")(?!\w)",
    flags=re.IGNORECASE,
)
_NO_PUNCTUATION = str.maketrans("", "", string.punctuation)
# torchtext's basic_english, in its order: (text, replacement) applied one after the other.
_BASIC_ENGLISH = (
    ("'", " '  "),
    ('"', ""),
    (".", " . "),
    ("<br />", " "),
    (",", " , "),
    ("(", " ( "),
    (")", " ) "),
    ("!", " ! "),
    ("?", " ? "),
    (";", " "),
    (":", " "),
)


def remove_html_tags(text: str) -> str:
    """Tags and character entities replaced by a space (TorchServe deletes them)."""
    return _HTML.sub(" ", text)


def expand_contractions(text: str) -> str:
    """``don't`` → ``do not`` (``Don't`` → ``Do not``), then every ``'`` dropped."""
    if "'" not in text:
        return text

    def expand(match: re.Match[str]) -> str:
        word = match.group(0)
        expansion = CONTRACTIONS[word.lower()]
        return expansion[0].upper() + expansion[1:] if word[0].isupper() else expansion

    return _CONTRACTION.sub(expand, text).replace("'", "")


def remove_accents(text: str) -> str:
    """NFKD, then only ASCII kept: accents come off letters, other characters go."""
    return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")


def remove_punctuation(text: str) -> str:
    """Every character of ``string.punctuation`` deleted."""
    return text.translate(_NO_PUNCTUATION)


def basic_english_tokenize(text: str) -> list[str]:
    """torchtext's ``basic_english``: lower case, ``. , ( ) ! ? '`` split off as tokens, ``"``
    deleted, ``; :`` and ``<br />`` as spaces, then split on whitespace."""
    text = text.lower()
    for old, new in _BASIC_ENGLISH:
        text = text.replace(old, new)
    return text.split()


def normalise(text: str) -> str:
    """Steps 1-5 of TorchServe's text classifier (module docstring), as one string."""
    text = remove_html_tags(text).lower()
    return remove_punctuation(remove_accents(expand_contractions(text)))


def ngrams(tokens: Sequence[str], n: int) -> list[str]:
    """The tokens, then every 2-gram, ..., n-gram, words joined by a space (torchtext's order)."""
    out = list(tokens)
    for size in range(2, n + 1):
        out.extend(" ".join(tokens[i : i + size]) for i in range(len(tokens) - size + 1))
    return out


# ---------------------------------------------------------------------------- batches
class TextBatch(NamedTuple):
    """What :meth:`TextHandler.preprocess` gives: EmbeddingBag input for the requests that could
    be read, and per request what happened.

    Attributes:
        text: int64 [total entries], every readable request's rows, one after the other.
        offsets: int64 [readable requests], where each one starts in ``text``.
        features: per request, its tokens and n-grams (None where it failed).
        errors: request index -> the :class:`RequestError` that request gets as its answer.
    """

    text: torch.Tensor
    offsets: torch.Tensor
    features: list[list[str] | None]
    errors: dict[int, RequestError]

    @property
    def readable(self) -> list[int]:
        """The indices of the requests that reach the model, in batch order."""
        return [i for i, f in enumerate(self.features) if f is not None]


class TextScores(NamedTuple):
    """What :meth:`TextClassifier.inference` gives: the model's scores for the readable
    requests (None when there are none) and the batch they came from (for its errors)."""

    scores: torch.Tensor | None
    batch: TextBatch


# ---------------------------------------------------------------------------- the handler
class TextHandler(BaseHandler):
    """Base of the text handlers: each request's ``data`` or ``body`` is one text.

    Accepted per request, as TorchServe's text classifier reads it: a ``str`` (a ``text/*``
    body, or a JSON string), or UTF-8 ``bytes``/``bytearray`` (any other content type). Unlike
    TorchServe's, which reads only the first request of a batch, every request is read, and a
    request that cannot be — not UTF-8, empty, JSON that is not a string, longer than
    ``max_text_chars``, no words left after normalisation — gets its own error item and a 4xx
    status (``context.set_response_status``) while the others are answered.

    ``handler:`` keys read from model-config.yaml: ``vocab`` (file name, default ``vocab.txt``),
    ``ngrams`` (default 2), ``max_text_chars`` (default 100 000; longer texts get 413).

    TorchServe's method names are kept (``_remove_html_tags``, ``_expand_contractions``,
    ``_remove_accented_characters``, ``_remove_punctuation``, ``_tokenize``, ``get_word_token``)
    and ``source_vocab`` is the :class:`Vocabulary`, so subclasses written for TorchServe run.
    """

    ngrams = 2
    max_text_chars = 100_000
    vocab_file = "vocab.txt"

    def __init__(self) -> None:
        super().__init__()
        self.source_vocab: Vocabulary | None = None
        self.tokenizer = basic_english_tokenize
        self.lig = None  # TorchServe's attribute; explanations build their own (text_classifier)

    def _initialize(self, context: Any, decisions: HandlerDecisions) -> None:
        # Inside BaseHandler's all-or-nothing initialize: a bad vocabulary leaves no model loaded.
        self.source_vocab = None
        super()._initialize(context, decisions)
        settings = self.settings
        cls = type(self)
        self.ngrams = _positive_int(settings.get("ngrams", cls.ngrams), "ngrams")
        self.max_text_chars = _positive_int(settings.get("max_text_chars", cls.max_text_chars), "max_text_chars")
        name = settings.get("vocab", cls.vocab_file)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"handler.vocab must be a file name, got {name!r}", fix="write e.g. vocab: vocab.txt")
        vocab, path = self._load_vocabulary(context, name, explicit="vocab" in settings)
        rows = _embedding_rows(self.model)
        if rows is not None and len(vocab) > rows:
            raise ModelLoadError(
                f"{path} has {len(vocab)} entries but the model's embedding has {rows} rows",
                path=path,
                fix="use the vocabulary the model was trained with",
            )
        self.source_vocab = vocab
        note = (
            f"vocabulary {path}: {len(vocab)} entries, up to {vocab.max_words}-word entries, "
            f"unknown {vocab.itos[vocab.unk_index]!r}; ngrams={self.ngrams}; max_text_chars={self.max_text_chars}"
        )
        decisions.notes.append(note)
        if vocab.max_words != self.ngrams:
            warnings.warn(
                f"handlerkit: the vocabulary's longest entries have {vocab.max_words} word(s) but the handler "
                f"makes n-grams up to {self.ngrams}: "
                + (
                    "every longer n-gram is looked up as unknown"
                    if vocab.max_words < self.ngrams
                    else "its longer entries are never used"
                )
                + f"; set handler: {{ngrams: {vocab.max_words}}} if the model was trained that way",
                HandlerkitWarning,
                stacklevel=user_stacklevel(),
            )

    def _load_vocabulary(self, context: Any, name: str, *, explicit: bool) -> tuple[Vocabulary, str]:
        """``name`` in the model dir; where there is none (and it was not asked for by name),
        TorchServe's: the manifest's ``sourceVocab`` (relative to the model dir, where the worker
        runs), else ``source_vocab.pt``. Raises ModelLoadError naming every place looked."""
        model_dir = context.system_properties.get("model_dir") or "."
        path = os.path.join(model_dir, name)
        if os.path.isfile(path):
            return Vocabulary.from_file(path), path
        looked = [path]
        if not explicit:
            source = ((getattr(context, "manifest", None) or {}).get("model") or {}).get("sourceVocab")
            for candidate in ([os.path.join(model_dir, source)] if source else []) + [
                os.path.join(model_dir, "source_vocab.pt")
            ]:
                if os.path.isfile(candidate):
                    return load_source_vocab(candidate), candidate
                looked.append(candidate)
        raise ModelLoadError(
            "no vocabulary: looked for " + ", ".join(dict.fromkeys(looked)),
            path=path,
            fix="write the vocabulary one entry per line, the unknown entry (<unk>) first, as vocab.txt in the "
            "model dir, or archive TorchServe's source_vocab.pt with the model (--extra-files source_vocab.pt)",
        )

    # -------------------------------------------------------------- one request
    def read_text(self, row: Any, index: int) -> str:
        """Request ``index``'s text, or a :class:`RequestError` saying what to send instead."""
        payload = request_payload(row)
        fix = "send the text as the request body (text/plain; charset=utf-8) or as a JSON string"
        if payload is None:
            got = f"fields {sorted(row)}" if isinstance(row, dict) else f"a {type(row).__name__}"
            raise request_error(index, f"no text under 'data' or 'body' (got {got})", fix)
        limit = self.max_text_chars
        too_long = "split it into several requests, or raise handler: {max_text_chars: N} in model-config.yaml"
        if isinstance(payload, (bytes, bytearray, memoryview)):
            if len(payload) > 4 * limit:  # UTF-8 takes at most 4 bytes a character
                what = f"the body has {len(payload):,} bytes, more than {limit:,} characters can take"
                raise request_error(index, what, too_long, 413)
            try:
                payload = bytes(payload).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise request_error(
                    index,
                    f"the body is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at position {exc.start})",
                    "encode the text as UTF-8 (Latin-1 and UTF-16 are not read)",
                ) from exc
        if not isinstance(payload, str):
            raise request_error(
                index,
                f"{payload_kind(payload)} is not text",
                fix + " (TorchServe's text classifier reads no JSON fields either)",
            )
        if not payload.strip():
            raise request_error(index, "the body is empty" if not payload else "the text is only whitespace", fix)
        if len(payload) > limit:
            raise request_error(
                index, f"the text has {len(payload):,} characters; this handler takes at most {limit:,}", too_long, 413
            )
        return payload

    def features(self, text: str) -> list[str]:
        """The tokens of ``text`` after normalisation, then its n-grams."""
        return ngrams(self._tokenize(normalise(text)), self.ngrams)

    # -------------------------------------------------------------- TorchServe's names
    def _remove_html_tags(self, text: str) -> str:
        return remove_html_tags(text)

    def _expand_contractions(self, text: str) -> str:
        return expand_contractions(text)

    def _remove_accented_characters(self, text: str) -> str:
        return remove_accents(text)

    def _remove_punctuation(self, text: str) -> str:
        return remove_punctuation(text)

    _remove_puncutation = _remove_punctuation  # TorchServe's original spelling

    def _tokenize(self, text: str) -> list[str]:
        return self.tokenizer(text)

    def get_word_token(self, input_tokens: Sequence[str]) -> list[str]:
        """Tokens without the ``Ġ`` of BPE tokenizers (TorchServe's helper)."""
        return [token.replace("Ġ", "") for token in input_tokens]

    # -------------------------------------------------------------- the batch
    @timed
    def preprocess(self, data: list[Any]) -> TextBatch:
        """Every request to vocabulary rows; a request that cannot be read gets its error
        (and its 4xx status) here and is left out of the model's input."""
        vocab = self.source_vocab
        if vocab is None:
            raise HandlerkitError(
                "preprocess ran before initialize loaded the vocabulary", fix="call initialize(context) first"
            )
        rows: list[int] = []
        offsets: list[int] = []
        features: list[list[str] | None] = []
        for index, row in enumerate(data):
            try:
                text = self.read_text(row, index)
                found = self.features(text)
                if not found:
                    raise request_error(
                        index,
                        f"no words are left after normalisation (tags, accents, punctuation removed) of {text[:40]!r}",
                        "send text with at least one word in Latin letters or digits",
                    )
            except RequestError as exc:
                self.refuse(index, exc)
                features.append(None)
                continue
            offsets.append(len(rows))
            rows.extend(vocab.lookup(found))
            features.append(found)
        return TextBatch(
            torch.as_tensor(rows, dtype=torch.long, device=self.device),
            torch.as_tensor(offsets, dtype=torch.long, device=self.device),
            features,
            dict(self.refused),
        )


def _positive_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"handler.{key} must be a positive integer, got {value!r}", fix=f"write e.g. {key}: 2")
    return value


def _embedding_rows(model: Any) -> int | None:
    """The row count of the model's ``embedding`` (TorchServe's attribute name), when it has one."""
    module = getattr(model, "_orig_mod", model)
    rows = getattr(getattr(module, "embedding", None), "num_embeddings", None)
    return rows if isinstance(rows, int) else None
