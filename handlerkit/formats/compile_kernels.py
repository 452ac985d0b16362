"""Inductor's compiled C++ kernels, shipped beside the compile cache: ``compile-kernels.zip``.

Why a second file: ``compile-cache.bin`` (the mega-cache) holds the FX graph cache's entries,
which are generated *source*. On CPU, a fresh process that hits them still builds every C++
kernel with the system compiler, and Inductor's CPU-ISA probes too: most of a cold start.
Inductor keeps each binary in its cache dir (``TORCHINDUCTOR_CACHE_DIR``) beside the source it
was built from, both named after one hash of that source and its compile command line
(``torch._inductor.codecache.write``'s key). The command line holds the compiler, the ISA flags
and torch's include paths, so the same source gives the same name in any process of the same
install, and Inductor builds nothing when a file of that name is there.

Inductor's precompiled header (``cpp_cache_precompile_headers``, on by default) would undo
this: a process builds it (a ~150 MB ``.gch``, seconds to tens of seconds) before it even looks
for a kernel's binary, and it lives outside the cache dir, in the temp dir. Shipped binaries
need no header, so the recording turns it off (:func:`recording_config`), and since the FX
graph cache's key includes that setting, the serving process turns it off too
(:func:`apply_config`) before its first compile, or every shipped entry would miss.

So the recording process notes the key of every source Inductor writes or looks up
(:func:`record_sources`), :func:`pack` zips the files of the cache dir that carry those keys,
and :func:`restore` puts them back in this process's cache dir, never over a file it already
has. :func:`current_facts` are what the binaries depend on beyond the compile cache's own tag
(the machine, the CPU's capability, the C++ compiler): ``hk.BaseHandler`` restores them only
where those match, and says why not where they don't.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import tempfile
import zipfile
from collections.abc import Iterator
from typing import Any

__all__ = [
    "KERNELS_FILE",
    "RECORDING_CONFIG",
    "apply_config",
    "current_facts",
    "mismatch",
    "pack",
    "record_sources",
    "recording_config",
    "restore",
    "without_isa_probes",
]

KERNELS_FILE = "compile-kernels.zip"
#: Files of a key Inductor rebuilds or rewrites cheaply itself: not shipped.
_SKIPPED = (".lock", ".py")


#: Inductor settings the recording runs under, in the tag, applied again where it is served.
RECORDING_CONFIG: dict[str, Any] = {"cpp_cache_precompile_headers": False}


def recording_config() -> dict[str, Any]:
    """Set :data:`RECORDING_CONFIG` in this process (the recording child); the settings, for the tag."""
    from torch._inductor import config

    for name, value in RECORDING_CONFIG.items():
        setattr(config, name, value)
    return dict(RECORDING_CONFIG)


def apply_config(recorded: Any) -> str | None:
    """Set the Inductor settings a cache was recorded under (only those of :data:`RECORDING_CONFIG`).

    Returns what changed, for the load's reason; None when nothing did. Process-wide, as the
    compile cache itself: a later compile of another model here also runs without them.
    """
    from torch._inductor import config

    if not isinstance(recorded, dict):
        return None
    changed = []
    for name, value in recorded.items():
        if name in RECORDING_CONFIG and getattr(config, name, value) != value:
            setattr(config, name, value)
            changed.append(f"torch._inductor.config.{name} = {value!r}")
    return ", ".join(changed) or None


@functools.lru_cache(1)
def current_facts() -> dict[str, Any]:
    """What Inductor's C++ binaries depend on here, beyond torch and Python (the cache's own tag)."""
    import torch

    try:
        from torch._inductor.cpp_builder import get_compiler_version_info, get_cpp_compiler

        compiler = get_cpp_compiler()
        version = get_compiler_version_info(compiler).strip().splitlines()
        compiler_info: str | None = f"{compiler}: {version[-1] if version else '?'}"
    except Exception as exc:  # no compiler found: Inductor could not build the kernels either
        compiler_info = f"none ({type(exc).__name__})"
    return {
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpp_compiler": compiler_info,
    }


def mismatch(shipped: dict[str, Any], here: dict[str, Any]) -> str | None:
    """Why kernels recorded with ``shipped`` facts cannot serve ``here``; None when they can."""
    different = [
        f"{key} {shipped.get(key)!r} (here {here.get(key)!r})" for key in here if shipped.get(key) != here[key]
    ]
    return "the kernels were built with " + ", ".join(different) if different else None


@contextlib.contextmanager
def without_isa_probes() -> Iterator[None]:
    """While open, loading an AOTInductor package compiles no CPU-ISA probe.

    The loader asks for this machine's vector ISA only to compare it with the package's (a
    warning: the package is compiled already), and torch answers by compiling a probe program
    per ISA, seconds in a fresh process with an empty cache dir. Here that one comparison is
    left out, unless the ISA is known in this process already (then it costs nothing).
    """
    try:
        from torch._inductor import codecache, cpu_vec_isa

        original = codecache.get_device_information
        known = cpu_vec_isa.valid_vec_isa_list.cache_info().currsize > 0
    except (ImportError, AttributeError):  # another torch: load as it does
        yield
        return
    if known:
        yield
        return

    def without_isa(device_type: str) -> dict[str, str]:
        return {k: v for k, v in _device_information(device_type).items() if k != "AOTI_CPU_ISA"}

    codecache.get_device_information = without_isa  # the loader imports it at each load
    try:
        yield
    finally:
        codecache.get_device_information = original


def _device_information(device_type: str) -> dict[str, str]:
    """torch's ``get_device_information`` less the ISA (which it computes by probing)."""
    import sys

    from torch._inductor.codecache import get_interface_for_device

    return {
        "AOTI_PLATFORM": sys.platform,
        "AOTI_MACHINE": platform.machine(),
        "AOTI_COMPUTE_CAPABILITY": str(get_interface_for_device(device_type).get_compute_capability()),
    }


