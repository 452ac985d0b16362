"""What ``torch.compile`` did to a handler's model, read from torch's structured records.

- :mod:`~handlerkit.diagnostics.compile.report`: ``Harness.compile_report``, the one report;
- :mod:`~handlerkit.diagnostics.compile.dynamo_events`: Dynamo's compiled frames, graph breaks
  and recompiles, caught while a report runs;
- :mod:`~handlerkit.diagnostics.compile.facts`: the ``pt2`` settings in force, the first call's
  cost split into Dynamo and the backend, the graph caches;
- :mod:`~handlerkit.diagnostics.compile.gate`: the deploy-time gate, will traffic of these batch
  sizes recompile?
- :mod:`~handlerkit.diagnostics.compile.specialisations`: which input dimensions Dynamo made
  dynamic, and which it specialised.
"""

from handlerkit.diagnostics.compile.report import (
    CompiledFrame,
    CompileReport,
    GateResult,
    GraphBreak,
    Recompile,
    compile_report,
)

__all__ = ["CompileReport", "CompiledFrame", "GateResult", "GraphBreak", "Recompile", "compile_report"]
