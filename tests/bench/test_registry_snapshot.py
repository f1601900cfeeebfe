"""bench/registry_snapshot.py: a snapshot equals itself, and a changed bit or a missing entry is reported."""

import importlib.util
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _module():
    spec = importlib.util.spec_from_file_location("bench_registry_snapshot", BENCH / "registry_snapshot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_snapshot_is_reproducible_and_catches_one_changed_bit():
    module = _module()
    first, second = module.snapshot(), module.snapshot()
    assert not any(key.endswith(".error") for key in first)
    assert module.compare(first, second) == []
    key = next(k for k, v in second.items() if isinstance(v, torch.Tensor) and v.numel())
    changed = second[key].clone()
    changed.view(-1)[0] = torch.nextafter(changed.view(-1)[0], torch.tensor(float("inf"), dtype=changed.dtype))
    second[key] = changed
    del second[next(k for k in second if k != key)]
    differ = module.compare(first, second)
    assert len(differ) == 2 and key in differ
