import os

import pytest
import torch

# The suite runs with pytest-xdist (-n 2) on 2 cores: one thread per worker avoids
# oversubscription, which slows torch's CPU kernels down many times over.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
