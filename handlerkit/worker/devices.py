"""Which accelerators exist, and which device a handler runs on.

Every device decision in handlerkit goes through the availability seams here
(:func:`cuda_available`, :func:`xpu_available`, :func:`mps_available`, :func:`xla_available`),
so a test fakes a CUDA, XPU, MPS or XLA machine by monkeypatching one function in this
module, with no GPU at hand. :func:`choose_device` is TorchServe's rule; :func:`device_kind`,
:func:`needs_sync` and :func:`synchronize` serve the timers; :func:`cpu_threads` says how many
threads torch runs on how many cores, and whether the machine is busy enough to hurt timings.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CpuThreads",
    "DeviceChoice",
    "availability",
    "choose_device",
    "cpu_threads",
    "cuda_available",
    "device_kind",
    "mps_available",
    "needs_sync",
    "synchronize",
    "threads_advice",
    "xla_available",
    "xpu_available",
]

_SYNCED_KINDS = ("cuda", "xpu", "mps")
#: How a thread warning tells the reader to set torch's threads, ``{n}`` the count: Python's
#: call in a notebook, the ``--threads`` option on the command line (:func:`threads_advice`).
_THREADS_ADVICE: contextvars.ContextVar[str] = contextvars.ContextVar(
    "handlerkit_threads_advice", default="torch.set_num_threads({n})"
)


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def xpu_available() -> bool:
    import torch

    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


def mps_available() -> bool:
    import torch

    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def xla_available() -> bool:
    # find_spec does not import torch_xla (which would grab the TPU).
    return importlib.util.find_spec("torch_xla") is not None


def availability() -> dict[str, bool]:
    """Availability of each accelerator kind, in handlerkit's order of preference."""
    return {"cuda": cuda_available(), "xpu": xpu_available(), "mps": mps_available(), "xla": xla_available()}


def xla_device() -> Any:
    import torch_xla.core.xla_model as xm  # only reached when xla_available()

    return xm.xla_device()


@dataclass
class DeviceChoice:
    """The device a handler chose, and why."""

    device: Any
    kind: str
    reason: str
    available: dict[str, bool] = field(default_factory=dict)


def choose_device(gpu_id: Any) -> DeviceChoice:
    """TorchServe's device rule: CUDA when ``gpu_id`` is given → XPU → MPS → XLA → CPU.

    ``gpu_id`` is the worker's ``system_properties["gpu_id"]``; ``None`` means the server
    gave this worker no GPU, which keeps every accelerator but XLA out.
    """
    import torch

    avail = availability()
    if gpu_id is not None and avail["cuda"]:
        return DeviceChoice(torch.device(f"cuda:{gpu_id}"), "cuda", f"CUDA is available and gpu_id={gpu_id!r}", avail)
    if gpu_id is not None and avail["xpu"]:
        return DeviceChoice(torch.device(f"xpu:{gpu_id}"), "xpu", f"XPU is available and gpu_id={gpu_id!r}", avail)
    if gpu_id is not None and avail["mps"]:
        return DeviceChoice(torch.device("mps"), "mps", f"MPS is available and gpu_id={gpu_id!r}", avail)
    if avail["xla"]:
        return DeviceChoice(xla_device(), "xla", "torch_xla is installed", avail)
    if gpu_id is None and any(avail[k] for k in ("cuda", "xpu", "mps")):
        found = ", ".join(k for k in ("cuda", "xpu", "mps") if avail[k])
        reason = f"no gpu_id was given, so {found} is left unused (TorchServe does the same)"
    else:
        reason = "no accelerator is available"
    return DeviceChoice(torch.device("cpu"), "cpu", reason, avail)


def device_kind(device: Any) -> str:
    """The device type of ``device`` (``None``, ``"cuda:0"``, ``torch.device``, …) as a string.

    ``None`` means CPU. Does not import torch.
    """
    if device is None:
        return "cpu"
    kind = getattr(device, "type", None)
    if isinstance(kind, str):
        return kind
    return str(device).split(":", 1)[0].strip().lower()


def _kind_available(kind: str) -> bool:
    if kind == "cuda":
        return cuda_available()
    if kind == "xpu":
        return xpu_available()
    if kind == "mps":
        return mps_available()
    return False


def needs_sync(device: Any) -> bool:
    """Whether timing work on ``device`` needs device synchronisation (an available
    CUDA, XPU or MPS device); False for CPU and None."""
    kind = device_kind(device)
    return kind in _SYNCED_KINDS and _kind_available(kind)


def synchronize(kind: str, device: Any = None) -> None:
    """Wait until all work queued on ``device`` (of type ``kind``) has finished."""
    import torch

    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "xpu":
        torch.xpu.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


@dataclass(frozen=True)
class CpuThreads:
    """torch's CPU threads against the cores this process may use and how busy they are.

    ``advice`` is how the warning says to set the threads, ``{n}`` the count: measured with
    the spelling in force (:func:`threads_advice`), so a report keeps the words of where it ran.
    """

    intra_op: int
    inter_op: int
    cores: int
    load: float | None  # the 1-minute load average (None where the system does not say)
    advice: str = "torch.set_num_threads({n})"

    @property
    def warning(self) -> str | None:
        """Why timings will suffer, or None: more intra-op threads than cores, or a machine
        busier than its cores with this process's threads on top (they wait for a core, and a
        small op takes many times its work: a 3x3 softmax took 9.7 ms on such a machine)."""
        if self.intra_op > self.cores:
            return (
                f"torch runs {self.intra_op} intra-op threads on {self.cores} usable core(s): they take turns, "
                f"and timings measure the waiting; {self.advice.format(n=self.cores)}"
            )
        if self.load is not None and self.intra_op > 1 and self.load >= self.cores + 1:
            return (
                f"torch runs {self.intra_op} intra-op threads on {self.cores} core(s) while the 1-minute load "
                f"is {self.load:.1f}: its threads wait for busy cores, and small ops take many times their "
                f"work; time on a quieter machine, or {self.advice.format(n=1)} for a small model"
            )
        return None

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-serialisable data: the counts, the load and the warning (None when none)."""
        return {
            "intra_op_threads": self.intra_op,
            "inter_op_threads": self.inter_op,
            "cores": self.cores,
            "load_1min": self.load,
            "warning": self.warning,
        }

    def __str__(self) -> str:
        load = f", 1-minute load {self.load:.1f}" if self.load is not None else ""
        return f"{self.intra_op} intra-op / {self.inter_op} inter-op threads, {self.cores} usable core(s){load}"


def cpu_threads() -> CpuThreads:
    """torch's intra- and inter-op thread counts, the cores this process may run on (its CPU
    affinity where the system has one) and the 1-minute load average."""
    import torch

    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        load: float | None = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    return CpuThreads(torch.get_num_threads(), torch.get_num_interop_threads(), cores, load, _THREADS_ADVICE.get())


@contextlib.contextmanager
def threads_advice(template: str) -> Iterator[None]:
    """Inside, thread warnings say to set torch's threads with ``template`` (``{n}`` the count),
    e.g. ``"run with --threads {n}"`` where a command line cannot call ``torch.set_num_threads``."""
    token = _THREADS_ADVICE.set(template)
    try:
        yield
    finally:
        _THREADS_ADVICE.reset(token)
