"""Model formats: load each one so that ``model(tensor)`` works, and export to each.

TorchServe 0.12 loads eager (``modelFile`` + state_dict), TorchScript, ONNX and legacy
AOTInductor ``.so`` models, but only eager and TorchScript models run through its default
``inference``: its ``BaseHandler.initialize`` keeps an ONNX model as the bare
``onnxruntime.InferenceSession`` (``setup_ort_session``), which takes numpy arrays by input
name (``session.run(None, {...})``) and is not callable, so a handler whose ``inference``
calls ``self.model(*inputs)`` fails every request there. Here every loader returns a callable
that takes the model's inputs as positional torch tensors and returns tensors on the handler's
device (:class:`OnnxModel` for ONNX), so the default ``inference``, and a handler's own that
calls ``self.model(*inputs)``, serve every format.

An exported model accepts only the input sizes it was exported for: a dimension left fixed
(``torch.export``'s guard, ONNX Runtime's "Got: 2 Expected: 7", AOTInductor's check when
``AOTI_RUNTIME_CHECK_INPUTS=1``) refuses any other size. The loaders turn that refusal into an
:class:`ArtifactShapeError` naming the file, the input and the dimension, with the command that
re-exports it with that dimension dynamic (:func:`shape_refusal`).

=============  =============================================  ==============================
format         files                                          loader
=============  =============================================  ==============================
eager          ``modelFile`` (.py) + state_dict (optional)    the file's one class + torch.load
torchscript    ``.pt`` without ``modelFile``                  torch.jit.load
onnx           ``.onnx``                                      onnxruntime.InferenceSession
aoti           ``.pt2`` AOTInductor package                   torch._inductor.aoti_load_package
aoti-so        ``.so`` + ``pt2: {export: {aot_compile: true}}``  torch._export.aot_load (legacy)
export         ``.pt2`` ``torch.export`` program              torch.export.load(...).module()
=============  =============================================  ==============================
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import re
import warnings
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from handlerkit._optional import require
from handlerkit.errors import HandlerkitError, ModelLoadError

__all__ = [
    "FORMATS",
    "STATE_DICT_FIX",
    "ArtifactShapeError",
    "LoadedModel",
    "OnnxModel",
    "detect_format",
    "export_model",
    "input_names",
    "load_model",
    "shape_refusal",
]

FORMATS = ("eager", "torchscript", "onnx", "aoti", "aoti-so", "export")


@dataclass
class LoadedModel:
    """A loaded model and how it was loaded (read by the device and format reports)."""

    model: Any
    format: str
    loader: str
    path: str | None
    details: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------ an input size an artifact refuses
class ArtifactShapeError(HandlerkitError, RuntimeError):
    """A saved model refused an input's size because it was exported for another.

    A ``RuntimeError`` too, as the refusals of ``torch.export`` and AOTInductor it replaces were
    caught as such. ``fix`` says how to re-export the model with those dimensions dynamic.

    Attributes:
        artifact: the model file's name (``model.onnx``).
        input / dim / expected / got: the first dimension refused: the input's name
            (``forward``'s parameter; ``input 1`` when unknown), the dimension's index (0 is
            the batch), what the file takes (``"= 7"``, ``"<= 1024"``), the size the call gave
            (None when unknown).
        refused: every dimension refused that is known, as ``(input, dim, expected, got)``.
    """

    def __init__(self, message: str, *, fix: str, artifact: str, refused: list[tuple[str, int, str, int | None]]):
        super().__init__(message, fix=fix)
        self.artifact = artifact
        self.refused = refused
        self.input, self.dim, self.expected, self.got = refused[0]


_OPS = {"==": "=", "<=": "<=", ">=": ">=", "<": "<", ">": ">"}
_FLIPPED = {"<=": ">=", ">=": "<=", "<": ">", ">": "<", "==": "=="}
# What each runtime says when a dimension does not fit (ONNX Runtime's InvalidArgument,
# torch.export's guard, AOTInductor's input check with AOTI_RUNTIME_CHECK_INPUTS=1).
_REFUSALS = (
    re.compile(
        r"Got invalid dimensions for input: (?P<name>\S+) for the following indices\s+"
        r"index: (?P<dim>\d+) Got: (?P<got>\d+) Expected: (?P<expected>\d+)"
    ),
    re.compile(r"Guard failed: (?P<name>\w+)\.size\(\)\[(?P<dim>\d+)\] (?P<op>==|<=|>=|<|>) (?P<expected>\d+)\s*$"),
    re.compile(r"Guard failed: (?P<expected>\d+) (?P<rop>==|<=|>=|<|>) (?P<name>\w+)\.size\(\)\[(?P<dim>\d+)\]\s*$"),
    re.compile(
        r"input_handles\[(?P<index>\d+)\]: unmatched dim value at (?P<dim>\d+), expected: (?P<expected>\d+), "
        r"but got: (?P<got>\d+)"
    ),
    re.compile(
        r"input_handles\[(?P<index>\d+)\]: dim value is too (?:large|small) at (?P<dim>\d+), expected to be "
        r"(?P<op><=|>=) (?P<expected>\d+), but got: (?P<got>\d+)"
    ),
)
#: The lab format that re-exports a loaded format (the legacy .so is re-saved as a .pt2 package).
_LAB_FORMAT = {"onnx": "onnx", "export": "export", "aoti": "aoti", "aoti-so": "aoti"}


def shape_refusal(
    exc: BaseException,
    path: str | None,
    fmt: str,
    names: list[str] | None,
    inputs: tuple = (),
    fixed: list[dict[int, int]] | None = None,
) -> ArtifactShapeError | None:
    """The :class:`ArtifactShapeError` for ``exc`` when it is a runtime's refusal of an input
    size (else None): the file ``path`` of format ``fmt`` (one of :data:`FORMATS`), its inputs'
    ``names`` (by position; None when unknown), the ``inputs`` of the call that failed, and
    the sizes the file fixes (per input, dim -> size; None when unknown), so that every
    dimension refused is named, not only the first the runtime checked."""
    text = str(exc)
    for pattern in _REFUSALS:
        found = pattern.search(text)
        if found is not None:
            break
    else:
        return None
    parts = found.groupdict()
    dim = int(parts["dim"])
    names = list(names or [])
    if parts.get("index") is not None:
        index: int | None = int(parts["index"])
        name = names[index] if index < len(names) else f"input {index}"
    else:
        name = parts["name"]
        index = names.index(name) if name in names else None
    op = _FLIPPED[parts["rop"]] if parts.get("rop") else parts.get("op") or "=="
    got = int(parts["got"]) if parts.get("got") else _size(inputs, index, dim)
    refused = [(name, dim, f"{_OPS[op]} {parts['expected']}", got)]
    for i, sizes in enumerate(fixed or []):
        for d, size in sizes.items():
            actual = _size(inputs, i, d)
            key = names[i] if i < len(names) else f"input {i}"
            if actual is not None and actual != size and (key, d) != (name, dim):
                refused.append((key, d, f"= {size}", actual))
    position = {n: i for i, n in enumerate(names)}
    refused.sort(key=lambda r: (position.get(r[0], len(names)), r[1]))
    artifact = os.path.basename(path) if path else f"the {fmt} model"
    exported = " and ".join(f"{n} dim {d} {e}" for n, d, e, _ in refused)
    gives = [str(g) for *_, g in refused if g is not None]
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return ArtifactShapeError(
        f"{artifact} was exported for {exported}"
        + (f"; this call gives {' and '.join(gives)}" if len(gives) == len(refused) else "")
        + f" ({first})",
        fix=_reexport_fix(path, fmt, [(n, d) for n, d, *_ in refused]),
        artifact=artifact,
        refused=refused,
    )


def _size(inputs: tuple, index: int | None, dim: int) -> int | None:
    shape = getattr(inputs[index], "shape", None) if index is not None and index < len(inputs) else None
    return int(shape[dim]) if shape is not None and dim < len(shape) else None


def _reexport_fix(path: str | None, fmt: str, refused: list[tuple[str, int]]) -> str:
    lab = _LAB_FORMAT.get(fmt, fmt)
    model_dir = os.path.dirname(path) if path else "MODEL_DIR"
    command = f"handlerkit formats {model_dir} FILES --formats {lab} --save {lab} --replace"
    others = [(name.split()[-1], dim) for name, dim in refused if dim != 0]  # "input 1": the lab takes positions
    if not others:
        return (
            f"re-export it with a dynamic batch: {command} (in a notebook: h.compare_formats(batch, save={lab!r}, "
            "replace=True)); or send batches of the size it was exported for"
        )
    wanted: dict[str, list[int]] = {}
    for name, dim in others:
        wanted.setdefault(name, []).append(dim)
    declared = "{" + ", ".join(f"{int(n) if n.isdigit() else repr(n)}: {ds}" for n, ds in wanted.items()) + "}"
    labels = " and ".join(f"{name} dim {dim}" for name, dim in others)
    return (
        f"re-export it with {labels} dynamic: {command} --dynamic {','.join(f'{n}:{d}' for n, d in others)} "
        f"(in a notebook: h.compare_formats(batch, save={lab!r}, replace=True, dynamic_shapes={declared})); FILES "
        "whose requests differ in those sizes make the lab find them by itself"
    )


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

    from handlerkit.loading import list_classes, load_module_from_file

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


class _ShapeChecked:
    """A compiled model (AOTInductor's) whose refusal of an input size is an :class:`ArtifactShapeError`;
    every other attribute is the model's."""

    def __init__(self, model: Any, path: str, fmt: str, names: list[str] | None) -> None:
        self._model, self._path, self._format, self._names = model, path, fmt, names

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._model(*args, **kwargs)
        except RuntimeError as exc:
            refusal = shape_refusal(exc, self._path, self._format, self._names, args)
            if refusal is None:
                raise
            raise refusal from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def __repr__(self) -> str:
        return repr(self._model)


def _checked_forward(module: Any, path: str, names: list[str], fixed: list[dict[int, int]]) -> Any:
    """``module`` (a ``torch.export`` program's module) with its guard failures turned into
    :class:`ArtifactShapeError`. The forward is wrapped on the instance, so the module stays the
    ``nn.Module`` it is (its parameters are still found, ``.to`` still moves it)."""
    forward = module.forward

    @functools.wraps(forward)
    def checked(*args: Any, **kwargs: Any) -> Any:
        try:
            return forward(*args, **kwargs)
        except AssertionError as exc:  # torch._assert: "Guard failed: item_ids.size()[1] == 7"
            refusal = shape_refusal(exc, path, "export", names, args, fixed)
            if refusal is None:
                raise
            raise refusal from exc

    module.forward = checked
    return module


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

    from handlerkit.compile_kernels import without_isa_probes

    try:
        with without_isa_probes():  # no C++ probe builds in a fresh process: the package is compiled
            model = torch._inductor.aoti_load_package(path)
    except Exception as exc:
        raise ModelLoadError(f"torch._inductor.aoti_load_package({path!r}) failed: {exc}", path=path) from exc
    names = model.get_metadata().get(_AOTI_NAMES) if hasattr(model, "get_metadata") else None
    checked = _ShapeChecked(model, path, "aoti", names.split(",") if names else None)
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
    return LoadedModel(_ShapeChecked(model, path, "aoti-so", None), "aoti-so", "torch._export.aot_load", path, details)


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
    module = _checked_forward(module, path, list(program.graph_signature.user_inputs), _fixed_sizes(program))
    return LoadedModel(module, "export", "torch.export.load(...).module()", path, {"checks_input_shapes": True})


def _fixed_sizes(program: Any) -> list[dict[int, int]]:
    """The sizes a ``torch.export`` program fixes, per user input (a dynamic size is symbolic)."""
    user = set(program.graph_signature.user_inputs)
    fixed = []
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in user:
            shape = getattr(node.meta.get("val"), "shape", ())
            fixed.append({d: int(size) for d, size in enumerate(shape) if isinstance(size, int)})
    return fixed


# With AOTI_RUNTIME_CHECK_INPUTS=1 at run time, AOTInductor checks input shapes, and by default
# checks a dynamic dimension against torch.export's lower bound of 2 (sizes 0 and 1 are
# specialised): a batch of 1 would be refused. Dims declared with min=1 must accept 1.
_AOTI_CONFIGS = {"aot_inductor.check_lowerbound": False}
#: The package metadata key holding the inputs' names (AOTInductor's own errors say input_handles[1]).
_AOTI_NAMES = "handlerkit.input_names"


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
            configs = {**_AOTI_CONFIGS, "aot_inductor.metadata": {_AOTI_NAMES: ",".join(names)}}
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
