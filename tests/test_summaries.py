"""hk.summary: one line per tensor (shape, dtype, device, n, bytes, statistics, NaN/Inf, zeros),
computed on the tensor's device with a few scalars fetched, for every kind of tensor. The
results' tables that print it are tested in test_results.py."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from handlerkit.summaries import summary, tensor_summary


def fields(line: str) -> dict[str, str]:
    return dict(re.findall(r"(\S+)=(\S+)", line))


def test_a_float_tensor_line_has_every_number():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    line = summary(x)
    assert line.startswith("Tensor[3, 4] float32 cpu n=12 (48 B) ")
    f = fields(line)
    assert (f["min"], f["max"]) == ("0", "11")
    assert float(f["mean"]) == pytest.approx(5.5)
    assert float(f["std"]) == pytest.approx(float(x.std()), rel=1e-3)
    assert "NaN" not in line and "zeros" not in line


def test_nan_and_inf_are_counted_and_left_out_of_the_statistics():
    x = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), -float("inf"), 3.0])
    f = fields(summary(x))
    assert (f["NaN"], f["+Inf"], f["-Inf"]) == ("1", "1", "2")
    assert (f["min"], f["max"], f["mean"]) == ("1", "3", "2")
    assert "no finite values NaN=2" in summary(torch.full((2,), float("nan")))


def test_all_zeros_and_single_values():
    assert summary(torch.zeros(2, 5)).endswith("all zeros")
    assert "std" not in summary(torch.ones(1))  # one value has no spread
    assert summary(torch.tensor(2.5)) == "Tensor[] float32 cpu n=1 (4 B) value=2.5"
    assert summary(torch.tensor(7)).endswith("value=7")


def test_integers_keep_exact_ranges_and_get_a_float_mean():
    f = fields(summary(torch.tensor([1, 2, 4], dtype=torch.int32)))
    assert (f["min"], f["max"]) == ("1", "4") and float(f["mean"]) == pytest.approx(7 / 3, rel=1e-3)
    extremes = summary(torch.tensor([-(2**63), 2**63 - 1]))
    assert f"min={-(2**63)} max={2**63 - 1}" in extremes  # beyond float64's 53 bits
    assert fields(summary(torch.tensor([3, 9], dtype=torch.uint8)))["max"] == "9"


def test_booleans_count_true_and_have_no_mean():
    line = summary(torch.tensor([True, False, False, True]))
    assert line == "Tensor[4] bool cpu n=4 (4 B) true=2 (50%)"
    assert summary(torch.zeros(3, dtype=torch.bool)).endswith("all False")


def test_empty_tensors():
    assert summary(torch.zeros(0, 3)) == "Tensor[0, 3] float32 cpu n=0 (0 B) empty"


def test_meta_and_fake_tensors_give_shape_dtype_and_device_only():
    assert summary(torch.empty(2, 3, device="meta")) == "Tensor[2, 3] float32 meta (meta tensor: no values)"
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.empty(4, 5)
        inside = summary(fake)  # while tracing, too
    assert inside == summary(fake) == "Tensor[4, 5] float32 cpu (fake tensor (compile tracing): no values)"


def test_summary_is_safe_inside_torch_compile():
    seen = []

    def f(x):
        seen.append(summary(x))
        return x * 2

    torch.compile(f, backend="eager")(torch.ones(3))
    assert seen and all(line.startswith("Tensor[3] float32") for line in seen)


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda: torch.tensor([3 + 4j, 0j]), r"complex64 .* \|x\| min=0 max=5 mean=2.5"),
        (lambda: torch.tensor([1.0, 3.0]).half(), r"float16 cpu n=2 \(4 B\) min=1 max=3 mean=2"),
        (lambda: torch.tensor([1.0, 3.0]).bfloat16(), r"bfloat16 .* min=1 max=3"),
        (lambda: torch.tensor([0.5, 2.0]).to(torch.float8_e4m3fn), r"float8_e4m3fn .* min=0.5 max=2"),
        (lambda: torch.eye(3).to_sparse(), r"sparse_coo nnz=3 stored: min=1 max=1"),
        (lambda: torch.tensor([1, 5], dtype=torch.uint16), r"uint16 .* min=1 max=5 mean=3"),
        (lambda: torch.ones(2, requires_grad=True), r"float32 cpu grad n=2"),
        (lambda: torch.nested.nested_tensor([torch.zeros(2), torch.ones(3)]), r"NestedTensor\[2 tensors\]"),
    ],
    ids=["complex", "half", "bfloat16", "float8", "sparse", "uint16", "grad", "nested"],
)
def test_other_kinds_degrade_gracefully(make, expected):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sparse/nested beta warnings
        assert re.search(expected, summary(make()))


def test_quantized_tensors_show_scale_and_dequantized_values():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # quantized creation is deprecated
        q = torch.quantize_per_tensor(torch.tensor([0.0, 1.0]), 0.5, 0, torch.quint8)
    f = fields(summary(q))
    assert (f["scale"], f["zero_point"], f["min"], f["max"]) == ("0.5", "0", "0", "1")


def test_a_tensor_whose_values_cannot_be_read_says_why():
    out = []
    torch.vmap(lambda row: (out.append(summary(row)), row)[1])(torch.ones(2, 3))
    assert out[0].startswith("Tensor[3] float32 cpu n=3 (12 B) (no statistics: ")


def test_nested_structures_get_one_line_per_tensor():
    value = [{"boxes": torch.zeros(2, 4), "scores": torch.tensor([0.5, 1.0])}, "text"]
    lines = summary(value).splitlines()
    assert lines[0] == "list[2] of dict(2 keys)"
    assert lines[1].startswith("  [0]['boxes']: Tensor[2, 4] float32 cpu") and lines[1].endswith("all zeros")
    assert lines[2].startswith("  [0]['scores']: Tensor[2] float32 cpu")
    assert summary(["a", 1]) == "list[2] of str" and summary(None) == "None"
    many = summary([torch.ones(1)] * 40, limit=5).splitlines()
    assert len(many) == 7 and "more tensors than the 5 shown" in many[-1]


class _OnAnotherDevice(torch.Tensor):
    """A tensor that says it lives on cuda:0 but computes on the CPU, recording every copy its
    data makes to the host: a device the test machine need not have."""

    copies: list[int] = []

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        out = torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=torch.device("cuda", 0))
        out.inner = inner
        return out

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        unwrap = lambda v: v.inner if isinstance(v, cls) else v  # noqa: E731
        args_in = torch.utils._pytree.tree_map(unwrap, args)
        kwargs_in = torch.utils._pytree.tree_map(unwrap, kwargs)
        to_host = func is torch.ops.aten._to_copy.default and kwargs.get("device") == torch.device("cpu")
        if to_host or func is torch.ops.aten._local_scalar_dense.default:
            cls.copies.append(args_in[0].numel())
            return func(*args_in, **kwargs_in)
        out = func(*args_in, **kwargs_in)
        return torch.utils._pytree.tree_map(lambda v: cls(v) if isinstance(v, torch.Tensor) else v, out)


def test_statistics_run_on_the_device_and_fetch_only_scalars():
    _OnAnotherDevice.copies = []
    x = _OnAnotherDevice(torch.randn(100, 1000))
    line = tensor_summary(x)
    assert line.startswith("Tensor[100, 1000] float32 cuda:0 n=100000") and "std=" in line
    assert _OnAnotherDevice.copies and max(_OnAnotherDevice.copies) <= 8, _OnAnotherDevice.copies
    assert len(_OnAnotherDevice.copies) == 1  # one transfer


def test_a_large_tensor_is_reduced_without_python_loops():
    x = torch.zeros(2000, 2000)
    x[0, 0] = float("nan")
    line = summary(x)
    assert "n=4000000 (15.3 MiB)" in line and "NaN=1" in line and "max=0" in line
