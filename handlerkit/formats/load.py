"""Load a model of each format onto the handler's device, callable with the model's inputs as
positional tensors (see :mod:`handlerkit.formats`)."""

from __future__ import annotations

import contextlib
import os
import warnings
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from handlerkit._optional import require
from handlerkit.errors import ModelLoadError
from handlerkit.formats.shapes import AOTI_NAMES, ShapeChecked, checked_forward, fixed_sizes, shape_refusal

__all__ = ["FORMATS", "STATE_DICT_FIX", "LoadedModel", "OnnxModel", "detect_format", "load_model", "onnx_providers"]

FORMATS = ("eager", "torchscript", "onnx", "aoti", "aoti-so", "export")


@dataclass
class LoadedModel:
    """A loaded model and how it was loaded (read by the device and format reports)."""

    model: Any
    format: str
    loader: str
    path: str | None
    details: dict[str, Any] = field(default_factory=dict)


def detect_format(model_pt_path: str | None, model_file: str | None, aot_compile: bool = False) -> str:
    """The format TorchServe's rules give a manifest's ``serializedFile`` / ``modelFile``.

    A ``modelFile`` makes the model eager. Without one, the serialized file's name decides, as
    ``str.endswith`` does in ``BaseHandler.initialize`` (case-sensitive): ``.pt`` is TorchScript,
    ``.onnx`` ONNX, ``.so`` AOTInductor (with ``pt2.export.aot_compile``); ``.pt2`` is
    handlerkit's own addition (an AOTInductor package or a ``torch.export`` program).

    Raises:
        ModelLoadError: no file at all; a ``.so`` without ``aot_compile``; a ``.pt2`` that is
            neither kind; any other name (``.pth``, ``.bin``, ``.PT``), for which TorchServe raises
            ``RuntimeError("No model weights could be loaded")``.
    """
    if model_file:
        return "eager"
    if not model_pt_path:
        raise ModelLoadError(
            "the manifest names neither a modelFile nor a serializedFile, so there is no model to load",
            fix="add 'serializedFile' (and 'modelFile' for an eager model) to MAR-INF/MANIFEST.json, "
            "or override initialize() in your handler",
        )
    # TorchServe tests the name with str.endswith, so the suffixes are case-sensitive.
    ext = os.path.splitext(model_pt_path)[1]
    if ext == ".onnx":
        return "onnx"
    if ext == ".so":
        if not aot_compile:
            raise ModelLoadError(
                f"{model_pt_path} is an AOTInductor shared library, which TorchServe loads only with "
                "'pt2: {export: {aot_compile: true}}' in model-config.yaml, and that is not set",
                path=model_pt_path,
                fix="add 'pt2: {export: {aot_compile: true}}' to model-config.yaml (or ship a .pt2 package)",
            )
        return "aoti-so"
    if ext == ".pt2":
        return _pt2_kind(model_pt_path)
    if ext == ".pt":
        return "torchscript"
    # .pth, .bin, .PT ... without a modelFile: no branch of BaseHandler.initialize takes them.
    raise ModelLoadError(
        f"serializedFile {os.path.basename(model_pt_path)!r} without a modelFile is no model TorchServe "
        "can load: it reads such a file as TorchScript only when its name ends in '.pt' (case-sensitive), "
        "and otherwise fails with RuntimeError 'No model weights could be loaded'",
        path=model_pt_path,
        fix="add modelFile (and the model.py defining the class) to the manifest",
    )


def _pt2_kind(path: str) -> str:
    """Tell an AOTInductor package from a torch.export program: both are .pt2 zip archives."""
    _require_file(path, "serializedFile")
    try:
        names = zipfile.ZipFile(path).namelist()
    except zipfile.BadZipFile as exc:
        raise ModelLoadError(
            f"{path} is not a .pt2 archive (not a zip file)",
            path=path,
            fix="write it with torch._inductor.aoti_compile_and_package or torch.export.save "
            "(handlerkit.formats.export_model does either)",
        ) from exc
    if any("/data/aotinductor/" in n for n in names):
        return "aoti"
    if any(n.endswith("models/model.json") or "serialized_exported_program" in n for n in names):
        return "export"
    raise ModelLoadError(
        f"{path} is a .pt2 archive with neither an AOTInductor model nor an exported program in it",
        path=path,
        fix="write it with torch._inductor.aoti_compile_and_package or torch.export.save "
        "(handlerkit.formats.export_model does either)",
    )


