"""The pt2 section: handlerkit compiles exactly when, and how, TorchServe 0.12 does; failures are loud.

Backends ``eager`` and ``aot_eager`` compile a tiny model in about a second; torch's default
(inductor) is only checked to be applied (compilation is lazy), except under ``slow``.
"""

from __future__ import annotations

import copy
import re
import warnings
from typing import Any

import pytest
import torch
from torch._dynamo.eval_frame import OptimizedModule

import handlerkit as hk
from conftest import eager_manifest, ts_imports
from handlerkit.errors import HandlerkitWarning
from handlerkit.handlers.base import BaseHandler


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def compile_calls(monkeypatch) -> list[dict[str, Any]]:
    """The keyword arguments of every torch.compile call (TorchServe's and handlerkit's)."""
    calls: list[dict[str, Any]] = []
    real = torch.compile

    def recording(model: Any = None, **kwargs: Any) -> Any:
        calls.append(copy.deepcopy(kwargs))
        return real(model, **kwargs)

    monkeypatch.setattr(torch, "compile", recording)
    return calls


# name -> (pt2 section, compiled?, torch.compile kwargs, runs quickly)
VARIANTS: dict[str, tuple[Any, bool, dict | None, bool]] = {
    "legacy string": ("eager", True, {"backend": "eager"}, True),
    "legacy string inductor": ("inductor", True, {"backend": "inductor"}, False),
    "legacy dict": ({"backend": "aot_eager"}, True, {"backend": "aot_eager"}, True),
    "compile eager": ({"compile": {"enable": True, "backend": "eager"}}, True, {"backend": "eager"}, True),
    "compile aot_eager fullgraph": (
        {"compile": {"enable": True, "backend": "aot_eager", "fullgraph": True}},
        True,
        {"backend": "aot_eager", "fullgraph": True},
        True,
    ),
    "compile disabled": ({"compile": {"enable": False, "backend": "eager"}}, False, None, True),
    "compile default backend": ({"compile": {"enable": True}}, True, {}, False),
    "export only": ({"export": {"aot_compile": False}}, False, None, True),
}


def _ctx(model_dir, pt2: Any) -> hk.MockContext:
    # A deep copy per handler: TorchServe deletes compile_options["enable"] from the config.
    return hk.MockContext(
        model_dir=model_dir, gpu_id=None, manifest=eager_manifest(), model_yaml_config={"pt2": copy.deepcopy(pt2)}
    )


@pytest.mark.torchserve
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_compiles_like_torchserve(variant, mlp_dir, mlp_reference, compile_calls):
    from ts.torch_handler.base_handler import BaseHandler as TsBaseHandler

    pt2, compiled, options, runs = VARIANTS[variant]
    ts_ctx = _ctx(mlp_dir, pt2)
    ts_handler = TsBaseHandler()
    with ts_imports(mlp_dir):
        ts_handler.initialize(ts_ctx)
    ts_calls = list(compile_calls)
    compile_calls.clear()

    ctx = _ctx(mlp_dir, pt2)
    handler = BaseHandler()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HandlerkitWarning)  # the legacy-schema notes
        handler.initialize(ctx)

    # Both agree on whether the model is compiled, and with which arguments.
    assert isinstance(ts_handler.model, OptimizedModule) is compiled
    assert isinstance(handler.model, OptimizedModule) is compiled
    assert compile_calls == ts_calls == ([options] if compiled else [])
    decision = handler.decisions.compile
    assert (decision.requested, decision.applied) == (compiled, compiled)
    if compiled:
        assert decision.options == options
    # TorchServe's initialize deletes pt2.compile.enable when true; handlerkit's does the same.
    assert ctx.model_yaml_config == ts_ctx.model_yaml_config

    if runs:
        x = torch.randn(3, 4)
        expected = mlp_reference[0](x)
        out = handler.handle(x.tolist(), ctx)
        torch.testing.assert_close(torch.tensor(out), expected, rtol=0, atol=1e-5)
        hk.Batch.coerce(x.tolist()).bind(ts_ctx)  # as the worker does before handle
        torch.testing.assert_close(torch.tensor(ts_handler.handle(x.tolist(), ts_ctx)), expected, rtol=0, atol=1e-5)


