"""The harness's view into ``handle`` (:mod:`handlerkit.recording.spy`): a handler's class swapped
for a subclass whose stage methods tell the run going on, and stages set on the instance shadowed
for the length of a run."""

from __future__ import annotations

import copy
import pickle

import pytest

from handlerkit.errors import HandlerkitError
from handlerkit.recording import spy


class Doubler:
    """A handler as its author wrote it: ``handle`` calls its own stages."""

    def preprocess(self, data):
        return [x * 2 for x in data]

    def inference(self, data, context):
        return [x + 1 for x in data]

    def handle(self, data, context):
        return self.inference(self.preprocess(data), context)


class Calls:
    """A stand-in for the run's Recorder: the stages called, in order."""

    def __init__(self) -> None:
        self.stages: list[str] = []

    def call(self, stage, func, value, *args, **kwargs):
        self.stages.append(stage)
        return func(value, *args, **kwargs)


def test_the_spied_class_looks_like_the_authors_and_copies_are_of_the_authors():
    spied = spy.spied_class(Doubler)
    assert spied is not Doubler and issubclass(spied, Doubler) and spy.spied_class(Doubler) is spied  # made once
    assert (spied.__name__, spied.__qualname__, spied.__module__) == ("Doubler", "Doubler", __name__)
    assert spy.is_spied(spied) and not spy.is_spied(Doubler) and spy.spied_class(spied) is spied
    handler = spy.build_spied(Doubler)
    assert type(handler) is spied and spy.own_class(handler) is Doubler and spy.own_class(Doubler()) is Doubler
    assert type(copy.copy(handler)) is Doubler and type(pickle.loads(pickle.dumps(handler))) is Doubler


def test_stage_calls_are_recorded_during_a_run_only():
    handler, calls = spy.build_spied(Doubler), Calls()
    assert handler.handle([1, 2], None) == [3, 5] and calls.stages == []  # no run going on
    spy.start(handler, calls)
    try:
        assert handler.handle([1, 2], None) == [3, 5]
    finally:
        spy.stop(handler)
    assert calls.stages == ["preprocess", "inference"]
    handler.handle([1], None)
    assert calls.stages == ["preprocess", "inference"]


def test_a_stage_set_on_the_instance_is_recorded_once_and_put_back():
    handler, calls = spy.build_spied(Doubler), Calls()
    own = handler.preprocess  # the class's, spied

    def preprocess(data):  # a test trick: a stage of the instance's that calls the class's
        return own(data)

    handler.preprocess = preprocess
    spy.start(handler, calls)
    try:
        assert handler.handle([1], None) == [3]
    finally:
        spy.stop(handler)
    assert calls.stages == ["preprocess", "inference"]  # not preprocess twice
    assert handler.preprocess is preprocess  # the instance's own again


def test_a_handler_in_another_run_is_refused():
    handler = spy.build_spied(Doubler)
    spy.start(handler, Calls())
    try:
        with pytest.raises(HandlerkitError, match=r"^Doubler is in the middle of another run \(another thread") as info:
            spy.start(handler, Calls())
    finally:
        spy.stop(handler)
    assert info.value.fix == "run one batch at a time on a handler instance, or give each harness its own instance"


def test_an_existing_handler_is_given_the_spied_class():
    handler = Doubler()
    taken = handler.preprocess  # kept before the swap, as TorchServe's MicroBatching keeps it
    assert spy.spy_on(handler) and spy.is_spied(type(handler))
    assert handler.preprocess([1]) == taken([1]) == [2]


def test_a_stage_takes_the_context_when_it_asks_for_a_second_positional_argument():
    handler = spy.build_spied(Doubler)
    assert spy.takes_context(handler.inference) and not spy.takes_context(handler.preprocess)  # judged by the author's
    assert not spy.takes_context(lambda data, context=None: data)  # a default: not asked for
    assert not spy.takes_context(min)  # a builtin without a signature to read
