"""handlerkit/viz/tokens.py: token ids as an HTML table of vocabulary entries, a row per request
(one per offset for EmbeddingBag input): every position, no word cut, n-grams after the words
and unknown entries marked."""

from __future__ import annotations

import html
import re

import torch
from _viz import ROOT

import handlerkit as hk
from handlerkit.viz.handler_view import HandlerView
from handlerkit.viz.panel import Context
from handlerkit.viz.shown import Shown
from handlerkit.viz.tokens import MAX_TOKEN_COLS, MAX_TOKEN_ROWS, split_ngrams, tokens_panel

WORDS = ["<pad>", "the", "cat", "sat", "a\nline", "supercalifragilistic"]
VOCAB = HandlerView(lookup=lambda ids: [WORDS[i] for i in ids], vocab_at="handler.vocab")


def td_texts(page: str) -> list[str]:
    """The text of every table cell, whatever its class and style."""
    return re.findall(r"<td[^>]*>(.*?)</td>", page)


def test_ids_become_their_whole_words_in_an_html_table():
    panel = tokens_panel(torch.tensor([[1, 2, 3], [4, 5, 0]]), Context(VOCAB), "t")
    assert panel.kind == "html"
    assert panel.data["cells"] == [["the", "cat", "sat"], ["a\\nline", "supercalifragilistic", "<pad>"]]
    table = panel.data["html"]
    assert table.startswith("<div class='handlerkit'><style>") and "<table class='handlerkit'>" in table
    assert "the · cat · sat" in td_texts(table) and "supercalifragilistic · &lt;pad&gt;" in table
    assert panel.notes == ["vocabulary: handler.vocab"]


def test_without_a_vocabulary_the_ids_are_shown_and_the_note_says_where_one_is_looked_for():
    panel = tokens_panel(torch.tensor([[7, 8]]), Context(HandlerView()), "t")
    assert panel.data["cells"] == [["7", "8"]] and "7 · 8" in td_texts(panel.data["html"])
    assert panel.notes == ["ids: no vocabulary on the handler (vocab, source_vocab or tokenizer)"]


def test_embedding_bag_input_is_one_row_per_offset_each_its_own_length():
    panel = tokens_panel(torch.tensor([1, 2, 3, 2]), Context(VOCAB), "t", offsets=torch.tensor([0, 3]))
    assert panel.data["cells"] == [["the", "cat", "sat"], ["cat"]]


def test_the_table_is_bounded_far_beyond_a_sentence_and_says_what_it_left_out():
    ids = torch.zeros(100, 600, dtype=torch.long)
    panel = tokens_panel(ids, Context(VOCAB), "t")
    assert len(panel.data["cells"]) == MAX_TOKEN_ROWS and len(panel.data["cells"][0]) == MAX_TOKEN_COLS
    assert panel.notes[:2] == ["first 64 of 100 rows", "first 512 of 600 positions"]


def test_bigrams_after_the_words_and_unknown_entries_are_marked():
    assert split_ngrams(["the", "cat", "sat", "the cat", "<unk>"]) == 3
    assert split_ngrams(["new york", "is", "big"]) == 3  # a space among the words: no split
    assert split_ngrams(["a", "b", "c"]) == 3
    vocab = ["<unk>", "the", "cat", "the cat"]
    view = HandlerView(lookup=lambda ids: [vocab[i] for i in ids], vocab_at="handler.vocab")
    panel = tokens_panel(torch.tensor([[1, 2, 0, 3, 0]]), Context(view), "t")  # "the cat zzz"
    row = panel.data["html"].split("<tbody>")[1]
    cells = [html.unescape(c) for c in td_texts(row)]
    assert cells == ["[0]", "5", "the · cat · <unk>", "the cat · <unk>", "2 at 2, 4"]


def test_the_text_classifiers_input_shows_every_position_of_a_long_text():
    """Notebook 06: 21 positions were 12, and "the strik…" was cut."""
    h = hk.Harness(
        "text_classifier", hk.MockContext.from_model_dir(str(ROOT / "fixtures" / "models" / "text_classifier"))
    )
    text = "the strikers scored twice as the goalkeeper watched the rain and the wind"
    h.run(hk.batch(hk.Request.text(text)))
    shown = hk.show(h.results["preprocess"])
    assert isinstance(shown, Shown) and shown.figure is None
    (panel,) = shown.panels
    tokens = panel.data["cells"][0]
    k = split_ngrams(tokens)
    assert len(tokens) == 2 * k - 1 and k >= 12  # every word and every bigram
    page = html.unescape(shown._repr_html_())
    assert " · ".join(tokens[:k]) in page and " · ".join(tokens[k:]) in page
