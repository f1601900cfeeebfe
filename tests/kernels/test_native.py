"""The spline kernels' rule and the native loader (`flowkit.kernels`): each kernel where it applies."""

import shutil

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import flowkit.kernels.native as native
from flowkit.kernels import spline_kernel, use_spline_kernel
from flowkit.transformers import CircularSpline, RationalQuadraticSpline

needs_compiler = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to build the kernel")


@pytest.fixture(autouse=True)
def enabled():
    """The native kernel chosen, also where FLOWKIT_NATIVE=0 is set (tests that need it off say so)."""
    with use_spline_kernel("native"):
        yield


class _Calls(TorchDispatchMode):
    """Records the name of every operator dispatched under it."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def _calls(fn):
    with _Calls() as mode:
        fn()
    return mode.names


@needs_compiler
@pytest.mark.parametrize("spline", [RationalQuadraticSpline(8, 3.0), CircularSpline(5)], ids=["linear", "circular"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_eager_splines_on_the_cpu_run_the_native_kernel(spline, dtype):
    x = torch.rand(64, 3, dtype=dtype, requires_grad=True)
    params = torch.randn(64, 3, spline.params_per_element, dtype=dtype, requires_grad=True)
    names = _calls(lambda: sum(t.sum() for t in spline(x, params)).backward())
    assert "flowkit_native.rqs_forward.default" in names
    assert "flowkit_native.rqs_backward.default" in names
    with torch.no_grad():
        assert "flowkit_native.rqs_forward.default" in _calls(lambda: spline.inverse(x, params))


def test_half_precision_many_bins_and_switched_off_kernels_take_the_pytorch_path():
    spline = RationalQuadraticSpline(4, 2.0)
    x, params = torch.rand(10, dtype=torch.bfloat16), torch.randn(10, 11, dtype=torch.bfloat16)
    assert not any("flowkit_native" in name for name in _calls(lambda: spline(x, params)))
    many = RationalQuadraticSpline(129, 2.0)  # more bins than the kernel's stack tables hold
    assert not any(
        "flowkit_native" in name for name in _calls(lambda: many(x.float(), torch.randn(10, many.params_per_element)))
    )
    with use_spline_kernel("pytorch"):
        assert spline_kernel(x.float(), params.float(), 4) == "pytorch"
        assert not any("flowkit_native" in name for name in _calls(lambda: spline(x.float(), params.float())))


def test_a_kernel_that_cannot_be_built_warns_once_and_the_pytorch_path_gives_the_same_numbers(monkeypatch):
    spline = RationalQuadraticSpline(6, 2.0).double()
    g = torch.Generator().manual_seed(0)
    x = 3 * torch.rand(50, generator=g, dtype=torch.float64) - 1.5
    params = torch.randn(50, spline.params_per_element, generator=g, dtype=torch.float64)
    expected = spline(x, params)

    def no_compiler():
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(native, "_build", no_compiler)
    monkeypatch.setattr(native, "_TRIED", False)
    monkeypatch.setattr(native, "_OPS", None)
    with pytest.warns(RuntimeWarning, match="could not be built .*Ninja is required"):
        got = spline(x, params)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert native.spline_ops() is None  # tried once: no second attempt, no second warning


@needs_compiler
def test_the_kernel_names_bad_arguments():
    ops = native.spline_ops()
    v, params = torch.rand(5), torch.randn(5, 23)
    with pytest.raises(RuntimeError, match="bins must lie in"):
        ops.rqs_forward(v, params, 0, -3.0, 3.0, 1e-3, 1e-3, 1e-3, False, False, False)
    with pytest.raises(RuntimeError, match="params has 23 columns, needs 29"):
        ops.rqs_forward(v, params, 10, -3.0, 3.0, 1e-3, 1e-3, 1e-3, False, False, False)
    with pytest.raises(RuntimeError, match="differ in dtype"):
        ops.rqs_forward(v.double(), params, 8, -3.0, 3.0, 1e-3, 1e-3, 1e-3, False, False, False)
    with pytest.raises(RuntimeError, match="expected v"):
        ops.rqs_forward(v[:4], params, 8, -3.0, 3.0, 1e-3, 1e-3, 1e-3, False, False, False)
    forward = ops.rqs_forward(v, params, 7, -3.0, 3.0, 1e-3, 1e-3, 1e-3, False, False, False)
    with pytest.raises(RuntimeError, match="g_out and g_ladj must be CPU tensors of n elements"):
        ops.rqs_backward(v, params, forward[3], v[:3], v, 7, -3.0, 3.0, 1e-3, 1e-3, 1e-3, False, False, True)
    with pytest.raises(RuntimeError, match="exps must be rqs_forward's"):
        ops.rqs_backward(v, params, forward[3][:, :4], v, v, 7, -3.0, 3.0, 1e-3, 1e-3, 1e-3, False, False, True)


@needs_compiler
def test_the_rule_names_the_kernel_each_call_takes():
    x, params = torch.rand(4, dtype=torch.float64), torch.randn(4, 11, dtype=torch.float64)
    assert spline_kernel(x, params, 4) == "native"
    assert spline_kernel(x.float(), params, 4) == "reference"  # mixed dtypes: promoted by the reference
    assert spline_kernel(x.to(torch.bfloat16), params.to(torch.bfloat16), 4) == "pytorch"
    with use_spline_kernel("reference"):
        assert spline_kernel(x, params, 4) == "reference"
    with use_spline_kernel("pytorch"):
        assert spline_kernel(x, params, 4) == "pytorch"
    assert spline_kernel(x, params, 4) == "native"  # the choice ends with its block
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        assert spline_kernel(fwAD.make_dual(x, torch.ones_like(x)), params, 4) == "reference"
        assert spline_kernel(x, params, 4) == "native"  # no dual input: no tangent to carry
    # torch.func transforms need no rule of their own: the node's vmap and jvp rules and the native op's
    # batching rule carry them (tests/kernels/test_fused.py::test_nested_torch_func_transforms...).
    seen = []
    torch.func.vmap(lambda row: seen.append(spline_kernel(row, params[0], 4)) or row)(x[:, None])
    assert seen == ["native"]


def test_an_unknown_kernel_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown kernel 'fast'"), use_spline_kernel("fast"):
        pass


def test_a_first_build_says_what_it_is_doing_and_how_long_it_took(monkeypatch, capsys, caplog):
    """Issue 38: the first fit stalled silently for about 15 s while the kernel compiled."""
    from torch.utils import cpp_extension

    calls = []
    monkeypatch.setattr(native, "_built", lambda name: False)  # as on a fresh clone
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: calls.append(kw["name"]))
    native._compile("flowkit_native_test")
    assert calls == ["flowkit_native_test"]
    err = capsys.readouterr().err  # no logging configured: the terminal is told
    assert "compiling the native spline kernel flowkit_native_test (first use, about 15 s; cached afterwards" in err
    assert "compiled the native spline kernel in" in err
    with caplog.at_level("INFO", logger="flowkit"):  # and the logs are, with the time it took
        native._compile("flowkit_native_test")
    assert [r.getMessage().split(" (")[0] for r in caplog.records][:1] == [
        "flowkit: compiling the native spline kernel flowkit_native_test"
    ]
    assert caplog.records[-1].getMessage().startswith("flowkit: compiled the native spline kernel in ")
    monkeypatch.setattr(native, "_built", lambda name: True)  # cached: loading is quick and quiet
    native._compile("flowkit_native_test")
    assert capsys.readouterr().err == ""
