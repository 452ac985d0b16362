"""handlerkit.handlers._contractions: TorchServe 0.12's contraction table, parsed from its pairs."""

from __future__ import annotations

import pytest

from handlerkit.handlers._contractions import CONTRACTIONS
from handlerkit.handlers.text import expand_contractions


def test_the_entries_are_lower_case_contractions_and_plain_words():
    assert len(CONTRACTIONS) == 117
    assert all(c == c.lower() and "'" in c and c == c.strip() for c in CONTRACTIONS)
    assert all(e and e == " ".join(e.split()) and "'" not in e for e in CONTRACTIONS.values())


@pytest.mark.torchserve
def test_the_table_is_torchserves_but_for_its_typo():
    from ts.torch_handler.contractions import CONTRACTION_MAP

    theirs: dict[str, str] = {}
    for contraction, expansion in CONTRACTION_MAP.items():  # it lists "I'd" and "i'd" alike
        theirs.setdefault(contraction.lower(), expansion.lower())
    assert theirs.pop("he'll've") == "he he will have" and CONTRACTIONS["he'll've"] == "he will have"
    assert theirs == {c: e for c, e in CONTRACTIONS.items() if c != "he'll've"}


@pytest.mark.parametrize(
    "contraction, expansion",
    [("can't", "cannot"), ("won't", "will not"), ("'cause", "because"), ("he'll've", "he will have"),
     ("y'all'd've", "you all would have"), ("o'clock", "of the clock"), ("ma'am", "madam")],
)
def test_entries(contraction, expansion):
    assert CONTRACTIONS[contraction] == expansion


def test_every_entry_expands_as_a_whole_word_in_a_sentence():
    for contraction, expansion in CONTRACTIONS.items():
        assert expand_contractions(f"so {contraction} now") == f"so {expansion} now", contraction
