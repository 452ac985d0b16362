"""``hk.Stepper``, the ipywidgets UI over a Harness (:mod:`~handlerkit.widgets.stepper`) or over
``hk.Sequences`` (:mod:`~handlerkit.widgets.sequence`), and the Jupyter outputs its panes show
(:mod:`~handlerkit.widgets.panes`). Needs the ``[notebook]`` extra; importing this package
imports neither ipywidgets nor matplotlib."""

from __future__ import annotations

from handlerkit.widgets.sequence import SequenceStepper
from handlerkit.widgets.stepper import Stepper

__all__ = ["SequenceStepper", "Stepper"]
