import os
import sys
from pathlib import Path

import pytest
import torch

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
