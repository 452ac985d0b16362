"""What the Harness records while a handler runs, and how a failure is told.

- :mod:`~handlerkit.recording.capture`: the warnings and log records a stage emits;
- :mod:`~handlerkit.recording.recorder`: each stage call's time, memory, warnings, logs and
  metrics, turned into :class:`~handlerkit.recording.results.StageResult` s;
- :mod:`~handlerkit.recording.spy`: how a run through the handler's own ``handle`` reports each
  stage method it calls;
- :mod:`~handlerkit.recording.failures`: an exception turned into a
  :class:`~handlerkit.errors.StageError` naming the stage, the request, the line and the fix
  (the Harness and the servers alike);
- :mod:`~handlerkit.recording.reload`: a handler's source executed afresh (``Harness.reload``).

The records themselves (:class:`~handlerkit.recording.results.StageResult`, :class:`~handlerkit.recording.results.Run`)
are in :mod:`handlerkit.recording.results`.
"""
