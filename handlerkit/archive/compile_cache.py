"""Record a compile cache for an archive: the handler's model compiled on a batch, in a fresh process.

``archive.build(..., compile_cache=batch)`` (and ``handlerkit archive --compile-cache FILES``)
writes the planned archive as a folder in a temporary dir, then runs a child Python process
that opens it as the server would (:class:`~handlerkit.service.Service`), initializes the
handler and answers the batch, so the model compiles as its ``pt2`` section says; the child
then writes ``torch.compiler.save_cache_artifacts()``'s bytes and their tag
(:mod:`handlerkit.compile_cache`), and on CPU the C++ kernels Inductor built or found for
them (:mod:`handlerkit.compile_kernels`). The files join the archive.

A fresh process because ``save_cache_artifacts`` holds every artifact compiled in its process
since it started: in a notebook that has compiled other models, or this one already (Dynamo
would then compile nothing new), an in-process recording would ship the wrong set. The child
keeps the environment's ``TORCHINDUCTOR_CACHE_DIR``: a hit in the local cache is recorded as
well as a fresh compile, so a warm machine records in seconds. It compiles without Inductor's
precompiled header (:data:`~handlerkit.compile_kernels.RECORDING_CONFIG`, which says why), so
its first recording on a machine misses the entries a server compiled with it.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any

from handlerkit.compile_cache import CACHE_FILE, TAG_FILE, current_tag, save_artifacts, write
from handlerkit.compile_kernels import KERNELS_FILE
from handlerkit.errors import HandlerkitError

__all__ = ["Recorded", "record"]

_NOT_COMPILED_FIX = (
    "enable torch.compile in the model's model-config.yaml (pt2: {compile: {enable: true, backend: inductor}}) "
    "and use hk.BaseHandler (or a subclass), which compiles the model it loads"
)


@dataclass
class Recorded:
    """A compile cache recorded by :func:`record`.

    Attributes:
        cache / tag: the paths of ``compile-cache.bin`` and ``compile-cache.json``.
        kernels: the path of ``compile-kernels.zip``; None when no C++ kernel was built (a GPU).
        artifacts: artifacts per cache (``{"inductor": 1, "aot_autograd": 1}``).
        first_call_s: the child's first answer, compile included.
        counters: the child's Inductor and AOTAutograd cache counters (hits show a warm local cache).
    """

    cache: str
    tag: str
    artifacts: dict[str, int] = field(default_factory=dict)
    first_call_s: float = 0.0
    counters: dict[str, int] = field(default_factory=dict)
    kernels: str | None = None


def record(
    model_dir: str, batch: Any, out_dir: str, *, label: str | None = None, timeout: float | None = None
) -> Recorded:
    """Compile the handler of ``model_dir`` on ``batch`` in a fresh process; the cache goes to ``out_dir``.

    ``label`` names the model in errors (default: ``model_dir``).

    Raises:
        HandlerkitError: the handler failed in the child, or compiled nothing (no ``pt2``
            compile in force), with the child's own words.
    """
    with tempfile.TemporaryDirectory(prefix="handlerkit-compile-cache-") as tmp:
        batch_path, result_path = os.path.join(tmp, "batch.pickle"), os.path.join(tmp, "result.json")
        with open(batch_path, "wb") as f:
            pickle.dump(getattr(batch, "data", batch), f)  # what handle() receives: plain, picklable
        argv = [sys.executable, "-m", __name__, os.path.abspath(model_dir), batch_path, os.path.abspath(out_dir)]
        done = subprocess.run(argv + [result_path], capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0 or not os.path.isfile(result_path):
            raise HandlerkitError(
                f"recording the compile cache of {label or model_dir} failed in the child process "
                f"(exit code {done.returncode}):\n{_tail(done.stderr)}",
                fix="run the same batch with handlerkit run MODEL FILES to see the handler's error, then build again",
            )
        with open(result_path, encoding="utf-8") as f:
            result = json.load(f)
    if result.get("error"):
        message = str(result["error"]).replace(os.path.abspath(model_dir), label or model_dir)
        raise HandlerkitError(message, fix=_NOT_COMPILED_FIX)
    return Recorded(
        cache=os.path.join(out_dir, CACHE_FILE),
        tag=os.path.join(out_dir, TAG_FILE),
        artifacts=result["artifacts"],
        first_call_s=result["first_call_s"],
        counters=result["counters"],
        kernels=os.path.join(out_dir, KERNELS_FILE) if result.get("kernel_files") else None,
    )


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


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

    from handlerkit.compile_kernels import current_facts, pack, record_sources, recording_config
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
