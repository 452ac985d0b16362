"""Diagnostics the harness reports, each reading a harness through its public surface
(:class:`~handlerkit.diagnostics._view.HarnessView`): ``device`` (where a handler runs and
why), ``timing`` (repeated timing and sweeps), ``checks`` (contract, batch parity, request
encodings), ``compile`` (what ``torch.compile`` did, graph breaks, recompiles, the
batch-size gate) and ``profile`` (``torch.profiler``, top operators per stage); ``noise`` is
what every timed report shares: the conditions it ran under, and a fastest named only beyond
its noise. Those that run batches of their own do so inside
:func:`handlerkit.diagnostics.runs.diagnostic_runs`.

The Harness offers them as methods (``h.time``, ``h.check``, ``h.profile`` …) through the
mixin in :mod:`handlerkit.diagnostics.reports`: thin calls down into these modules."""
