"""The spline numerics hold without the vector unit's fused multiply-adds, as on any CPU torch supports.

torch picks its CPU kernels by the vector unit it finds (AVX-512, AVX2, NEON, or plain scalar code), and
the vectorised ones fuse multiply-adds (`addcmul`, `addmm`) where the scalar ones round twice. A tolerance
that holds only with one of them is a property of a CPU, not of flowkit: this test reruns the spline and
saved-model tests in a fresh process on torch's scalar kernels (`ATEN_CPU_CAPABILITY=default`; on a CPU
where that capability is already the only one, it reruns them as they are).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent


@pytest.mark.slow
def test_spline_and_saved_model_tests_pass_on_scalar_kernels():
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"}
    paths = [TESTS / "transformers" / "test_spline.py", TESTS / "kernels" / "test_fused.py"]
    paths.append(TESTS / "test_saved_models.py")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *map(str, paths)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
