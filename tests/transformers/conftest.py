"""The spline tests run on each kernel of the fused spline node: the native C++ one and the PyTorch one."""

import shutil

import pytest

import flowkit.kernels.native as native
from flowkit.kernels import use_spline_kernel


@pytest.fixture(params=["native", "pytorch"])
def spline_kernel(request):
    """The fused node's kernel: `native` (built here wherever a C++ compiler is) or `pytorch`."""
    if request.param == "native":
        if shutil.which("c++") is None:
            pytest.skip("no C++ compiler: the native kernel cannot be built here")
        assert native.spline_ops() is not None, "a C++ compiler is here, but the native spline kernel did not build"
    with use_spline_kernel(request.param):  # `native` also where FLOWKIT_NATIVE=0 is set
        yield request.param
