import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

import flowkit.kernels.native as native
from flowkit.kernels import use_spline_kernel

# The cases table (tests/cases.py) is imported as `from cases import ...`: with
# --import-mode=importlib test modules do not see their siblings, so put tests/ on the path.
sys.path.insert(0, str(Path(__file__).parent))

# The suite runs with pytest-xdist (-n 2) on 2 cores: one thread per worker avoids
# oversubscription, which slows torch's CPU kernels down many times over.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(params=["native", "pytorch"])
def spline_kernel(request):
    """The fused node's kernel: `native` (built here wherever a C++ compiler is) or `pytorch`."""
    if request.param == "native":
        if shutil.which("c++") is None:
            pytest.skip("no C++ compiler: the native kernel cannot be built here")
        assert native.spline_ops() is not None, "a C++ compiler is here, but the native spline kernel did not build"
    with use_spline_kernel(request.param):  # `native` also where FLOWKIT_NATIVE=0 is set
        yield request.param
