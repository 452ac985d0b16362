"""Write a model in each format so that handlerkit and TorchServe can load it."""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable, Mapping
from typing import Any

from handlerkit._optional import require
from handlerkit.formats.load import FORMATS, _quiet_deprecations
from handlerkit.formats.shapes import AOTI_NAMES

__all__ = ["export_model", "input_names"]

# With AOTI_RUNTIME_CHECK_INPUTS=1 at run time, AOTInductor checks input shapes, and by default
# checks a dynamic dimension against torch.export's lower bound of 2 (sizes 0 and 1 are
# specialised): a batch of 1 would be refused. Dims declared with min=1 must accept 1.
_AOTI_CONFIGS = {"aot_inductor.check_lowerbound": False}


def input_names(model: Any, count: int) -> list[str]:
    """The names of ``model``'s first ``count`` inputs: its ``forward``'s positional parameters
    (what the exporters call them), ``input_<i>`` past them (``*args``)."""
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())
    except (AttributeError, TypeError, ValueError):
        parameters = []
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    named = [p.name for p in parameters if p.kind in positional]
    return [named[i] if i < len(named) else f"input_{i}" for i in range(count)]


def export_model(
    model: Any,
    example_inputs: tuple,
    path: str | os.PathLike,
    fmt: str,
    *,
    dynamic_batch: bool = True,
    dynamic_dims: Mapping[int, Iterable[int]] | None = None,
    torchscript: str = "trace",
) -> str:
    """Write ``model`` in format ``fmt`` so handlerkit and TorchServe can load it.

    The inputs are named after ``forward``'s parameters (:func:`input_names`): ONNX Runtime and
    ``torch.export`` name them so in their errors, and an AOTInductor package keeps them in
    its metadata.

    Args:
        model: an ``nn.Module`` (put in eval mode here).
        example_inputs: a tuple of example tensors, batch first.
        path: where to write (``.pt`` for torchscript, ``.onnx``, ``.pt2`` for aoti/export,
            ``.so`` for aoti-so, a state_dict ``.pt`` for eager).
        fmt: one of :data:`FORMATS`.
        dynamic_batch: let the batch dimension vary (export, onnx, aoti).
        dynamic_dims: input position -> its other dimensions that may vary (export, onnx, aoti;
            ``torch.export.Dim.DYNAMIC``, so the exporter works out which of them are equal
            and fails when the model fixes one). TorchScript has no such setting.
        torchscript: ``"trace"`` (runs ``example_inputs`` once and records the operations:
            a branch on a tensor's value is frozen as taken) or ``"script"`` (compiles the
            Python source, branches kept; fails on Python TorchScript does not support).

    Returns:
        The path written, as a string.

    Raises:
        ImportError: ``fmt="onnx"`` without onnx and onnxscript (the message names the pip command).
        ValueError: an unknown format or ``torchscript`` value, or a dimension an input does not have.
    """
    import torch

    if torchscript not in ("trace", "script"):
        raise ValueError(f"torchscript must be 'trace' or 'script': got {torchscript!r}")
    path = os.fspath(path)
    model = model.eval()
    dims = {int(i): sorted({int(d) for d in ds}) for i, ds in (dynamic_dims or {}).items()}
    for i, ds in dims.items():
        rank = example_inputs[i].dim() if i < len(example_inputs) else -1
        if any(d < 1 or d >= rank for d in ds):
            raise ValueError(f"dynamic_dims {{{i}: {ds}}}: input {i} has dims 1 to {rank - 1} besides the batch")
    # torch.export specialises a dimension whose example size is 0 or 1, so a size-1 example
    # cannot be marked dynamic: trace with it repeated to 2 (a batch of 1, a list of one item).
    varying = {i: ([0] if dynamic_batch else []) + dims.get(i, []) for i in range(len(example_inputs))}
    example_inputs = tuple(_doubled(x, varying[i]) for i, x in enumerate(example_inputs))
    batch = torch.export.Dim("batch", min=1, max=1024)
    dynamic_shapes: Any = None
    if dynamic_batch or dims:
        dynamic_shapes = tuple(
            {**({0: batch} if dynamic_batch else {}), **dict.fromkeys(dims.get(i, []), torch.export.Dim.DYNAMIC)}
            for i in range(len(example_inputs))
        )
    names = input_names(model, len(example_inputs))
    if fmt == "eager":
        torch.save(model.state_dict(), path)
    elif fmt == "torchscript":
        with _quiet_deprecations():
            scripted = torch.jit.script(model) if torchscript == "script" else torch.jit.trace(model, example_inputs)
            torch.jit.save(scripted, path)
    elif fmt == "onnx":
        # torch.onnx.export's (default) dynamo exporter writes the file with onnxscript and onnx.
        for module in ("onnx", "onnxscript"):
            require(module, feature="exporting to ONNX", extra="onnx")
        # One self-contained file (weights inside, not in a "<file>.data" beside it that the model
        # names by its first file name): the file can be copied, renamed and named by a manifest.
        # Protobuf limits such a file to 2 GB.
        torch.onnx.export(
            model,
            example_inputs,
            path,
            input_names=names,
            dynamic_shapes=dynamic_shapes,
            external_data=False,
            verbose=False,
        )
    elif fmt in ("aoti", "export"):
        program = torch.export.export(model, example_inputs, dynamic_shapes=dynamic_shapes)
        if fmt == "export":
            torch.export.save(program, path)
        else:
            configs = {**_AOTI_CONFIGS, "aot_inductor.metadata": {AOTI_NAMES: ",".join(names)}}
            torch._inductor.aoti_compile_and_package(program, package_path=path, inductor_configs=configs)
    elif fmt == "aoti-so":
        import torch._export

        torch._export.aot_compile(
            model,
            example_inputs,
            dynamic_shapes=dynamic_shapes,
            options={"aot_inductor.output_path": path, **_AOTI_CONFIGS},
        )
    else:
        raise ValueError(f"unknown model format {fmt!r}; expected one of {FORMATS}")
    return path


def _doubled(x: Any, dims: list[int]) -> Any:
    """``x`` repeated along each of ``dims`` where its size there is 1."""
    import torch

    if not isinstance(x, torch.Tensor):
        return x
    for d in dims:
        if d < x.dim() and x.shape[d] == 1:
            x = torch.cat([x, x], dim=d)
    return x