@pytest.mark.torchserve
def test_unknown_backend_is_a_warning_and_the_model_runs_eagerly(mlp_dir, mlp_reference, compile_calls):
    from ts.torch_handler.base_handler import BaseHandler as TsBaseHandler

    pt2 = {"compile": {"enable": True, "backend": "no_such_backend"}}
    ts_handler = TsBaseHandler()
    with ts_imports(mlp_dir):
        ts_handler.initialize(_ctx(mlp_dir, pt2))
    assert not isinstance(ts_handler.model, OptimizedModule)  # TorchServe: a log line, no compile

    ctx = _ctx(mlp_dir, pt2)
    handler = BaseHandler()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        handler.initialize(ctx)
    messages = [str(w.message) for w in caught if issubclass(w.category, HandlerkitWarning)]
    assert any(re.search(r"backend 'no_such_backend'.*runs without compilation", m) for m in messages), messages
    assert compile_calls == []
    decision = handler.decisions.compile
    assert decision.requested is True and decision.applied is False
    assert "no_such_backend" in decision.error
    assert not isinstance(handler.model, OptimizedModule)
    x = torch.randn(2, 4)
    torch.testing.assert_close(torch.tensor(handler.handle(x.tolist(), ctx)), mlp_reference[0](x), rtol=0, atol=1e-6)


def test_backend_failing_at_compile_time_falls_back_to_eager(mlp_dir, mlp_reference):
    backend = "relu_compile_error_TESTING_ONLY"
    assert backend in torch._dynamo.list_backends(exclude_tags=())
    ctx = _ctx(mlp_dir, {"compile": {"enable": True, "backend": backend}})
    handler = BaseHandler()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HandlerkitWarning)  # "TorchServe would not compile" note
        handler.initialize(ctx)
    assert handler.decisions.compile.applied is True  # compilation is lazy: nothing failed yet
    assert isinstance(handler.model, OptimizedModule)

    x = torch.randn(3, 4)
    with pytest.warns(HandlerkitWarning, match=r"torch\.compile failed.*falling back to the eager model"):
        out = handler.handle(x.tolist(), ctx)
    torch.testing.assert_close(torch.tensor(out), mlp_reference[0](x), rtol=0, atol=1e-6)
    decision = handler.decisions.compile
    assert decision.fell_back_at_runtime is True and decision.applied is False
    assert "BackendCompilerFailed" in decision.error
    assert not isinstance(handler.model, OptimizedModule)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HandlerkitWarning)  # the fallback is reported once
        assert handler.handle(x.tolist(), ctx) == out


def test_compile_decision_without_pt2(mlp_dir):
    handler = BaseHandler()
    handler.initialize(hk.MockContext(model_dir=mlp_dir, gpu_id=None, manifest=eager_manifest()))
    decision = handler.decisions.compile
    assert (decision.requested, decision.applied, decision.schema) == (False, False, "none")
    assert not isinstance(handler.model, OptimizedModule)


@pytest.mark.slow
def test_inductor_compiles_and_matches_eager(mlp_dir, mlp_reference):
    ctx = _ctx(mlp_dir, {"compile": {"enable": True, "backend": "inductor"}})
    handler = BaseHandler()
    handler.initialize(ctx)
    assert isinstance(handler.model, OptimizedModule)
    for batch_size in (1, 3):
        x = torch.randn(batch_size, 4)
        out = handler.handle(x.tolist(), ctx)
        torch.testing.assert_close(torch.tensor(out), mlp_reference[0](x), rtol=0, atol=1e-5)
    assert handler.decisions.compile.fell_back_at_runtime is False
