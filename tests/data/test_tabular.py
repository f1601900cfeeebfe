"""The MAF tabular loaders on small synthetic files of the real files' shapes.

The real data can't be downloaded here.
"""

from pathlib import Path

import numpy as np
import pytest
import torch

from flowkit.data import available_tabular, load, tabular


def _write_suite(root, rng):
    (root / "power").mkdir()
    np.save(root / "power" / "data.npy", rng.normal(size=(1000, 8)))
    (root / "miniboone").mkdir()
    np.save(root / "miniboone" / "data.npy", rng.normal(size=(600, 43)) * 3 + 1)
    (root / "gas").mkdir()
    sensors = rng.normal(size=(700, 8))
    copies = sensors + 0.01 * rng.normal(size=(700, 8))  # correlated above 0.98 with the first 8 sensors
    table = np.hstack([rng.normal(size=(700, 3)), sensors, copies])
    header = ["Time", "Meth", "Eth"] + [f"S{i}" for i in range(16)]
    rows = [",".join(header)] + [",".join(repr(float(v)) for v in row) for row in table]
    (root / "gas" / "ethylene_CO.csv").write_text("\n".join(rows) + "\n")
    (root / "hepmass").mkdir()
    for name, n, extra in (("1000_train.csv", 800, 0), ("1000_test.csv", 300, 1)):
        label = rng.integers(0, 2, size=(n, 1)).astype(float)
        continuous = rng.normal(size=(n, 21))
        discrete = rng.integers(0, 3, size=(n, 6)).astype(float)
        cols = np.hstack([label, continuous[:, :10], discrete, continuous[:, 10:], rng.normal(size=(n, extra))])
        head = ["# label"] + [f"f{i}" for i in range(cols.shape[1] - 1)]
        rows = [",".join(head)] + [",".join(repr(float(v)) for v in row) for row in cols]
        (root / "hepmass" / name).write_text("\n".join(rows) + "\n")
    (root / "BSDS300").mkdir()
    for split, n in (("train", 300), ("validation", 50), ("test", 60)):
        np.save(root / "BSDS300" / f"{split}.npy", rng.normal(size=(n, 63)))
    return table


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    root = tmp_path_factory.mktemp("maf")
    gas_table = _write_suite(root, np.random.default_rng(0))
    return root, gas_table


def test_every_benchmark_has_the_published_dimension(suite):
    root, _ = suite
    assert available_tabular(root) == ["power", "gas", "hepmass", "miniboone", "bsds300"]
    for name, features in (("power", 6), ("gas", 8), ("hepmass", 21), ("miniboone", 43), ("bsds300", 63)):
        s = tabular(name.upper(), root)
        assert s.features == features, name
        assert all(torch.isfinite(p).all() for p in (s.train, s.val, s.test))


def test_maf_splits_and_standardisation(suite, monkeypatch):
    root, gas_table = suite
    raw = np.load(root / "miniboone" / "data.npy")
    m = tabular("miniboone", root)
    assert (len(m.train), len(m.val), len(m.test)) == (486, 54, 60)  # last 10% test, last 10% of the rest val
    both = raw[:540]
    expected_test = (raw[540:] - both.mean(0)) / both.std(0)
    torch.testing.assert_close(m.test, torch.as_tensor(expected_test, dtype=torch.float32))
    p = tabular("power", root)
    assert (len(p.train), len(p.val), len(p.test)) == (810, 90, 100)
    together = torch.cat([p.train, p.val]).double()
    torch.testing.assert_close(together.mean(0), torch.zeros(6, dtype=torch.float64), atol=1e-6, rtol=0)
    # gas keeps one of each correlated pair (MAF drops the first of a pair), standardised with ddof=1
    g = tabular("gas", root)
    kept = gas_table[:, 11:]
    kept = (kept - kept.mean(0)) / kept.std(0, ddof=1)
    torch.testing.assert_close(g.test, torch.as_tensor(kept[-70:], dtype=torch.float32))
    # hepmass: only the signal class, standardised on train, discrete features dropped
    h = tabular("hepmass", root)
    train_csv = np.loadtxt(root / "hepmass" / "1000_train.csv", delimiter=",", skiprows=1)
    signal = train_csv[train_csv[:, 0] == 1][:, 1:]
    assert len(h.train) + len(h.val) == len(signal)
    continuous = np.hstack([signal[:, :10], signal[:, 16:]])
    expected = (continuous - continuous.mean(0)) / continuous.std(0, ddof=1)
    torch.testing.assert_close(h.train, torch.as_tensor(expected[: len(h.train)], dtype=torch.float32))
    monkeypatch.setenv("FLOWKIT_DATA", str(root))
    assert load("bsds300").test.shape == (60, 63)


def test_missing_and_malformed_tabular_files(tmp_path):
    assert available_tabular(tmp_path) == []
    with pytest.raises(FileNotFoundError, match="power: missing .*power/data.npy"):
        tabular("power", tmp_path)
    with pytest.raises(FileNotFoundError, match="gas: missing"):
        tabular("gas", tmp_path)
    with pytest.raises(ValueError, match="unknown tabular dataset"):
        tabular("cifar", tmp_path)
    (tmp_path / "miniboone").mkdir()
    np.save(tmp_path / "miniboone" / "data.npy", np.zeros((100, 40)))
    with pytest.raises(ValueError, match="has 40 columns, expected 43"):
        tabular("miniboone", tmp_path)
    (tmp_path / "gas").mkdir()
    (tmp_path / "gas" / "ethylene_CO.csv").write_text("A,B\n1,2\n3,4\n")
    with pytest.raises(ValueError, match="lacks the column"):
        tabular("gas", tmp_path)


class _Payload:
    """Unpickling this writes a marker file: proof that a loader unpickled."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_the_gas_pickle_is_never_unpickled(tmp_path, monkeypatch):
    import pickle
    import sys
    import types

    # pandas is no flowkit dependency: a stand-in whose read_pickle unpickles, as pandas' does.
    fake_pandas = types.SimpleNamespace(read_pickle=lambda path: pickle.loads(Path(path).read_bytes()))
    monkeypatch.setitem(sys.modules, "pandas", fake_pandas)
    marker = tmp_path / "unpickled"
    (tmp_path / "gas").mkdir()
    (tmp_path / "gas" / "ethylene_CO.pickle").write_bytes(pickle.dumps(_Payload(marker)))
    monkeypatch.setenv("FLOWKIT_DATA", str(tmp_path))
    assert available_tabular() == ["gas"]  # present, so that the error below tells what to do
    for read in (lambda: tabular("gas"), lambda: load("gas")):
        with pytest.raises(ValueError, match=r"refusing to unpickle .*ethylene_CO.pickle.*to_csv\('gas/ethylene_CO"):
            read()
    assert not marker.exists()
