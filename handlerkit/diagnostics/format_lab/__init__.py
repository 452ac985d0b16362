"""``Harness.compare_formats``: which model format gives this handler's answers, fastest, at what cost.

The handler's model (its eager ``nn.Module``) is exported to each format asked for with
:func:`handlerkit.formats.export_model` and loaded back with :func:`handlerkit.formats.load_model`
(the loaders ``hk.BaseHandler`` serves them with); ``compile`` is ``torch.compile`` with the
``pt2`` settings in force. Then, with each format's model swapped in as ``handler.model``:

1. the first call: the inference stage alone on the preprocess output of ``batch`` (time and
   peak memory above the start);
2. a whole run of ``batch`` through the handler's own ``handle``, so its preprocess feeds the
   model and its postprocess turns the model's output into answers, compared with eager's
   (the model output's max abs difference, and the answers within ``atol``/``rtol``);
3. the batch sizes the model accepts: 1, the batch's size and one more, each checked
   against the eager model on the same rows;
4. the other input dimensions it accepts: those the batch varies (its requests run alone
   give other sizes than the batch: the ranker's item lists) or that ``dynamic_shapes=`` (or
   the model config's ``handler: {dynamic_shapes: ...}``) declares are exported dynamic where
   the format has the setting, and tried with other sizes (:mod:`.shapes`);
5. the steady state: every format's inference stage timed side by side, in an order that
   rotates from round to round, so a machine that slows down does not favour one format
   (:mod:`handlerkit.diagnostics.noise`: a best only beyond the run's noise, and the conditions
   it ran under).

``save=FORMAT`` saves a format only once the saved dir serves: the save is made in a copy of
the model dir, opened afresh as a server would, and the batch, its requests alone and the
batch with its varying dimensions longer must get eager's answers through the handler's own
code (:func:`.saving.serve_check`); otherwise the report says why (the dimension the
file does not take, or the handler's line that cannot call the model as the dir loads it) and
the model dir is left as it was.

The report (:class:`FormatReport`, :mod:`.report`) renders as tables in a notebook and a
terminal, and as JSON for ``handlerkit formats --json``.

A format that does not export is reported with the exporter's error, the line of the model
that stopped it (:mod:`.export`) and a fix. The handler is left as found: its model is
put back, and the artifacts are written to a temporary directory (or ``directory``).
"""

from handlerkit.diagnostics.format_lab.lab import DEFAULT_FORMATS, LAB_FORMATS, compare_formats
from handlerkit.diagnostics.format_lab.report import FormatReport, FormatRow

__all__ = ["DEFAULT_FORMATS", "LAB_FORMATS", "FormatReport", "FormatRow", "compare_formats"]
