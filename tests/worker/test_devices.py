"""handlerkit.worker.devices: device choice with faked accelerators (handlerkit's seams, and TorchServe's
own rule side by side), and device kinds.

No GPU is needed. ``choose_device`` is tested through the availability seams of
``handlerkit.worker.devices``. To compare with TorchServe, accelerators are faked at the
torch level (``torch.cuda.is_available`` ...) for both handlers, on TorchServe's argmax model,
which has no parameters: loading it "onto" a device that is not there moves no tensor, so both
``initialize`` calls run to the end and their decisions can be compared.
"""

from __future__ import annotations

import types

import pytest
import torch

import handlerkit as hk
from conftest import ts_imports
from handlerkit.handlers.base import BaseHandler
from handlerkit.worker import devices as device_mod
from handlerkit.worker.devices import choose_device, device_kind

KINDS = ("cuda", "xpu", "mps", "xla")


@pytest.fixture
def fake(monkeypatch):
    """fake("cuda", "mps") makes those accelerators available (and no others)."""

    def apply(*available: str, xla_device: object = None) -> None:
        for kind in KINDS:
            monkeypatch.setattr(device_mod, f"{kind}_available", lambda on=(kind in available): on)
        monkeypatch.setattr(device_mod, "xla_device", lambda: xla_device)

    return apply


# ---------------------------------------------------------------------------------------------
# choose_device
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("available", "gpu_id", "device", "kind", "reason"),
    [
        ((), "0", "cpu", "cpu", "no accelerator is available"),
        ((), None, "cpu", "cpu", "no accelerator is available"),
        (("cuda",), "0", "cuda:0", "cuda", "CUDA is available and gpu_id='0'"),
        (("cuda",), 1, "cuda:1", "cuda", "CUDA is available and gpu_id=1"),
        (("cuda",), None, "cpu", "cpu", "no gpu_id was given, so cuda is left unused"),
        (("xpu",), "0", "xpu:0", "xpu", "XPU is available"),
        (("xpu",), None, "cpu", "cpu", "no gpu_id was given, so xpu is left unused"),
        (("mps",), "0", "mps", "mps", "MPS is available"),
        (("mps",), None, "cpu", "cpu", "no gpu_id was given, so mps is left unused"),
        (("cuda", "xpu", "mps"), "0", "cuda:0", "cuda", "CUDA"),
        (("xpu", "mps"), "0", "xpu:0", "xpu", "XPU"),
        (("cuda", "mps"), None, "cpu", "cpu", "cuda, mps is left unused"),
    ],
)
def test_choose_device(fake, available, gpu_id, device, kind, reason):
    fake(*available)
    choice = choose_device(gpu_id)
    assert str(choice.device) == device
    assert choice.kind == kind
    assert reason in choice.reason
    assert choice.available == {k: k in available for k in KINDS}


@pytest.mark.parametrize("gpu_id", ["0", None])
def test_xla_is_used_even_without_gpu_id(fake, gpu_id):
    sentinel = object()
    fake("xla", xla_device=sentinel)
    choice = choose_device(gpu_id)
    assert choice.device is sentinel and choice.kind == "xla" and "torch_xla" in choice.reason


def test_cuda_with_gpu_id_wins_over_xla(fake):
    fake("cuda", "xla", xla_device=object())
    assert str(choose_device("0").device) == "cuda:0"


@pytest.mark.parametrize(
    ("device", "kind"),
    [(None, "cpu"), ("cpu", "cpu"), ("cuda", "cuda"), ("cuda:1", "cuda"), ("MPS", "mps"), ("xpu:0", "xpu")],
)
def test_device_kind_from_strings(device: object, kind: str) -> None:
    assert device_kind(device) == kind


def test_device_kind_from_torch_device() -> None:
    assert device_kind(torch.device("cuda", 0)) == "cuda"
    assert device_kind(torch.device("cpu")) == "cpu"


def test_real_availability_on_this_machine():
    # The seams report plain booleans; this CI machine has no accelerator.
    avail = device_mod.availability()
    assert set(avail) == set(KINDS) and all(isinstance(v, bool) for v in avail.values())


# ---------------------------------------------------------------------------------------------
# BaseHandler.initialize: the decision is recorded and the model still loads on the CPU
# ---------------------------------------------------------------------------------------------


def _init(model_dir, gpu_id="0", **kwargs) -> tuple[BaseHandler, hk.MockContext]:
    ctx = hk.MockContext(model_dir=model_dir, gpu_id=gpu_id, **kwargs)
    handler = BaseHandler()
    handler.initialize(ctx)
    return handler, ctx


def test_initialize_on_cpu(argmax_dir, fake):
    fake()
    handler, ctx = _init(argmax_dir)
    d = handler.decisions
    assert (d.device, d.device_kind, handler.map_location) == ("cpu", "cpu", "cpu")
    assert d.device_reason == "no accelerator is available"
    assert handler.handle([[1.0, 2.0]], ctx) == [1]


