"""The MAF tabular benchmarks (POWER, GAS, HEPMASS, MINIBOONE, BSDS300), read from a local directory.

The preprocessed files of Papamakarios et al. (Zenodo record 1161203, `data.tar.gz`) cannot be downloaded by flowkit;
unpack them yourself and point `root` (or the `FLOWKIT_DATA` environment variable) at the folder that holds `power/`,
`gas/`, `hepmass/`, `miniboone/` and `BSDS300/`. The loaders reproduce MAF's preprocessing and splits, so that numbers
are comparable with the literature (MAF, NSF papers):

| name | files | D | preprocessing |
|---|---|---|---|
| `power` | `power/data.npy` (N x 8) | 6 | shuffle (seed 42), drop 2 columns, MAF's jitter, standardise |
| `gas` | `gas/ethylene_CO.csv` (header; see below) | 8 | drop Meth/Eth/Time, columns correlated > 0.98; standardise |
| `hepmass` | `hepmass/1000_train.csv`, `1000_test.csv` | 21 | signal only, standardise, drop discrete features |
| `miniboone` | `miniboone/data.npy` (N x 43) | 43 | standardise on train+val |
| `bsds300` | `BSDS300/BSDS300.hdf5` or `{train,validation,test}.npy` | 63 | none (already split) |

Test sets are the last 10% of rows and validation sets the last 10% of the rest, as in MAF. `BSDS300.hdf5` needs h5py
(not a flowkit dependency); the `.npy` alternative does not.

flowkit never unpickles: a pickle can run any code when it is read, so the archive's `gas/ethylene_CO.pickle` (a pickled
pandas DataFrame) is refused. Convert it once, from the data directory, with pandas, *if you trust the file*:

```bash
python -c "import pandas; pandas.read_pickle('gas/ethylene_CO.pickle').to_csv('gas/ethylene_CO.csv', index=False)"
```

References:
    Papamakarios, Pavlakou & Murray, *Masked Autoregressive Flow for Density
    Estimation*, NeurIPS 2017 (arXiv:1705.07057).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .files import read_array
from .splits import Splits, _tensor

__all__ = ["TABULAR_DATASETS", "tabular", "available_tabular", "data_root"]


def data_root(root: str | os.PathLike | None = None) -> Path:
    """The tabular data directory: `root`, else `$FLOWKIT_DATA`, else `./data`."""
    if root is not None:
        return Path(root)
    return Path(os.environ.get("FLOWKIT_DATA", "data"))


def _tail_splits(data: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MAF's split: the last 10% of rows for test, the last 10% of the rest for validation."""
    n_test = int(0.1 * len(data))
    rest, test = data[: len(data) - n_test], data[len(data) - n_test :]
    n_val = int(0.1 * len(rest))
    return rest[: len(rest) - n_val], rest[len(rest) - n_val :], test


def _standardise_on_train_val(
    train: np.ndarray, val: np.ndarray, test: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    both = np.vstack([train, val])
    mu, s = both.mean(0), both.std(0)
    return (train - mu) / s, (val - mu) / s, (test - mu) / s


def _need(path: Path, name: str) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"{name}: missing {path} (unpack the MAF data archive under the data directory)")
    return path


def _npy(path: Path, name: str, columns: int) -> np.ndarray:
    data = read_array(_need(path, name))
    if data.shape[1] != columns:
        raise ValueError(f"{name}: {path} has {data.shape[1]} columns, expected {columns}")
    return data


_Arrays = tuple[np.ndarray, np.ndarray, np.ndarray]  # train, validation, test


def _power(root: Path) -> _Arrays:
    data = _npy(root / "power" / "data.npy", "power", 8)
    rng = np.random.RandomState(42)
    rng.shuffle(data)
    n = len(data)
    data = np.delete(data, [1, 3], axis=1)  # global reactive power and global intensity
    voltage_noise = 0.01 * rng.rand(n, 1)
    gap_noise = 0.001 * rng.rand(n, 1)
    sub_metering_noise = rng.rand(n, 3)
    time_noise = np.zeros((n, 1))
    data = data + np.hstack([gap_noise, voltage_noise, sub_metering_noise, time_noise])
    return _standardise_on_train_val(*_tail_splits(data))


#: The one-line conversion of MAF's pickled GAS table into the CSV file flowkit reads (run from the data directory).
_GAS_CONVERSION = (
    "python -c \"import pandas; pandas.read_pickle('gas/ethylene_CO.pickle')"
    ".to_csv('gas/ethylene_CO.csv', index=False)\""
)


def _read_gas_table(root: Path) -> tuple[list[str], np.ndarray]:
    """The GAS table's header and values, from `gas/ethylene_CO.csv`; the pickled original is never read."""
    pickle_path, csv_path = root / "gas" / "ethylene_CO.pickle", root / "gas" / "ethylene_CO.csv"
    if csv_path.exists():
        with open(csv_path) as handle:
            header = [h.strip() for h in handle.readline().replace(";", ",").split(",")]
        return header, read_array(csv_path)
    if pickle_path.exists():
        raise ValueError(
            f"gas: refusing to unpickle {pickle_path} (a pickle can run code when read); if you trust it, convert it "
            f"once to {csv_path.name} with pandas, in {root}: {_GAS_CONVERSION}"
        )
    raise FileNotFoundError(f"gas: missing {csv_path} (convert MAF's {pickle_path.name} to it: {_GAS_CONVERSION})")