def _require_file(path: str, role: str) -> None:
    if not os.path.isfile(path):
        raise ModelLoadError(
            f"the manifest's {role} is {os.path.basename(path)!r} but {path} does not exist",
            path=path,
            fix="put the file in the model dir or correct MAR-INF/MANIFEST.json",
        )


def load_model(
    fmt: str, *, device: Any, model_dir: str, model_pt_path: str | None, model_file: str | None = None
) -> LoadedModel:
    """Load a model of format ``fmt`` onto ``device``.

    Every failure is a :class:`~handlerkit.errors.ModelLoadError` naming the file (and, in
    ``fix``, what to do where handlerkit knows); an ONNX model without onnxruntime installed is
    an ImportError that names the pip command.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown model format {fmt!r}; expected one of {FORMATS}")
    if fmt == "eager":
        return _load_eager(model_dir, model_file or "", model_pt_path, device)
    if model_pt_path is None:
        raise ModelLoadError(
            f"format {fmt!r} needs a serializedFile, and none was given",
            fix="name the model file in the manifest's serializedFile",
        )
    _require_file(model_pt_path, "serializedFile")
    if fmt == "torchscript":
        return _load_torchscript(model_pt_path, device)
    if fmt == "onnx":
        return _load_onnx(model_pt_path, device)
    if fmt == "aoti":
        return _load_aoti(model_pt_path, device)
    if fmt == "aoti-so":
        return _load_aoti_so(model_pt_path, device)
    return _load_export(model_pt_path, device)


def _load_eager(model_dir: str, model_file: str, model_pt_path: str | None, device: Any) -> LoadedModel:
    import torch

    from handlerkit.worker.loading import list_classes, load_module_from_file

    model_def_path = os.path.join(model_dir, model_file)
    _require_file(model_def_path, "modelFile")
    try:
        # Loaded by path under a unique name: a notebook may hold several model dirs, each
        # with its own model.py, where TorchServe would have one process per model. Executed
        # afresh on every initialize (a worker start in TorchServe), so an edited file is seen.
        module = load_module_from_file(model_def_path, reload=True)
    except Exception as exc:
        cause = exc.__cause__ or exc
        raise ModelLoadError(
            f"importing modelFile {model_def_path} failed: {type(cause).__name__}: {cause}",
            path=model_def_path,
            fix=f"correct {model_file} (it is imported with the model dir first on sys.path, as TorchServe does)",
        ) from exc
    # TorchServe's _load_pickled_model counts every class defined in the file (nn.Module or not).
    classes = list_classes(module)
    if len(classes) != 1:
        names = ", ".join(c.__name__ for c in classes) or "none"
        raise ModelLoadError(
            f"modelFile {model_def_path} must define exactly one model class; found {names}: TorchServe "
            "counts every class defined in it, helpers included, and raises ValueError 'Expected only "
            "one class as model definition'",
            path=model_def_path,
            fix="keep one nn.Module class in it and import the others from another file",
        )
    model_class = classes[0]
    try:
        model = model_class()
    except Exception as exc:
        raise ModelLoadError(
            f"{model_class.__name__}() (from {model_def_path}) failed: {exc!r}; TorchServe builds the "
            "model class with no arguments",
            path=model_def_path,
            fix="give every constructor argument a default",
        ) from exc
    details: dict[str, Any] = {"model_file": model_def_path, "model_class": model_class.__qualname__}
    if model_pt_path:
        _require_file(model_pt_path, "serializedFile")
        try:
            state_dict = torch.load(model_pt_path, map_location=device, weights_only=True)
        except Exception as exc:
            raise ModelLoadError(
                f"torch.load({model_pt_path!r}, weights_only=True) failed: {exc}",
                path=model_pt_path,
                fix="save the weights with torch.save(model.state_dict(), path) (a pickled whole model is not loaded)",
            ) from exc
        if not isinstance(state_dict, dict):
            raise ModelLoadError(
                f"{model_pt_path} holds a {type(state_dict).__name__}, not a state_dict",
                path=model_pt_path,
                fix="save the weights with torch.save(model.state_dict(), path)",
            )
        _load_state_dict(model, state_dict, model_pt_path, model_class.__name__)
        details["state_dict_tensors"] = len(state_dict)
    model.to(device)
    model.eval()
    return LoadedModel(
        model, "eager", f"{model_class.__name__}() + torch.load(weights_only=True)", model_pt_path, details
    )


#: The fix for weights that do not fit the model class (torch's "Error(s) in loading state_dict" too).
STATE_DICT_FIX = "ship the model.py the weights were trained with, or re-save the weights from it"


def _load_state_dict(model: Any, state_dict: dict, path: str, class_name: str) -> None:
    """``model.load_state_dict(state_dict)`` as TorchServe calls it (strict), or an error that
    lists every key and shape that does not fit. The keys are judged by torch, so a module that
    accepts a key it does not keep (torchvision's ``FrozenBatchNorm2d`` drops
    ``num_batches_tracked``) is not blamed for it."""
    own = model.state_dict()
    misfits = {
        k: f"{k}: file {tuple(state_dict[k].shape)} vs model {tuple(own[k].shape)}"
        for k in own
        if k in state_dict and hasattr(state_dict[k], "shape") and tuple(state_dict[k].shape) != tuple(own[k].shape)
    }
    fitting = {k: v for k, v in state_dict.items() if k not in misfits}
    result = model.load_state_dict(fitting, strict=False)
    missing = [k for k in result.missing_keys if k not in misfits]
    problems = []
    if missing:
        problems.append(f"missing keys {_preview(missing)}")
    if result.unexpected_keys:
        problems.append(f"unexpected keys {_preview(result.unexpected_keys)}")
    if misfits:
        problems.append(f"shape mismatches {_preview(list(misfits.values()))}")
    if problems:
        raise ModelLoadError(
            f"the state_dict in {path} does not fit {class_name}: " + "; ".join(problems), path=path, fix=STATE_DICT_FIX
        )


def _preview(items: list[str], n: int = 4) -> str:
    shown = ", ".join(items[:n])
    return f"[{shown}{', ...' if len(items) > n else ''}] ({len(items)})"


@contextlib.contextmanager
def _quiet_deprecations() -> Iterator[list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def _load_torchscript(path: str, device: Any) -> LoadedModel:
    import torch

    with _quiet_deprecations() as caught:
        try:
            model = torch.jit.load(path, map_location=device)
        except Exception as exc:
            raise ModelLoadError(
                f"torch.jit.load({path!r}) failed: {exc}; without a modelFile, TorchServe reads a .pt "
                "file as TorchScript",
                path=path,
                fix="for a state_dict, add modelFile (the .py that defines the model class) to the manifest",
            ) from exc
    model.eval()
    notes = [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))]
    return LoadedModel(model, "torchscript", "torch.jit.load", path, {"deprecation": notes[:1]})


def onnx_providers(device: Any) -> list[str]:
    """onnxruntime providers for a device, as TorchServe picks them: CUDA first on a GPU."""
    kind = getattr(device, "type", str(device))
    return ["CUDAExecutionProvider", "CPUExecutionProvider"] if kind == "cuda" else ["CPUExecutionProvider"]


class OnnxModel:
    """An onnxruntime session that is called like a torch module: tensors in, tensors out.

    Inputs are matched to the session's inputs by position; outputs come back as one tensor
    (single output) or a tuple, on ``device``. An input size the file was not exported for is
    an :class:`ArtifactShapeError` (ONNX Runtime's ``InvalidArgument`` chained to it).
    """

    def __init__(self, session: Any, device: Any, path: str | None = None):
        self.session = session
        self.device = device
        self.path = path
        self.input_names = [i.name for i in session.get_inputs()]
        self.output_names = [o.name for o in session.get_outputs()]
        # The sizes the file fixes (a symbolic dimension is a name, not an int).
        self.fixed_dims = [
            {d: size for d, size in enumerate(i.shape or []) if isinstance(size, int)} for i in session.get_inputs()
        ]

    def __call__(self, *inputs: Any) -> Any:
        import torch

        if len(inputs) != len(self.input_names):
            raise TypeError(
                f"the ONNX model takes {len(self.input_names)} input(s) {self.input_names}, got {len(inputs)}"
            )
        feed = {
            name: (x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x)
            for name, x in zip(self.input_names, inputs)
        }
        try:
            results = self.session.run(None, feed)
        except Exception as exc:
            refusal = shape_refusal(exc, self.path, "onnx", self.input_names, inputs, self.fixed_dims)
            if refusal is None:
                raise
            raise refusal from exc
        outputs = [torch.from_numpy(o).to(self.device) for o in results]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def eval(self) -> OnnxModel:
        return self

    def to(self, device: Any) -> OnnxModel:
        self.device = device
        return self

    def __repr__(self) -> str:
        return f"OnnxModel(inputs={self.input_names}, outputs={self.output_names}, providers={self.session.get_providers()})"


def _load_onnx(path: str, device: Any) -> LoadedModel:
    ort = require("onnxruntime", feature="loading .onnx models", extra="onnx")
    wanted = onnx_providers(device)
    providers = [p for p in wanted if p in ort.get_available_providers()] or ["CPUExecutionProvider"]
    options = ort.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    try:
        session = ort.InferenceSession(path, sess_options=options, providers=providers)
    except Exception as exc:
        raise ModelLoadError(f"onnxruntime could not open {path}: {exc}", path=path) from exc
    details = {"providers_wanted": wanted, "providers": session.get_providers()}
    return LoadedModel(OnnxModel(session, device, path), "onnx", "onnxruntime.InferenceSession", path, details)


def _load_aoti(path: str, device: Any) -> LoadedModel:
    import torch

    from handlerkit.formats.compile_kernels import without_isa_probes

    try:
        with without_isa_probes():  # no C++ probe builds in a fresh process: the package is compiled
            model = torch._inductor.aoti_load_package(path)
    except Exception as exc:
        raise ModelLoadError(f"torch._inductor.aoti_load_package({path!r}) failed: {exc}", path=path) from exc
    names = model.get_metadata().get(AOTI_NAMES) if hasattr(model, "get_metadata") else None
    checked = ShapeChecked(model, path, "aoti", names.split(",") if names else None)
    return LoadedModel(checked, "aoti", "torch._inductor.aoti_load_package", path, _aoti_details())


def _load_aoti_so(path: str, device: Any) -> LoadedModel:
    import torch
    import torch._export

    kind = getattr(device, "type", str(device))
    try:
        model = torch._export.aot_load(path, kind)
    except Exception as exc:
        raise ModelLoadError(f"torch._export.aot_load({path!r}) failed: {exc}", path=path) from exc
    details = {
        **_aoti_details(),
        "deprecated": "legacy .so path; prefer a .pt2 package (torch._inductor.aoti_compile_and_package)",
    }
    return LoadedModel(ShapeChecked(model, path, "aoti-so", None), "aoti-so", "torch._export.aot_load", path, details)


def _aoti_details() -> dict[str, Any]:
    # The compiled model reads AOTI_RUNTIME_CHECK_INPUTS from the environment at its first call
    # (not at compile time); unchecked, wrong input shapes run and may return garbage.
    checked = os.environ.get("AOTI_RUNTIME_CHECK_INPUTS", "")[:1] not in ("", "0")
    return {
        "input_checks": checked,
        "note": "input shapes are checked only when AOTI_RUNTIME_CHECK_INPUTS=1 is set before the model "
        "first runs; export with aot_inductor.check_lowerbound=False (export_model does) so a batch "
        "of 1 passes the checks",
    }


def _load_export(path: str, device: Any) -> LoadedModel:
    import torch

    try:
        program = torch.export.load(path)
    except Exception as exc:
        raise ModelLoadError(f"torch.export.load({path!r}) failed: {exc}", path=path) from exc
    module = program.module()
    with contextlib.suppress(Exception):  # already on the right device when it is the CPU
        module = module.to(device)
    module = checked_forward(module, path, list(program.graph_signature.user_inputs), fixed_sizes(program))
    return LoadedModel(module, "export", "torch.export.load(...).module()", path, {"checks_input_shapes": True})
