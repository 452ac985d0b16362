"""handlerkit/viz/handler_view.py: what the pictures read from the handler (its Normalize, label
mapping and vocabulary), and which handler that is."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from _viz import classifier  # noqa: F401 (a fixture)

from handlerkit.recording.results import Run, StageResult
from handlerkit.viz.handler_view import HandlerView, read_handler, view_for


def test_handler_facts_are_found_where_torchserve_and_torchvision_keep_them():
    from torchvision import transforms
    from torchvision.transforms import v2

    class V2Handler:
        preprocess_pipeline = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                                          v2.Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25])])

        @property
        def transform(self):  # never run: attributes are read statically
            raise AssertionError("a property ran")

    view = read_handler(V2Handler())
    assert (view.mean, view.std, view.normalize_at) == ([0.5] * 3, [0.25] * 3, "handler.preprocess_pipeline")
    ts_style = SimpleNamespace(image_processing=transforms.Compose([transforms.Normalize([0.1], [0.2])]),
                               mapping={"0": ["n0", "tench"]}, source_vocab=["<unk>", "hello"])
    view = read_handler(ts_style)
    assert view.mean == [0.1] and view.label(0) == "tench" and view.tokens([1, 7]) == ["hello", "<7?>"]

    class Tokenizer:  # Hugging Face's surface
        def convert_ids_to_tokens(self, ids):
            return [f"tok{i}" for i in ids]

    assert read_handler(SimpleNamespace(tokenizer=Tokenizer())).tokens([3]) == ["tok3"]
    assert read_handler(lambda data, context: data).mean is None  # a function handler has none


def test_the_real_classifier_s_normalize_and_mapping(classifier):
    view = read_handler(classifier.handler)
    assert view.mean == [0.485, 0.456, 0.406] and view.std == [0.229, 0.224, 0.225]
    assert view.normalize_at == "handler.image_processing"
    assert view.mapping_at == "handler.mapping" and view.label(0) == "circle"
    assert view.lookup is None and view.tokens([1]) is None


def test_the_view_comes_from_the_result_s_source_unless_handler_overrides_it(classifier):
    result = classifier.run.stages["inference"]
    assert view_for(result).mapping == classifier.handler.mapping  # .source
    assert view_for(classifier.run).mean == [0.485, 0.456, 0.406]
    own = SimpleNamespace(mapping=["a", "b"])
    assert view_for(result, own).label(1) == "b"
    assert view_for(result, classifier.h).mapping == classifier.handler.mapping  # a Harness: its handler
    assert view_for(torch.ones(2)) == HandlerView()  # a bare value: nothing known
    assert view_for(StageResult("inference", output=1)) == HandlerView()  # no source
    assert view_for(Run(output=1, stages={}, batch_size=1), own).mapping == {"0": "a", "1": "b"}


def test_labels_background_and_mappings_of_other_shapes():
    view = HandlerView()
    assert view.label(3) == "3" and view.is_background(0) and not view.is_background(1)
    view = read_handler(SimpleNamespace(classes=["__background__", "cat"]))
    assert view.is_background(0) and not view.is_background(1) and view.label(9) == "9"
    assert read_handler(SimpleNamespace(mapping={"a": "b"})).mapping is None  # not index → label
    assert read_handler(SimpleNamespace(mapping={"0": "a"}, labels=["x"])).mapping_at == "handler.mapping"


def test_vocabularies_of_every_shape_and_a_tokenizer_that_refuses_one_id():
    assert read_handler(SimpleNamespace(vocab={"a": 0, "b": 1})).tokens([1, 0, 5]) == ["b", "a", "<5?>"]
    assert read_handler(SimpleNamespace(vocab={0: "x"})).tokens([0]) == ["x"]
    assert read_handler(SimpleNamespace(vocab=SimpleNamespace(itos=["p", "q"]))).tokens([1]) == ["q"]

    class Picky:
        def convert_ids_to_tokens(self, ids):
            if 99 in ids:
                raise IndexError("99")
            return [f"w{i}" for i in ids]

    view = read_handler(SimpleNamespace(tokenizer=Picky()))
    assert view.tokens([1, 99, 2]) == ["w1", "<99?>", "w2"] and view.vocab_at == "handler.tokenizer"


def test_a_normalize_with_a_zero_std_or_deep_inside_a_model_is_not_used():
    from torchvision import transforms

    assert read_handler(SimpleNamespace(transform=transforms.Normalize([0.5], [0.0]))).mean is None
    nested = [[[[[[[transforms.Normalize([0.5], [0.5])]]]]]]]  # deeper than the bounded walk
    assert read_handler(SimpleNamespace(transform=nested)).mean is None
    assert read_handler(SimpleNamespace(transform=[[transforms.Normalize([0.5], [0.5])]])).mean == [0.5]
