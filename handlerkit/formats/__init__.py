"""Model formats: load each one so that ``model(tensor)`` works, export to each, and say which
input size a saved one refuses.

TorchServe 0.12 loads eager (``modelFile`` + state_dict), TorchScript, ONNX and legacy
AOTInductor ``.so`` models, but only eager and TorchScript models run through its default
``inference``: its ``BaseHandler.initialize`` keeps an ONNX model as the bare
``onnxruntime.InferenceSession`` (``setup_ort_session``), which takes numpy arrays by input
name (``session.run(None, {...})``) and is not callable, so a handler whose ``inference``
calls ``self.model(*inputs)`` fails every request there. Here every loader
(:mod:`handlerkit.formats.load`) returns a callable that takes the model's inputs as positional
torch tensors and returns tensors on the handler's device (:class:`OnnxModel` for ONNX), so
the default ``inference``, and a handler's own that calls ``self.model(*inputs)``, serve every
format. :func:`export_model` (:mod:`handlerkit.formats.export`) writes each.

An exported model accepts only the input sizes it was exported for: a dimension left fixed
(``torch.export``'s guard, ONNX Runtime's "Got: 2 Expected: 7", AOTInductor's check when
``AOTI_RUNTIME_CHECK_INPUTS=1``) refuses any other size. The loaders turn that refusal into an
:class:`ArtifactShapeError` naming the file, the input and the dimension, with the command that
re-exports it with that dimension dynamic (:mod:`handlerkit.formats.shapes`).

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

from handlerkit.formats.export import export_model, input_names
from handlerkit.formats.load import FORMATS, STATE_DICT_FIX, LoadedModel, OnnxModel, detect_format, load_model
from handlerkit.formats.shapes import ArtifactShapeError, shape_refusal

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