def _gas(root: Path) -> _Arrays:
    columns, data = _read_gas_table(root)
    if len(columns) != data.shape[1]:
        raise ValueError(f"gas: the header names {len(columns)} columns but the table has {data.shape[1]}")
    missing = {"Meth", "Eth", "Time"} - set(columns)
    if missing:
        raise ValueError(f"gas: the table lacks the column(s) {sorted(missing)}")
    keep = [i for i, c in enumerate(columns) if c not in ("Meth", "Eth", "Time")]
    data = data[:, keep]
    while True:  # drop, one at a time, the first column correlated above 0.98 with another
        correlated = (np.corrcoef(data, rowvar=False) > 0.98).sum(axis=1)
        if not (correlated > 1).any():
            break
        data = np.delete(data, int(np.flatnonzero(correlated > 1)[0]), axis=1)
    data = (data - data.mean(0)) / data.std(0, ddof=1)
    return _tail_splits(data)


def _hepmass_csv(path: Path, name: str) -> np.ndarray:
    table = read_array(_need(path, name))
    return table[table[:, 0] == 1][:, 1:]  # the positive (signal) class, without its label


def _hepmass(root: Path) -> _Arrays:
    train = _hepmass_csv(root / "hepmass" / "1000_train.csv", "hepmass")
    test = _hepmass_csv(root / "hepmass" / "1000_test.csv", "hepmass")[:, :-1]  # the test file has one extra column
    if train.shape[1] != test.shape[1]:
        raise ValueError(f"hepmass: train has {train.shape[1]} features but test has {test.shape[1]} (after MAF's fix)")
    mu, s = train.mean(0), train.std(0, ddof=1)
    train, test = (train - mu) / s, (test - mu) / s
    # MAF drops features whose smallest value occurs more than 5 times (discrete features).
    keep = [j for j in range(train.shape[1]) if Counter(train[:, j])[train[:, j].min()] <= 5]
    train, test = train[:, keep], test[:, keep]
    n_val = int(0.1 * len(train))
    return train[: len(train) - n_val], train[len(train) - n_val :], test


def _miniboone(root: Path) -> _Arrays:
    data = _npy(root / "miniboone" / "data.npy", "miniboone", 43)
    return _standardise_on_train_val(*_tail_splits(data))


def _bsds300(root: Path) -> _Arrays:
    folder = root / "BSDS300"
    npy = [folder / f"{s}.npy" for s in ("train", "validation", "test")]
    if all(p.exists() for p in npy):
        return tuple(_npy(p, "bsds300", 63) for p in npy)
    hdf5 = folder / "BSDS300.hdf5"
    _need(hdf5, "bsds300")
    try:
        import h5py
    except ImportError:
        raise ValueError(
            f"bsds300: reading {hdf5} needs h5py; install it or save its train/validation/test arrays as .npy files"
        ) from None
    with h5py.File(hdf5, "r") as f:
        return tuple(np.asarray(f[s], dtype=np.float64) for s in ("train", "validation", "test"))


#: The tabular benchmarks: name -> (loader, number of features).
TABULAR_DATASETS: dict[str, tuple[Callable[[Path], tuple], int]] = {
    "power": (_power, 6),
    "gas": (_gas, 8),
    "hepmass": (_hepmass, 21),
    "miniboone": (_miniboone, 43),
    "bsds300": (_bsds300, 63),
}

_MARKERS = {
    "power": ["power/data.npy"],
    "gas": ["gas/ethylene_CO.pickle", "gas/ethylene_CO.csv"],
    "hepmass": ["hepmass/1000_train.csv"],
    "miniboone": ["miniboone/data.npy"],
    "bsds300": ["BSDS300/BSDS300.hdf5", "BSDS300/train.npy"],
}


def available_tabular(root: str | os.PathLike | None = None) -> list[str]:
    """Names of the tabular benchmarks whose files are present under the data directory."""
    base = data_root(root)
    return [name for name, files in _MARKERS.items() if any((base / f).exists() for f in files)]


def tabular(name: str, root: str | os.PathLike | None = None) -> Splits:
    """Load a MAF tabular benchmark with MAF's preprocessing and train/val/test split.

    Arguments:
        name: `power`, `gas`, `hepmass`, `miniboone` or `bsds300` (case-insensitive).
        root: the data directory (default `$FLOWKIT_DATA` or `./data`).

    Raises:
        FileNotFoundError: the dataset's files are not under `root`.
        ValueError: the files do not have the expected shape.
    """
    key = name.lower()
    if key not in TABULAR_DATASETS:
        raise ValueError(f"unknown tabular dataset {name!r}; choose one of {', '.join(TABULAR_DATASETS)}")
    loader, features = TABULAR_DATASETS[key]
    base = data_root(root)
    train, val, test = loader(base)
    for part in (train, val, test):
        if part.shape[1] != features:
            raise ValueError(f"{key}: preprocessing gave {part.shape[1]} features, expected {features}")
        if len(part) == 0:
            raise ValueError(f"{key}: too few rows for MAF's split")
    return Splits(key, _tensor(train), _tensor(val), _tensor(test), info={"source": str(base)})
