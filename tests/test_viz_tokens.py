"""handlerkit/viz/tokens.py: token ids as a table of vocabulary entries, bounded, one row per
request for EmbeddingBag input (ids + offsets)."""

from __future__ import annotations

import torch

from handlerkit.viz.handler_view import HandlerView
from handlerkit.viz.panel import Context
from handlerkit.viz.tokens import MAX_TOKEN_COLS, MAX_TOKEN_ROWS, tokens_panel

WORDS = ["<pad>", "the", "cat", "sat", "a\nline", "supercalifragilistic"]
VOCAB = HandlerView(lookup=lambda ids: [WORDS[i] for i in ids], vocab_at="handler.vocab")


def test_ids_become_their_words_and_long_or_multiline_words_are_shortened():
    panel = tokens_panel(torch.tensor([[1, 2, 3], [4, 5, 0]]), Context(VOCAB), "t")
    assert panel.kind == "table" and panel.data["rows"] == ["[0]", "[1]"]
    assert panel.data["cells"] == [["the", "cat", "sat"], ["a\\nline", "supercali…", "<pad>"]]
    assert panel.notes == ["vocabulary: handler.vocab"]


def test_without_a_vocabulary_the_ids_are_shown_and_the_note_says_where_one_is_looked_for():
    panel = tokens_panel(torch.tensor([[7, 8]]), Context(HandlerView()), "t")
    assert panel.data["cells"] == [["7", "8"]]
    assert panel.notes == ["ids: no vocabulary on the handler (vocab, source_vocab or tokenizer)"]


def test_embedding_bag_input_is_one_row_per_offset_padded_to_the_longest():
    panel = tokens_panel(torch.tensor([1, 2, 3, 2]), Context(VOCAB), "t", offsets=torch.tensor([0, 3]))
    assert panel.data["cells"] == [["the", "cat", "sat"], ["cat", "", ""]]


def test_the_table_is_bounded_and_says_what_it_left_out():
    ids = torch.zeros(20, 30, dtype=torch.long)
    panel = tokens_panel(ids, Context(VOCAB), "t")
    assert len(panel.data["cells"]) == MAX_TOKEN_ROWS and len(panel.data["cells"][0]) == MAX_TOKEN_COLS
    assert panel.notes[:2] == ["first 8 of 20 rows", "first 12 of 30 positions"]
    bag = tokens_panel(torch.zeros(40, dtype=torch.long), Context(VOCAB), "t", offsets=torch.arange(0, 40, 2))
    assert len(bag.data["cells"]) == MAX_TOKEN_ROWS and bag.notes[0] == "first 8 of 20 rows"
