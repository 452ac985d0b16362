"""The program that records a compile cache: ``python -m handlerkit.cli._record_compile_cache``.

Started by :func:`handlerkit.formats.compile_cache.record` (what ``archive.build(...,
compile_cache=batch)`` and ``handlerkit archive --compile-cache FILES`` call) in a fresh process:
it opens the model dir as the server would (:class:`~handlerkit.service.Service`), initializes
the handler and answers the batch, so the model compiles as its ``pt2`` section says; then it
writes ``torch.compiler.save_cache_artifacts()``'s bytes and their tag, and on CPU the C++
kernels Inductor built or found for them (:mod:`handlerkit.formats.compile_kernels`).

It keeps the environment's ``TORCHINDUCTOR_CACHE_DIR``: a hit in the local cache is recorded as
well as a fresh compile, so a warm machine records in seconds. It compiles without Inductor's
precompiled header (:data:`~handlerkit.formats.compile_kernels.RECORDING_CONFIG`, which says
why), so its first recording on a machine misses the entries a server compiled with it.
"""

from __future__ import annotations

import json
import pickle
import sys
from typing import Any

from handlerkit.formats.compile_cache import current_tag, save_artifacts, write

__all__ = ["cache_counters", "main"]


def cache_counters() -> dict[str, int]:
    """Inductor's FX graph cache and the AOTAutograd cache counters of this process, by name."""
    from torch._dynamo.utils import counters

    found = {f"inductor.{k}": v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}
    found.update(
        {f"aot_autograd.{k}": v for k, v in counters["aot_autograd"].items() if k.startswith("autograd_cache")}
    )
    return dict(sorted(found.items()))


def _child(model_dir: str, batch_path: str, out_dir: str) -> dict[str, Any]:
    """In the child: open, initialize, answer the batch, save the artifacts and their tag."""
    import time

    from handlerkit.formats.compile_kernels import current_facts, pack, record_sources, recording_config
    from handlerkit.service import Service

    with open(batch_path, "rb") as f:
        batch = pickle.load(f)
    inductor_config = recording_config()
    with record_sources() as sources, Service.open(model_dir) as service:
        service.initialize()
        decision = getattr(getattr(service.handler, "decisions", None), "compile", None)
        if decision is None or not decision.applied:
            why = getattr(decision, "reason", None) or "the handler records no compile decision"
            return {
                "error": f"the handler of {model_dir} does not compile its model ({why}): no compile cache to record"
            }
        start = time.perf_counter()
        service.handle(batch)
        first = time.perf_counter() - start
        if getattr(decision, "fell_back_at_runtime", False):
            return {"error": f"torch.compile failed at the first call ({decision.error}): no compile cache to record"}
        saved = save_artifacts()
        if saved is None:
            return {"error": f"the handler of {model_dir} answered the batch without compiling anything: no cache"}
        data, artifacts = saved
        tag = {**current_tag(service.handler.decisions.device_kind, service.handler.device), "artifacts": artifacts}
        tag["inductor_config"] = inductor_config
        kernels = pack(sources, out_dir)
        if kernels is not None:
            tag["kernels"] = {**current_facts(), "files": kernels[1]}
        write(out_dir, data, tag)
        files = kernels[1] if kernels else 0
        return {"artifacts": artifacts, "first_call_s": first, "counters": cache_counters(), "kernel_files": files}


def main(argv: list[str]) -> int:
    model_dir, batch_path, out_dir, result_path = argv
    result = _child(model_dir, batch_path, out_dir)
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