@contextlib.contextmanager
def record_sources() -> Iterator[list[str]]:
    """Note the path of every file Inductor's ``codecache.write`` writes or finds, while open.

    Every C++ kernel, its linked main library and each CPU-ISA probe goes through ``write`` before
    it is built or loaded, in a warm cache as in a cold one: the list names exactly the binaries
    this process used, not the rest of a shared cache dir.
    """
    from torch._inductor import codecache

    seen: list[str] = []
    original = codecache.write

    def write(*args: Any, **kwargs: Any) -> tuple[str, str]:
        key, path = original(*args, **kwargs)
        seen.append(path)
        return key, path

    codecache.write = write  # the module global its callers look up
    try:
        yield seen
    finally:
        codecache.write = original


def cache_dir() -> str:
    """This process's Inductor cache dir (``TORCHINDUCTOR_CACHE_DIR`` or torch's default)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir

    return inductor_cache_dir()


def pack(sources: list[str], out_dir: str) -> tuple[str, int] | None:
    """Zip the cache dir's files that share a key with ``sources`` into ``out_dir``; path and count.

    None when no source was a C++ one (nothing to ship: a GPU graph's kernels are in the mega-cache).
    """
    root = cache_dir()
    names: set[str] = set()
    for source in sources:
        folder, key = os.path.dirname(source), os.path.basename(source).split(".", 1)[0]
        if os.path.commonpath([root, os.path.abspath(folder)]) != root or not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            if name.split(".", 1)[0] == key and not name.endswith(_SKIPPED):
                names.add(os.path.relpath(os.path.join(folder, name), root))
    if not any(name.endswith(".so") for name in names):
        return None
    path = os.path.join(out_dir, KERNELS_FILE)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(names):
            zf.write(os.path.join(root, name), name)
    return path, len(names)


def restore(path: str) -> tuple[int, int]:
    """Put the kernels of ``path`` into this process's cache dir; (restored, already there).

    Each file is written under a temporary name and renamed, so a process building the same key
    at the same time never loads half a library.

    Raises:
        ValueError: a member would land outside the cache dir (not a zip this module wrote).
    """
    root = cache_dir()
    restored = present = 0
    with zipfile.ZipFile(path) as zf:
        for member in zf.infolist():
            target = os.path.abspath(os.path.join(root, member.filename))
            if member.is_dir() or os.path.commonpath([root, target]) != root:
                raise ValueError(f"{path} holds {member.filename!r}, which is not a file of the Inductor cache dir")
            if os.path.exists(target):
                present += 1
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            fd, partial = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".handlerkit-")
            with os.fdopen(fd, "wb") as out:
                out.write(zf.read(member))
            os.chmod(partial, 0o755 if member.filename.endswith(".so") else 0o644)
            os.replace(partial, target)
            restored += 1
    return restored, present
