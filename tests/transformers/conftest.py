"""The spline tests run on each kernel of the fused spline node: the native C++ one and the PyTorch one."""

import shutil

import pytest

import flowkit._native as native


@pytest.fixture(params=["native", "pytorch"])
def spline_kernel(request, monkeypatch):
    """The fused node's kernel: `native` (built here wherever a C++ compiler is) or `pytorch`."""
    if request.param == "native":
        if shutil.which("c++") is None:
            pytest.skip("no C++ compiler: the native kernel cannot be built here")
        monkeypatch.setattr(native, "ENABLED", True)  # also where FLOWKIT_NATIVE=0 is set
        assert native.spline_ops() is not None, "a C++ compiler is here, but the native spline kernel did not build"
    else:
        monkeypatch.setattr(native, "ENABLED", False)
    return request.param
