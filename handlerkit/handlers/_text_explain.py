"""Per-entry Integrated Gradients for text models whose words go through an EmbeddingBag."""

from __future__ import annotations

from typing import Any

import torch

from handlerkit._optional import require
from handlerkit.errors import HandlerkitError

__all__ = ["token_attributions"]


class _TokenwiseBag(torch.nn.Module):
    """An EmbeddingBag's result computed from a per-token lookup that attributions can reach.

    Captum's LayerIntegratedGradients attributes to a layer's *output*; an EmbeddingBag outputs
    one vector per text, so attributing to it (as TorchServe does) gives one number per
    embedding dimension, not per word. This computes the same bags from ``tokens``, a lookup in
    the bag's own weight, so attributing to ``tokens`` gives one number per entry.
    """

    def __init__(self, bag: torch.nn.EmbeddingBag):
        super().__init__()
        if bag.mode not in ("mean", "sum", "max") or bag.max_norm is not None:
            raise HandlerkitError(
                f"explanations support EmbeddingBag modes mean, sum and max without max_norm; the model's is "
                f"mode={bag.mode!r}, max_norm={bag.max_norm!r}",
                fix="override get_insights for this model",
            )
        self.mode, self.padding_idx = bag.mode, bag.padding_idx
        self.tokens = _Lookup(bag.weight)

    def forward(self, input: torch.Tensor, offsets: Any = None, per_sample_weights: Any = None) -> torch.Tensor:
        if input.dim() != 2 or offsets is not None or per_sample_weights is not None:
            raise HandlerkitError("the explanation's stand-in EmbeddingBag takes a 2-D input of one text per row only")
        vectors = self.tokens(input)  # [texts, entries, dim]
        keep = (input != self.padding_idx).unsqueeze(-1) if self.padding_idx is not None else None
        if self.mode == "max":
            return (vectors if keep is None else vectors.masked_fill(~keep, float("-inf"))).amax(dim=1)
        if keep is not None:
            vectors = vectors * keep
        total = vectors.sum(dim=1)
        if self.mode == "sum":
            return total
        count = keep.sum(dim=1).clamp(min=1) if keep is not None else input.shape[1]
        return total / count


class _Lookup(torch.nn.Module):
    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = weight

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.embedding(input, self.weight)


def token_attributions(
    model: Any, indices: torch.Tensor, target: int, *, baseline_index: int = 0, n_steps: int = 50
) -> torch.Tensor:
    """Integrated Gradients (captum's LayerIntegratedGradients) of class ``target`` for each
    entry of one text, summed over the embedding and scaled to unit L2 norm.

    ``model`` is called as TorchServe's text models are, ``model(text, offsets)``, here with a
    [1, entries] text and no offsets (one bag per row). Its ``embedding`` may be an
    ``nn.EmbeddingBag`` (replaced by an equivalent per-token computation for the duration of the
    call) or an ``nn.Embedding``. The baseline is ``baseline_index`` in every position, the
    unknown entry, as TorchServe's ``TokenReferenceBase`` (index 0).
    """
    attr = require("captum.attr", feature="text explanations (Integrated Gradients)", pip="pip install captum")
    module = getattr(model, "_orig_mod", model)  # a torch.compile'd model: explain its eager module
    embedding = getattr(module, "embedding", None) if isinstance(module, torch.nn.Module) else None
    if isinstance(embedding, torch.nn.EmbeddingBag):
        bag = _TokenwiseBag(embedding)
        stand_in: torch.nn.Module | None = bag
        layer: torch.nn.Module = bag.tokens
    elif isinstance(embedding, torch.nn.Embedding):
        stand_in, layer = None, embedding
    else:
        raise HandlerkitError(
            f"explanations need the model's word embedding as model.embedding (an nn.EmbeddingBag or nn.Embedding); "
            f"{type(module).__name__} has {type(embedding).__name__ if embedding is not None else 'none'}",
            fix="name the embedding layer `embedding` (as TorchServe's text handler expects), or override get_insights",
        )
    inputs = indices.reshape(1, -1)
    baselines = torch.full_like(inputs, baseline_index)
    if stand_in is not None:
        module.embedding = stand_in
    try:
        with torch.enable_grad():
            lig = attr.LayerIntegratedGradients(lambda text: module(text, None), layer)
            attributions = lig.attribute(inputs, baselines=baselines, target=target, n_steps=n_steps)
    finally:
        if stand_in is not None:
            module.embedding = embedding
    per_entry = attributions.detach().sum(dim=-1).reshape(-1)
    norm = torch.linalg.vector_norm(per_entry)
    return per_entry / norm if norm > 0 else per_entry
