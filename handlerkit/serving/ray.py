"""Serve any TorchServe-contract handler on Ray Serve, unchanged (``pip install 'handlerkit[ray]'``).

::

    from handlerkit.serving.ray import app, run

    run(app("model_store/shapes.mar"))   # serve.run, raising the handler's own error if it fails to load
    # POST /predictions/<model>, /explanations/<model>; GET /ping, /models/<model>[?customized=true]

model-config.yaml drives the deployment as it drives TorchServe: ``batchSize`` and
``maxBatchDelay`` (ms) → batches formed when the handler is free, as TorchServe forms them
(or Ray's ``@serve.batch(max_batch_size, batch_wait_timeout_s)`` with ``batching="serve.batch"``),
``minWorkers``/``maxWorkers`` → replicas (autoscaling between them when they differ),
``deviceType: gpu`` → one GPU per replica (``gpu_id`` in the context), ``responseTimeout`` (s)
→ a batch that takes longer is answered 500 "Worker died." and its replica replaced, as
TorchServe replaces the worker, ``jobQueueSize`` → ``max_ongoing_requests``.
Each replica builds its context with :meth:`handlerkit.MockContext.from_model_dir` and runs
``initialize`` once; HTTP is translated as TorchServe's frontend and worker do
(:mod:`handlerkit.serving._http`). A failed batch's :class:`~handlerkit.errors.StageError` goes
to the replica's log (the ``handlerkit.serving`` logger, through Serve's replica logger); a
handler that fails to load fails the deployment at once, and :func:`run` raises its StageError.

``sequenceBatching: true``: sequences are opened, ended and limited as TorchServe's frontend
does, and kept on one replica by Ray Serve's model multiplexing, the sequence id being the
multiplexed model id: a client sends ``serve_multiplexed_model_id: <sequence id>`` beside
``ts_request_sequence_id`` (:mod:`handlerkit.serving.frontend.sequence_desk`). ``continuousBatching: true``
runs TorchServe's loop on each replica (:mod:`handlerkit.serving.frontend.continuous`): a request the
handler leaves unfinished (its answer says ``ts_stream_next: true``) is streamed to its client,
one HTTP chunk per step, and called again, while new requests join between steps.
"""

from __future__ import annotations

import os
from typing import Any

from handlerkit._optional import require
from handlerkit.serving._http import model_fields
from handlerkit.serving.frontend.model import settings
from handlerkit.serving.frontend.sequence_desk import ROUTING_SETTLE_S
from handlerkit.worker.config import parse_config
from handlerkit.worker.context import MockContext

__all__ = ["app", "deployment_options", "run"]

#: TorchServe's default job queue where model-config.yaml says nothing.
_DEFAULT_QUEUE = 100
_BATCHING = ("torchserve", "serve.batch")
#: How often Ray asks a replica whether it is healthy. A replica whose handler ran past
#: responseTimeout says no, and Ray replaces it after three answers in a row (Serve's
#: threshold): about 3 s here, 30 s at Serve's default period of 10 s.
HEALTH_CHECK_PERIOD_S = 1.0


def deployment_options(
    config: Any, *, num_replicas: int | None = None, num_gpus: float | None = None, num_cpus: float | None = None
) -> dict[str, Any]:
    """The Ray Serve deployment options and batch settings a model config asks for.

    Args:
        config: a :class:`~handlerkit.worker.config.ModelConfig` or the raw mapping.
        num_replicas: overrides ``minWorkers``/``maxWorkers``.
        num_gpus: GPUs per replica; overrides ``deviceType``.
        num_cpus: CPUs per replica (default 1, or 0 with a GPU). Ray sets ``OMP_NUM_THREADS`` to
            it, so it is also the replica's torch thread count.

    Returns:
        ``{"deployment": {...serve.deployment options...}, "batch_size", "batch_wait_timeout_s",
        "response_timeout_s"}``.
    """
    cfg = config if hasattr(config, "batch_size") else parse_config(config or {})
    frontend = settings(cfg)
    batch_size = frontend.batch_size
    if num_gpus is None:
        num_gpus = 1 if cfg.device_type == "gpu" else 0
    deployment: dict[str, Any] = {
        "ray_actor_options": {
            "num_gpus": num_gpus,
            "num_cpus": num_cpus if num_cpus is not None else (0 if num_gpus else 1),
        },
        # A replica must accept a whole batch at once (Ray's default is 5) and queue the next.
        "max_ongoing_requests": max(cfg.job_queue_size or _DEFAULT_QUEUE, 2 * batch_size),
        # A handler that fails to load fails the deployment at the first try (Ray's default
        # constructs it again and again); a later replacement replica is still retried.
        "max_constructor_retry_count": 1,
        "health_check_period_s": HEALTH_CHECK_PERIOD_S,
    }
    low, high = max(1, cfg.min_workers or 1), cfg.max_workers
    if num_replicas is not None:
        deployment["num_replicas"] = num_replicas
    elif high is not None and high > low:
        deployment["autoscaling_config"] = {
            "min_replicas": low,
            "max_replicas": high,
            "target_ongoing_requests": batch_size,
        }
    else:
        deployment["num_replicas"] = low
    return {
        "deployment": deployment,
        "batch_size": batch_size,
        "batch_wait_timeout_s": frontend.max_batch_delay_s,
        "response_timeout_s": frontend.response_timeout_s,
    }


