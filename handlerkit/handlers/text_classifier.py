"""The built-in ``text_classifier`` handler: TorchServe's TextClassifier, for a whole batch."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from handlerkit.errors import HandlerkitError, RequestError
from handlerkit.handlers._text_explain import token_attributions
from handlerkit.handlers.base import HandlerDecisions, timed
from handlerkit.handlers.request_errors import error_item, request_error
from handlerkit.handlers.text import TextBatch, TextHandler, TextScores

__all__ = ["TextClassifier"]


class TextClassifier(TextHandler):
    """Text in, ``{label: probability}`` out, one dict per request.

    The model is called as TorchServe's text models are, ``model(text, offsets)`` (EmbeddingBag
    input: every request's vocabulary rows one after the other, and where each starts), once for
    the whole batch. The output is TorchServe's: the softmax of every class, in class order; with
    ``handler: {topk: N}`` in model-config.yaml, the N most likely, most likely first.

    With the header ``explain: True`` each request gets ``{"words": [...], "importances": [...]}``
    instead: Integrated Gradients (captum) of the class in the request's ``target`` field (0 when
    absent, as TorchServe), one importance per word and n-gram the model saw, scaled to unit L2
    norm. TorchServe's has the same keys but explains only the first request, lists only the
    words, and gives one importance per embedding dimension (it attributes to the bag's output).
    """

    check_label_map_width = True
    topk: int | None = None  # every class, as TorchServe
    #: The v2 metadata: the text in; its ``{label: probability}`` out, one element named after the
    #: input (TorchServe's ``kservev2`` envelope names output ``i`` after input ``i``).
    v2_metadata: ClassVar[dict[str, list[dict[str, Any]]]] = {
        "inputs": [{"name": "input-0", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": "input-0", "datatype": "BYTES", "shape": [1]}],
    }

    def _initialize(self, context: Any, decisions: HandlerDecisions) -> None:
        super()._initialize(context, decisions)
        self.topk = self.settings.topk  # None unless handler: {topk: N}, so a re-initialize drops an old value

    def inference(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        """One model call for the readable requests of a :class:`TextBatch` (timed by
        BaseHandler.inference); anything else (your own tensors) goes to the model as it is."""
        if not isinstance(data, TextBatch):
            return super().inference(data, *args, **kwargs)
        if not data.readable:
            return TextScores(None, data)
        return TextScores(super().inference(data.text, data.offsets, *args, **kwargs), data)

    @timed
    def postprocess(self, data: Any) -> list[dict[str, Any]]:
        """Its probabilities per readable request (the others' error items are put back); a plain
        tensor of scores counts as one readable request per row."""
        scores = data if isinstance(data, torch.Tensor) else data.scores
        answers: list[dict[str, Any]] = []
        if scores is not None:
            probs = F.softmax(scores.float(), dim=1)
            if self.topk is None:
                classes = [list(range(probs.shape[1]))] * probs.shape[0]
                values = probs.tolist()
            else:
                top_probs, top_classes = torch.topk(probs, min(self.topk, probs.shape[1]), dim=1)
                classes, values = top_classes.tolist(), top_probs.tolist()
            mapping = self.mapping
            answers = [
                {(mapping[str(c)] if mapping is not None else str(c)): p for c, p in zip(cs, ps)}
                for cs, ps in zip(classes, values)
            ]
        return answers  # one per readable request: the refused ones' error items are put back

    # -------------------------------------------------------------- explanations
    def explain_handle(self, data_preprocess: TextBatch, raw_data: list[Any]) -> list[dict[str, Any]]:
        """An explanation for every request (TorchServe's explains the first only)."""
        batch = data_preprocess
        starts = batch.offsets.tolist() + [batch.text.shape[0]]
        out: list[dict[str, Any]] = []
        position = 0
        for index, row in enumerate(raw_data):
            features = batch.features[index]
            if features is None:
                out.append(error_item(batch.errors[index]))
                continue
            indices = batch.text[starts[position] : starts[position + 1]]
            position += 1
            try:
                target = self._target(row, index)
            except RequestError as exc:
                out.append(error_item(self.refuse(index, exc)))
                continue
            out.append(self.get_insights(indices, features, target))
        return out

    def get_insights(self, text_preprocess: torch.Tensor, raw_input: Any, target: int = 0) -> dict[str, Any]:
        """``{"words": entries, "importances": one per entry}`` for one request's vocabulary rows."""
        vocab = self.source_vocab
        importances = token_attributions(
            self.model, text_preprocess, target, baseline_index=vocab.unk_index if vocab is not None else 0
        )
        if raw_input is not None:
            words = list(raw_input)
        elif vocab is not None:
            words = [vocab.itos[i] for i in text_preprocess.tolist()]
        else:
            raise HandlerkitError(
                "explanations need the raw text or a vocabulary; this handler has neither",
                fix="load a vocabulary in initialize (source_vocab)",
            )
        return {"words": words, "importances": importances.tolist()}

    def _target(self, row: Any, index: int) -> int:
        """The class to explain: the request's ``target`` field, else 0 (TorchServe's default)."""
        value = row.get("target") if isinstance(row, dict) else None
        if isinstance(value, (bytes, bytearray)):
            value = bytes(value).decode("utf-8", "replace")
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if value is None:
            value = 0
        classes = len(self.mapping) if self.mapping is not None else None
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < 0
            or (classes is not None and value >= classes)
        ):
            within = f"0..{classes - 1}" if classes is not None else "a class index"
            raise request_error(
                index, f"target {value!r} is not a class index", f"send target as an integer in {within}"
            )
        return value
