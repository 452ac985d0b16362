"""Serve any TorchServe-contract handler on KServe's Python model server, unchanged
(``pip install 'handlerkit[kserve]'``).

::

    from handlerkit.serving.kserve import model, start

    with start("model_store/shapes.mar") as server:     # kserve.ModelServer on 127.0.0.1, a free port
        server.v1_url   # http://127.0.0.1:PORT/v1/models/shapes   (GET; :predict, :explain)
        server.v2_url   # http://127.0.0.1:PORT/v2/models/shapes   (GET metadata; /ready, /infer)

    served = model("model_store/shapes.mar")   # or the kserve.Model, for a server of your own
    served.load()                               # initialize, once (ModelServer starts ready models only)
    kserve.ModelServer().start([served])        # NB: kserve's own start listens on every interface

A request reaches the handler as TorchServe 0.12's frontend and worker deliver KServe's
routes to a model served with a service envelope (``InferenceRequestHandler``'s
``/v1/models/<m>:predict`` and ``/v2/models/<m>/infer``): the v1 body through the ``kserve``
envelope, the v2 body through ``kservev2`` (:mod:`handlerkit.worker.envelopes`), with the request's
headers, ``explain`` set as the frontend sets it (:mod:`handlerkit.serving._http`). So a handler
written for TorchServe-on-KServe gives the same answers, and a request the handler fails alone
(``context.set_response_status``) or a batch the worker fails keeps TorchServe's status, content
type and body.

What differs from TorchServe-on-KServe:

- **batches are TorchServe's, and may hold several KServe requests**: requests are batched as
  ``model-config.yaml`` says (``batchSize``, ``maxBatchDelay``; :mod:`handlerkit.serving.frontend`),
  v1 and v2 requests apart. TorchServe's ``kserve`` and ``kservev2`` envelopes read only the
  first request of a batch (so TorchServe-on-KServe needs ``batchSize: 1``); here each request
  of a batch is read by an envelope of its own and the handler gets their instances (v1) or
  inputs (v2) in one list (:mod:`handlerkit.serving.frontend.enveloped`). A batch of one is
  exactly TorchServe's;
- a v1 ``:predict`` whose handler streams (``send_intermediate_predict_response``) is sent as it
  comes, one HTTP chunk per send, its final answer last (kserve streams only v1 answers, with
  status 200 and no headers of the handler's);
- the routes around inference are KServe's own: ``/v2/health/live``, ``/v2/health/ready``,
  ``/v2/models/<m>``, ``/v2/models/<m>/ready``, ``/v1/models/<m>``; a v1 body kserve cannot
  parse is answered by kserve (400) before the handler sees it;
- the v2 route keeps the spec (:mod:`handlerkit.serving.v2`): each input is checked before the
  handler runs (datatype, shape against its data, element types, the metadata's declared
  inputs), so a request TorchServe would hand to the handler is refused with 400; a
  body that is no inference request (malformed JSON, no ``inputs``) is 400, not FastAPI's 422;
  and every v2 error is ``{"error": <TorchServe's message>}`` with TorchServe's status, so a v2
  client such as ``tritonclient`` shows the message (v1 errors keep TorchServe's body);
- the model metadata (``GET /v2/models/<m>``) lists the inputs and outputs the model declares:
  model-config.yaml's ``v2: {inputs: [{name, datatype, shape}], outputs: [...]}``, else the
  handler's ``v2_metadata`` (the built-ins declare one ``BYTES`` input of shape ``[-1]``, and
  still read any input name, as in TorchServe); a TorchServe handler declares none, and nothing
  is invented for it;
- ``url_path`` is ``""`` in each request's headers (TorchServe's KServe routes add none);
- kserve adds ``"parameters": null`` to v2 responses and outputs, and sends a v1 ``:explain``
  answer with the request's own headers (its ``DataPlane.explain``);
- loading the model installs its error handlers on kserve's one FastAPI app, so the v2 routes of
  other models in the same server answer a body that is no inference request the same way.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from handlerkit._optional import require
from handlerkit.serving.kserve._server import KServeServer, start

if TYPE_CHECKING:
    from handlerkit.service import WorkingDir

__all__ = ["KServeServer", "model", "start"]


def model(
    model_dir_or_mar: str | os.PathLike[str],
    *,
    handler: Any = None,
    name: str | None = None,
    working_dir: WorkingDir = "call",
) -> Any:
    """A ``kserve.Model`` that runs the handler of a model dir or ``.mar`` as TorchServe would.

    ``load()`` opens the model (a :class:`~handlerkit.service.Service`) and runs ``initialize``
    once; v1 ``:predict``/``:explain`` and v2 ``infer`` requests are then batched as
    ``model-config.yaml`` says and run one batch at a time (:mod:`handlerkit.serving.frontend`).

    Args:
        model_dir_or_mar: a model dir or an archive (``.mar``, ``.tar.gz``).
        handler: the manifest's handler by default; or any form
            :class:`~handlerkit.service.Service` takes (spec string, class, instance, function).
        name: the model name in URLs (default: the manifest's ``modelName``).
        working_dir: where the handler runs (:data:`handlerkit.service.WorkingDir`): ``"call"``
            in a notebook, ``"process"`` in a server process of its own (as a worker).

    Raises:
        ImportError: kserve is not installed (``pip install 'handlerkit[kserve]'``).
    """
    require("kserve", feature="handlerkit.serving.kserve", extra="kserve")
    from handlerkit.serving.kserve._model import HandlerModel

    return HandlerModel(os.fspath(model_dir_or_mar), handler=handler, name=name, working_dir=working_dir)