@pytest.mark.parametrize("kind", ["cuda", "xpu", "mps"])
def test_initialize_without_gpu_id_keeps_the_accelerator_unused(mlp_dir, fake, kind):
    fake(kind)
    handler, ctx = _init(mlp_dir, gpu_id=None)
    d = handler.decisions
    assert (d.device, d.device_kind, handler.map_location) == ("cpu", "cpu", "cpu")
    assert f"no gpu_id was given, so {kind} is left unused" in d.device_reason
    assert d.available[kind] is True
    assert {p.device.type for p in handler.model.parameters()} == {"cpu"}
    assert len(handler.handle([[1.0, 2.0, 3.0, 4.0]], ctx)[0]) == 3


def test_initialize_on_xla_loads_with_map_location_none(mlp_dir, fake):
    # TorchServe leaves map_location None on XLA; the faked XLA device is the CPU here.
    fake("xla", xla_device=torch.device("cpu"))
    handler, ctx = _init(mlp_dir, gpu_id=None)
    assert handler.decisions.device_kind == "xla" and handler.map_location is None
    assert "torch_xla" in handler.decisions.device_reason
    assert len(handler.handle([[1.0, 2.0, 3.0, 4.0]], ctx)[0]) == 3


# ---------------------------------------------------------------------------------------------
# Side by side with TorchServe's BaseHandler, accelerators faked at the torch level
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def fake_torch(monkeypatch):
    """Make torch (and so both TorchServe and handlerkit) believe an accelerator exists."""

    def apply(kind: str) -> None:
        import ts.torch_handler.base_handler as ts_base

        if kind == "cuda":
            monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
            monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
        elif kind == "xpu":
            monkeypatch.setenv("TS_IPEX_GPU_ENABLE", "true")  # TorchServe needs it for XPU
            monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
        elif kind == "mps":
            monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
        elif kind == "xla":
            fake_xm = types.SimpleNamespace(xla_device=lambda: torch.device("cpu"))
            monkeypatch.setattr(ts_base, "XLA_AVAILABLE", True)
            monkeypatch.setattr(ts_base, "xm", fake_xm, raising=False)
            monkeypatch.setattr(device_mod, "xla_available", lambda: True)
            monkeypatch.setattr(device_mod, "xla_device", fake_xm.xla_device)

    return apply


@pytest.mark.torchserve
@pytest.mark.usefixtures("restore_fp32_precision")
@pytest.mark.parametrize(
    ("kind", "gpu_id", "device", "map_location", "chosen"),
    [
        ("cpu", "0", "cpu", "cpu", "cpu"),
        ("cuda", "0", "cuda:0", "cuda", "cuda"),
        ("cuda", None, "cpu", "cpu", "cpu"),
        ("xpu", "0", "xpu:0", "xpu", "xpu"),
        ("mps", "0", "mps", "mps", "mps"),
        ("mps", None, "cpu", "cpu", "cpu"),
        ("xla", "0", "cpu", None, "xla"),  # the faked XLA device is the CPU
    ],
)
def test_same_device_and_map_location_as_torchserve(argmax_dir, fake_torch, kind, gpu_id, device, map_location, chosen):
    from ts.torch_handler.base_handler import BaseHandler as TsBaseHandler

    if kind != "cpu":
        fake_torch(kind)
    ctx = hk.MockContext(model_dir=argmax_dir, gpu_id=gpu_id)
    ts_handler = TsBaseHandler()
    with ts_imports(argmax_dir):
        ts_handler.initialize(ctx)
    handler = BaseHandler()
    handler.initialize(ctx)

    assert (str(ts_handler.device), ts_handler.map_location) == (device, map_location)
    assert (str(handler.device), handler.map_location) == (device, map_location)
    assert (handler.decisions.device, handler.decisions.device_kind) == (device, chosen)


@pytest.mark.torchserve
@pytest.mark.usefixtures("restore_fp32_precision")
@pytest.mark.parametrize(("setting", "precision"), [("auto", "tf32"), (True, "tf32"), (False, "ieee")])
def test_tf32_is_set_in_initialize_on_ampere(argmax_dir, fake_torch, setting, precision):
    fake_torch("cuda")  # capability (8, 0): Ampere
    ctx = hk.MockContext(model_dir=argmax_dir, gpu_id="0", model_yaml_config={"handler": {"tf32": setting}})
    handler = BaseHandler()
    handler.initialize(ctx)
    tf32 = handler.decisions.tf32
    assert tf32["setting"] == setting and tf32["applied"] is True and tf32["capability"] == (8, 0)
    assert tf32["matmul"] == precision == torch.backends.cuda.matmul.fp32_precision
    assert torch.backends.cudnn.conv.fp32_precision == precision


def test_cpu_threads_say_when_timings_will_suffer():
    from handlerkit.worker.devices import CpuThreads, cpu_threads

    here = cpu_threads()
    assert here.intra_op >= 1 and here.cores >= 1 and str(here).startswith(f"{here.intra_op} intra-op")
    assert CpuThreads(2, 2, 2, 0.5).warning is None  # a quiet machine
    assert CpuThreads(1, 1, 2, 9.0).warning is None  # one thread has no one to wait for
    busy = CpuThreads(2, 2, 2, 3.2).warning
    assert busy is not None and "1-minute load is 3.2" in busy and "torch.set_num_threads(1)" in busy
    over = CpuThreads(8, 2, 2, 0.1).warning
    assert over is not None and "8 intra-op threads on 2 usable core(s)" in over
    assert CpuThreads(2, 2, 2, None).warning is None and "load" not in str(CpuThreads(2, 2, 2, None))
