"""Where a handler runs and why (``Harness.device_report``): the device decision, the
accelerators, TF32, where the model's parameters and each stage's tensors live, and the
host<->device copies inside inference."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from handlerkit._render import Rendered, Table
from handlerkit.diagnostics._view import HarnessView
from handlerkit.worker import devices as _devices
from handlerkit.worker.devices import CpuThreads

__all__ = [
    "DeviceReport",
    "build_device_report",
    "fp32_precision_state",
    "gpu_facts",
    "model_placement",
    "watch_copies",
]


def gpu_facts(device: Any) -> dict[str, Any]:
    """Name, compute capability and memory of a CUDA device (empty elsewhere)."""
    import torch

    if getattr(device, "type", None) != "cuda" or not _devices.cuda_available():
        return {}
    props = torch.cuda.get_device_properties(device)
    return {
        "name": props.name,
        "capability": f"{props.major}.{props.minor}",
        "total_memory": props.total_memory,
        "allocated": torch.cuda.memory_allocated(device),
        "reserved": torch.cuda.memory_reserved(device),
    }


def fp32_precision_state() -> dict[str, str]:
    """TF32 state through the new ``fp32_precision`` API only (reading the legacy flags
    after the new API was used raises in PyTorch 2.14)."""
    import torch

    return {
        "matmul (cuda)": str(torch.backends.cuda.matmul.fp32_precision),
        "cudnn conv": str(torch.backends.cudnn.conv.fp32_precision),  # type: ignore[attr-defined]
        "cudnn rnn": str(torch.backends.cudnn.rnn.fp32_precision),  # type: ignore[attr-defined]
    }


def model_placement(model: Any) -> dict[str, dict[str, int]]:
    """``{"parameters" | "buffers": {"cpu float32": count, ...}}`` for a torch module."""
    import torch

    placement: dict[str, dict[str, int]] = {"parameters": {}, "buffers": {}}
    module = getattr(model, "_orig_mod", model)  # a torch.compile wrapper
    if not isinstance(module, torch.nn.Module):
        return placement
    for kind, tensors in (("parameters", module.parameters()), ("buffers", module.buffers())):
        for t in tensors:
            key = f"{t.device} {str(t.dtype).replace('torch.', '')}"
            placement[kind][key] = placement[kind].get(key, 0) + t.numel()
    return placement


@dataclass(repr=False)
class DeviceReport(Rendered):
    """Where a handler runs and why, and what looks wrong about it."""

    handler: str
    device: str
    reason: str
    available: dict[str, bool]
    gpu: dict[str, Any]
    fp32_precision: dict[str, str]
    tf32: dict[str, Any]
    model_format: str
    placement: dict[str, dict[str, int]]
    stage_devices: dict[str, list[str]]
    copies: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    threads: CpuThreads | None = None  # torch's CPU threads, the cores and the load

    def rows(self) -> list[tuple[str, Any]]:
        rows: list[tuple[str, Any]] = [
            ("handler", self.handler),
            ("device", self.device),
            ("why", self.reason),
            ("available", ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in self.available.items())),
        ]
        for key, value in self.gpu.items():
            rows.append((f"gpu {key}", value))
        precision = ", ".join(f"{k}={'default' if v == 'none' else v}" for k, v in self.fp32_precision.items())
        if not self.device.startswith("cuda"):
            precision += f" (CUDA settings; this handler runs on {self.device})"
        rows.append(("fp32 precision (TF32)", precision))
        if self.tf32:
            rows.append(("tf32 setting", f"{self.tf32.get('setting')} (applied: {self.tf32.get('applied')})"))
        if self.model_format:
            rows.append(("model format", self.model_format))
        for kind, where in self.placement.items():
            if where:
                rows.append((f"model {kind}", ", ".join(f"{k}: {n:,}" for k, n in where.items())))
        for stage, devices in self.stage_devices.items():
            rows.append((f"{stage} tensors", ", ".join(devices) or "none"))
        for copy in self.copies:
            rows.append(("copy in inference", copy))
        if self.threads is not None:
            rows.append(("torch threads", str(self.threads)))
            if self.threads.warning:
                rows.append(("threads", self.threads.warning))
        for w in self.warnings:
            rows.append(("warning", w))
        return rows

    def _summary(self) -> str:
        verdict = f", {len(self.warnings)} warning(s)" if self.warnings else ""
        return f"device report of {self.handler}: {self.device}{verdict}"

    def _tables(self) -> list[Table]:
        return [Table(("", ""), self.rows())]


def _inference_copies(harness: HarnessView) -> list[str]:
    """Re-run inference once on the last preprocess output, watching for device copies."""
    pre = harness.results.get("preprocess")
    if harness.handler is None or pre is None or not pre.ok or harness.single_stage:
        return []
    try:
        with harness.imports():
            _, copies = watch_copies(lambda: harness.handler.inference(pre.output))
    except Exception as exc:  # the report must not fail because a re-run did
        return [f"(could not re-run inference to watch copies: {type(exc).__name__}: {exc})"]
    return copies


def build_device_report(harness: HarnessView) -> DeviceReport:
    """The device report of a harness's handler, from its decisions and its last stages."""
    handler = harness.handler
    decisions = getattr(handler, "decisions", None)
    device = getattr(handler, "device", None)
    if decisions is not None and getattr(decisions, "device", None):
        reason, available, tf32, fmt = (
            decisions.device_reason,
            decisions.available,
            decisions.tf32,
            decisions.model_format,
        )
    else:  # TorchServe's own handlers and function handlers record nothing: derive
        reason = "chosen by the handler (it does not record why)"
        available, tf32, fmt = _devices.availability(), {}, ""
    model = getattr(handler, "model", None)
    placement = model_placement(model) if model is not None else {"parameters": {}, "buffers": {}}
    stage_devices = {name: r.devices for name, r in harness.results.items() if name != "initialize"}
    report = DeviceReport(
        handler=harness.name,
        device=str(device) if device is not None else "unknown",
        reason=reason,
        available=available,
        gpu=gpu_facts(device),
        fp32_precision=fp32_precision_state(),
        tf32=tf32,
        model_format=fmt,
        placement=placement,
        stage_devices=stage_devices,
        copies=_inference_copies(harness),
        threads=_devices.cpu_threads(),
    )
    model_devices = {key.split(" ")[0] for where in placement.values() for key in where}
    if len(model_devices) > 1:
        report.warnings.append(f"the model is spread over {sorted(model_devices)}: move it with model.to(self.device)")
    if (
        device is not None
        and model_devices
        and str(device) not in model_devices
        and not (str(device).startswith("cuda") and any(d.startswith("cuda") for d in model_devices))
    ):
        report.warnings.append(f"the handler's device is {device} but the model lives on {sorted(model_devices)}")
    for stage, devices in stage_devices.items():
        if len(devices) > 1 and stage == "inference":
            report.warnings.append(f"inference sees tensors on {devices}: inputs and model should share one device")
    if report.copies:
        report.warnings.append(
            f"{len(report.copies)} host<->device cop{'y' if len(report.copies) == 1 else 'ies'} inside inference: "
            "move data in preprocess and results in postprocess"
        )
    return report


def watch_copies(fn: Any) -> tuple[Any, list[str]]:
    """Call ``fn()`` and list the tensor copies between devices it makes (``.to``, ``.cpu``,
    ``.cuda``, ``copy_``) and the host reads of device tensors (``.item``, ``.tolist``,
    ``.numpy``) — each one a synchronisation point inside a stage."""
    import torch
    from torch.overrides import TorchFunctionMode

    copies: list[str] = []
    moves = {torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.cuda}
    reads = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.numpy}

    class _Watch(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            source = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if source is None:
                return out
            if func in moves and isinstance(out, torch.Tensor) and out.device != source.device:
                copies.append(f"{func.__name__}: {source.device} -> {out.device} {list(source.shape)}")
            elif (
                func is torch.Tensor.copy_
                and len(args) > 1
                and isinstance(args[1], torch.Tensor)
                and args[1].device != source.device
            ):
                copies.append(f"copy_: {args[1].device} -> {source.device} {list(source.shape)}")
            elif func in reads and source.device.type != "cpu":
                copies.append(f"{func.__name__}: {source.device} -> host {list(source.shape)}")
            return out

    with _Watch():
        result = fn()
    return result, copies
