"""handlerkit.handlers._text_explain: one Integrated-Gradients importance per entry of a text whose
words go through an EmbeddingBag (the explanations of the fixture model are test_text_classifier.py's)."""

from __future__ import annotations

import pytest
import torch

from handlerkit.errors import HandlerkitError
from handlerkit.handlers._text_explain import _TokenwiseBag, token_attributions

pytest.importorskip("captum.attr")


class Bag(torch.nn.Module):
    """TorchServe's text model: ``model(text, offsets)``, an ``embedding`` bag, then a classifier."""

    def __init__(self, embedding: torch.nn.Module) -> None:
        super().__init__()
        self.embedding = embedding
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, text, offsets=None):
        return self.fc(self.embedding(text, offsets))


class Mean(Bag):
    """The same with a plain ``nn.Embedding``, averaged by the model itself."""

    def forward(self, text, offsets=None):
        return self.fc(self.embedding(text).mean(1))


@pytest.mark.parametrize("mode", ["mean", "sum", "max"])
def test_the_per_token_stand_in_computes_what_the_bag_computes(mode):
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(20, 4, mode=mode, padding_idx=0)
    text = torch.tensor([[3, 0, 7, 7, 12], [1, 2, 3, 4, 0]])
    assert torch.allclose(_TokenwiseBag(bag)(text), bag(text), atol=1e-6)


@pytest.mark.parametrize("kind", ["bag", "embedding"])
def test_one_importance_per_entry_at_unit_norm_and_the_model_left_as_it_was(kind):
    torch.manual_seed(0)
    embedding = torch.nn.EmbeddingBag(20, 4) if kind == "bag" else torch.nn.Embedding(20, 4)
    model = Bag(embedding) if kind == "bag" else Mean(embedding)
    indices = torch.tensor([3, 7, 7, 12])
    importances = token_attributions(model, indices, target=1, n_steps=8)
    assert importances.shape == (4,)
    assert float(torch.linalg.vector_norm(importances)) == pytest.approx(1.0, abs=1e-5)
    assert model.embedding is embedding  # the stand-in was put back
    assert torch.equal(importances[1], importances[2])  # the same entry twice: the same share


def test_a_text_of_unknown_entries_only_has_no_importance():
    model = Bag(torch.nn.EmbeddingBag(20, 4))
    assert torch.equal(token_attributions(model, torch.tensor([0, 0]), target=0, n_steps=4), torch.zeros(2))


def test_what_cannot_be_explained_says_why():
    with pytest.raises(HandlerkitError, match="model.embedding .an nn.EmbeddingBag or nn.Embedding.; Linear has none") as info:
        token_attributions(torch.nn.Linear(4, 3), torch.tensor([1]), target=0)
    assert "name the embedding layer `embedding`" in info.value.fix
    with pytest.raises(HandlerkitError, match="max_norm=1.0") as info:
        token_attributions(Bag(torch.nn.EmbeddingBag(20, 4, max_norm=1.0)), torch.tensor([1]), target=0)
    assert info.value.fix == "override get_insights for this model"
