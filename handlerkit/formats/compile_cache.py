"""A compile cache shipped in a model dir: ``torch.compiler.save_cache_artifacts()``'s bytes and their tag.

``archive.build(..., compile_cache=batch)`` compiles the handler's model on a batch in a fresh
process (:func:`record`) and leaves these files in the model dir:

- ``compile-cache.bin``: the bytes of ``torch.compiler.save_cache_artifacts()`` (Inductor's
  FX graph cache and the AOTAutograd cache entries of every graph compiled, the "mega-cache");
- ``compile-kernels.zip`` (on CPU): the C++ kernels Inductor built from that source, which a
  cache hit would otherwise build again (:mod:`handlerkit.formats.compile_kernels`);
- ``compile-cache.json``: the tag that decides whether those bytes can serve here — the torch
  version (with its git revision), the Python version and the device kind (with the device
  name on an accelerator), plus what was recorded, for people.

``hk.BaseHandler`` calls :func:`load_shipped` before its first compiled call: when the tag
matches, ``torch.compiler.load_cache_artifacts()`` writes the entries into the local cache
dirs (``TORCHINDUCTOR_CACHE_DIR``), so the first compile finds them, and the kernels are
restored there when the machine, CPU capability and compiler they were built with match
(:attr:`CacheLoad.kernels`); when it does not, nothing is loaded and :attr:`CacheLoad.reason`
says why. torch itself refuses artifacts of another
torch version silently (their keys never match): the tag makes that a decision one can read.
"""

from __future__ import annotations

import json
import os
import pickle
import platform
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass, field
from typing import Any

from handlerkit.errors import HandlerkitError
from handlerkit.formats.compile_kernels import KERNELS_FILE

__all__ = [
    "CACHE_FILE",
    "CHILD",
    "TAG_FILE",
    "TAG_KEYS",
    "CacheLoad",
    "Recorded",
    "current_tag",
    "load_shipped",
    "record",
    "restore_kernels",
    "save_artifacts",
    "write",
]

CACHE_FILE = "compile-cache.bin"
TAG_FILE = "compile-cache.json"
#: The tag's keys that must match for the cache to be used (the others describe the recording).
TAG_KEYS = ("torch", "torch_git", "python", "device_kind", "device_name")


@dataclass
class CacheLoad:
    """What became of a model dir's shipped compile cache (``decisions.compile.cache``).

    Attributes:
        found: the model dir holds ``compile-cache.bin``.
        loaded: its artifacts were handed to ``torch.compiler.load_cache_artifacts``.
        reason: why it was, or was not, loaded.
        artifacts: artifacts loaded per cache (``{"inductor": 1, "aot_autograd": 1}``).
        seconds: the time the load took.
        tag: the shipped tag, as read.
        kernels: what became of the C++ kernels shipped beside it (``compile-kernels.zip``,
            :mod:`handlerkit.formats.compile_kernels`): ``found``, ``restored`` and ``present`` (files
            written into the Inductor cache dir, files it already had) and ``reason``.
    """

    found: bool = False
    loaded: bool = False
    reason: str = ""
    artifacts: dict[str, int] = field(default_factory=dict)
    seconds: float | None = None
    tag: dict[str, Any] = field(default_factory=dict)
    kernels: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def current_tag(device_kind: str, device: Any = None) -> dict[str, Any]:
    """The tag a cache recorded here now would carry (the :data:`TAG_KEYS`)."""
    import torch

    name = None
    if device_kind == "cuda" and torch.cuda.is_available():
        name = torch.cuda.get_device_name(device)
    return {
        "torch": torch.__version__,
        "torch_git": getattr(torch.version, "git_version", None),
        "python": platform.python_version(),
        "device_kind": device_kind,
        "device_name": name,
    }


def mismatch(shipped: dict[str, Any], here: dict[str, Any]) -> str | None:
    """Why a cache tagged ``shipped`` cannot serve ``here``; None when it can."""
    different = [
        f"{key} {shipped.get(key)!r} (here {here.get(key)!r})" for key in TAG_KEYS if shipped.get(key) != here.get(key)
    ]
    if not different:
        return None
    return "the compile cache was recorded with " + ", ".join(different)


def save_artifacts() -> tuple[bytes, dict[str, int]] | None:
    """``torch.compiler.save_cache_artifacts()``: the bytes and the artifacts per cache (None:
    nothing was compiled in this process)."""
    import torch

    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return None
    data, info = saved
    return data, _counts(info)