def app(
    model: str | os.PathLike[str],
    *,
    handler: Any = None,
    name: str | None = None,
    num_replicas: int | None = None,
    num_gpus: float | None = None,
    num_cpus: float | None = None,
    batch_size: int | None = None,
    max_batch_delay_ms: float | None = None,
    response_timeout_s: float | None = None,
    batching: str = "torchserve",
    envelope: str | None = None,
) -> Any:
    """A Ray Serve application that runs the handler of ``model`` as TorchServe would.

    Args:
        model: a model dir or a ``.mar`` (on a cluster, a path every node can read).
        handler: the manifest's handler by default; or a spec string (``"handler.py"``,
            ``"image_classifier"``, ``"ts.torch_handler.image_classifier"``,
            ``"handler.py:handle"``), a handler class, an instance or a module-level
            ``handle(data, context)`` function (classes and functions must be importable by
            the replicas: defined in a module, not in ``__main__`` on a remote cluster).
        name: the model name in URLs (default: the manifest's ``modelName``).
        num_replicas: fixed replica count (default: from ``minWorkers``/``maxWorkers``).
        num_gpus: GPUs per replica (default: 1 with ``deviceType: gpu``, else 0).
        num_cpus: CPUs per replica (default: 1, 0 with a GPU); Ray sets the replica's
            ``OMP_NUM_THREADS`` (torch's thread count) to it.
        batch_size: overrides ``batchSize``.
        max_batch_delay_ms: overrides ``maxBatchDelay``.
        response_timeout_s: overrides ``responseTimeout``.
        batching: ``"torchserve"`` forms each batch when the handler is free, as TorchServe's
            frontend does; ``"serve.batch"`` uses Ray's ``@serve.batch``, which closes batches
            as requests arrive even while the handler is busy (smaller batches under load:
            ``benchmarks/ray_vs_torchserve.py`` shows both).
        envelope: a TorchServe service envelope (``"json"``, ``"kserve"``, ``"kservev2"``)
            wrapped around the handler's entry point, as TorchServe's ``service_envelope``.

    Returns:
        A ``ray.serve.Application`` for ``serve.run``.
    """
    if batching not in _BATCHING:
        raise ValueError(f"batching must be one of {', '.join(map(repr, _BATCHING))}, got {batching!r}")
    if envelope:
        from handlerkit.worker.envelopes import get_envelope

        get_envelope(envelope)  # an unknown name fails here, not in every replica
    serve = require("ray.serve", feature="handlerkit.serving.ray", extra="ray")
    from handlerkit.serving._replica import HandlerReplica

    path = os.path.abspath(os.fspath(model))
    ctx = MockContext.from_model_dir(path)  # reads the manifest and config (a .mar is opened)
    archive = getattr(ctx, "archive", None)
    if archive is not None:  # each replica opens the model itself (Service.open): the driver keeps only what it read
        archive.cleanup()
    cfg = parse_config(ctx.model_yaml_config, source=f"{path} model config")
    options = deployment_options(cfg, num_replicas=num_replicas, num_gpus=num_gpus, num_cpus=num_cpus)
    if batch_size is not None:
        options["batch_size"] = max(1, int(batch_size))
    if max_batch_delay_ms is not None:
        options["batch_wait_timeout_s"] = float(max_batch_delay_ms) / 1000.0
    if response_timeout_s is not None:
        options["response_timeout_s"] = float(response_timeout_s)
    options["batching"] = batching
    options["envelope"] = envelope or None
    deployment = options.pop("deployment")
    # Several replicas: a sequence's first answer waits until Ray routes its id to its replica.
    several = deployment.get("num_replicas", 1) > 1 or "autoscaling_config" in deployment
    options["sequence_settle_s"] = ROUTING_SETTLE_S if several and cfg.sequence_batching else 0.0
    deployment["max_ongoing_requests"] = max(deployment["max_ongoing_requests"], 2 * options["batch_size"])
    model_name = name or ctx.model_name
    version = (ctx.manifest.get("model") or {}).get("modelVersion")
    options["queue_capacity"] = deployment["max_ongoing_requests"]
    options["describe"] = model_fields(
        cfg,
        name=model_name,
        version=version,
        url=os.path.basename(path),
        gpu=bool(deployment["ray_actor_options"]["num_gpus"]),
    )
    replica = serve.deployment(HandlerReplica, name=f"handlerkit-{model_name}", **deployment)
    return replica.bind(path, handler, model_name, version, options)


def run(application: Any, *, name: str = "default", route_prefix: str | None = "/", **options: Any) -> Any:
    """``serve.run`` for an :func:`app`, which raises the handler's own error when it fails to load.

    Ray answers a deployment whose replica constructor raised with a ``RuntimeError`` holding
    the replica's traceback as text. The replica hands its error to the driver as data, so a
    handler whose ``initialize`` (or a function handler's ``handle(None, context)``) raises
    comes out as the :class:`~handlerkit.errors.StageError` a notebook shows (stage
    ``initialize``, ``file:line``, fix), and a handler spec that cannot be resolved as its
    :class:`~handlerkit.errors.HandlerLoadError`.

    Args:
        application: what :func:`app` returned.
        name, route_prefix, options: ``serve.run``'s.

    Returns:
        ``serve.run``'s deployment handle.

    Raises:
        StageError: ``initialize`` raised.
        HandlerkitError: the model or its handler could not be opened.
        RuntimeError: the deployment failed otherwise (Ray's own error).
    """
    serve = require("ray.serve", feature="handlerkit.serving.ray", extra="ray")
    from handlerkit.serving.frontend import failure_answers as _failures

    _failures.forget_load_failure(name)
    try:
        return serve.run(application, name=name, route_prefix=route_prefix, **options)
    except RuntimeError:
        error = _failures.take_load_failure(name)
        if error is None:
            raise
    raise error  # outside the except block: Ray's text repeats the same error as a traceback