def write(model_dir: str, data: bytes, tag: dict[str, Any]) -> tuple[str, str]:
    """Write ``compile-cache.bin`` and its tag into ``model_dir``; the two paths."""
    cache, tag_path = os.path.join(model_dir, CACHE_FILE), os.path.join(model_dir, TAG_FILE)
    with open(cache, "wb") as f:
        f.write(data)
    with open(tag_path, "w", encoding="utf-8") as f:
        json.dump(tag, f, indent=2, sort_keys=True)
        f.write("\n")
    return cache, tag_path


def load_shipped(model_dir: str, device_kind: str, device: Any = None) -> CacheLoad:
    """Load the model dir's compile cache when its tag matches this process; else say why not."""
    cache = os.path.join(model_dir, CACHE_FILE)
    if not os.path.isfile(cache):
        return CacheLoad(reason=f"no {CACHE_FILE} in the model dir: the first call compiles from the local cache")
    result = CacheLoad(found=True)
    tag_path = os.path.join(model_dir, TAG_FILE)
    try:
        with open(tag_path, encoding="utf-8") as f:
            result.tag = json.load(f)
    except (OSError, ValueError) as exc:
        result.reason = (
            f"{CACHE_FILE} has no readable {TAG_FILE} ({type(exc).__name__}: {exc}); an untagged cache is not "
            "loaded: rebuild the archive with compile_cache= to tag it"
        )
        return result
    if not isinstance(result.tag, dict):
        result.tag, result.reason = {}, f"{TAG_FILE} is not a JSON object: rebuild the archive with compile_cache="
        return result
    why = mismatch(result.tag, current_tag(device_kind, device))
    if why is not None:
        result.reason = f"{why}: not loaded; rebuild the archive with compile_cache= where it will be served"
        return result
    import torch

    from handlerkit.formats.compile_kernels import apply_config

    changed = apply_config(result.tag.get("inductor_config"))  # before any compile: the FX graph keys hold them
    start = time.perf_counter()
    with open(cache, "rb") as f:
        info = torch.compiler.load_cache_artifacts(f.read())
    result.seconds = time.perf_counter() - start
    if info is None:
        result.reason = f"torch could not read {CACHE_FILE} (torch.compiler.load_cache_artifacts gave nothing)"
        return result
    result.loaded, result.artifacts = True, _counts(info)
    listed = ", ".join(f"{n} {kind}" for kind, n in result.artifacts.items()) or "no artifacts"
    result.reason = f"loaded {listed} from {CACHE_FILE} (tag matches) in {result.seconds:.2f} s"
    if changed:
        result.reason += f"; set {changed} as when recorded"
    result.kernels = restore_kernels(model_dir, result.tag)
    if result.kernels["found"]:
        result.reason += f"; {result.kernels['reason']}"
    return result


def restore_kernels(model_dir: str, tag: dict[str, Any]) -> dict[str, Any]:
    """Restore the model dir's ``compile-kernels.zip`` when the binaries' facts match here."""
    from handlerkit.formats import compile_kernels

    path = os.path.join(model_dir, compile_kernels.KERNELS_FILE)
    if not os.path.isfile(path):
        return {"found": False, "reason": f"no {compile_kernels.KERNELS_FILE}: the first call builds the C++ kernels"}
    shipped = tag.get("kernels")
    why = compile_kernels.mismatch(shipped if isinstance(shipped, dict) else {}, compile_kernels.current_facts())
    if why is not None:
        return {
            "found": True,
            "restored": 0,
            "reason": f"{why}: not restored, the first call builds them; rebuild the archive where it will be served",
        }
    try:
        restored, present = compile_kernels.restore(path)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        return {"found": True, "restored": 0, "reason": f"{compile_kernels.KERNELS_FILE} unreadable: {exc}"}
    reason = f"restored {restored} kernel files into the Inductor cache dir ({present} were there)"
    return {"found": True, "restored": restored, "present": present, "reason": reason}


def _counts(info: Any) -> dict[str, int]:
    artifacts = getattr(info, "artifacts", None) or {}
    return {str(kind): len(keys) for kind, keys in artifacts.items() if keys}


# The program that records a cache. A separate process because ``save_cache_artifacts`` holds every
# artifact compiled in its process since it started: in a notebook that has compiled other models,
# or this one already (Dynamo would then compile nothing new), an in-process recording would ship the
# wrong set. The child opens the model dir as a server would (``Service``), so it lives above the
# front door; this module only starts it, by name, and reads what it leaves.
CHILD = "handlerkit.cli._record_compile_cache"

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
        argv = [sys.executable, "-m", CHILD, os.path.abspath(model_dir), batch_path, os.path.abspath(out_dir)]
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
