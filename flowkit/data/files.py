"""Loading user data from CSV and NPY files, with one-line errors that name the problem."""

from __future__ import annotations

import csv
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from .splits import Splits, split_array

__all__ = ["read_array", "file_splits", "column_names", "FILE_SUFFIXES"]

#: File types `read_array` understands (`.tsv` is read as a tab-separated CSV).
FILE_SUFFIXES = (".csv", ".tsv", ".npy")


def _is_number(field: str) -> bool:
    try:
        float(field)
    except ValueError:
        return False
    return True


def _sniff(path: Path) -> tuple[Any, list[str], bool]:
    """The CSV dialect of the file, its first row, and whether that row is a header (not all numbers)."""
    try:
        with open(path, newline="") as handle:
            sample = handle.read(4096)
    except UnicodeDecodeError:
        raise ValueError(f"{path}: bad CSV: not a text file") from None
    if not sample.strip():
        raise ValueError(f"{path}: bad CSV: the file is empty")
    try:
        dialect = csv.Sniffer().sniff(sample, delimiters="\t" if path.suffix.lower() == ".tsv" else ",;\t ")
    except csv.Error:
        dialect = csv.excel_tab if path.suffix.lower() == ".tsv" else csv.excel
    first = next(csv.reader([sample.lstrip().splitlines()[0]], dialect))
    return dialect, first, not all(_is_number(f) for f in first)


def column_names(path: str | os.PathLike) -> list[str] | None:
    """The header of a CSV/TSV file (its column names), None when it has none or is not a CSV/TSV file."""
    path = Path(path)
    if path.suffix.lower() not in (".csv", ".tsv"):
        return None
    _, first, has_header = _sniff(path)
    return [name.strip() for name in first] if has_header else None


def _read_csv(path: Path) -> np.ndarray:
    dialect, first, has_header = _sniff(path)
    try:  # fast path for well-formed files; the slow pass below names the problem otherwise
        delimiter = None if dialect.delimiter == " " else dialect.delimiter
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            array = np.loadtxt(path, delimiter=delimiter, skiprows=int(has_header), ndmin=2, dtype=np.float64)
        if array.size:
            return array
    except ValueError:
        pass
    try:
        with open(path, newline="") as handle:
            rows = [row for row in csv.reader(handle, dialect) if any(f.strip() for f in row)]
    except UnicodeDecodeError:
        raise ValueError(f"{path}: bad CSV: not a text file") from None
    except csv.Error as error:
        raise ValueError(f"{path}: bad CSV: {error}") from None
    header: list[str] | None = None
    if has_header:
        header, rows = rows[0], rows[1:]
    if not rows:
        raise ValueError(f"{path}: bad CSV: no data rows")
    width = len(header) if header is not None else len(rows[0])
    first_line = 2 if header is not None else 1
    for i, row in enumerate(rows):
        if len(row) != width:
            raise ValueError(f"{path}: bad CSV: line {i + first_line} has {len(row)} fields, expected {width}")
    for j in range(width):
        for i, row in enumerate(rows):
            if not _is_number(row[j]):
                name = f"{header[j].strip()!r}" if header is not None else f"{j + 1}"
                raise ValueError(
                    f"{path}: column {name} is not numeric (line {i + first_line} holds {row[j].strip()!r})"
                )
    return np.array([[float(f) for f in row] for row in rows], dtype=np.float64)


def _read_npy(path: Path) -> np.ndarray:
    with open(path, "rb") as handle:
        if handle.read(6) != b"\x93NUMPY":
            raise ValueError(f"{path}: not a valid .npy file (no NumPy header)")
    try:
        array = np.load(path, allow_pickle=False)
    except ValueError as error:
        if "allow_pickle" in str(error) or "Object arrays" in str(error):
            raise ValueError(f"{path}: the array holds Python objects, not numbers (refusing to unpickle)") from None
        raise ValueError(f"{path}: not a valid .npy file ({error})") from None
    except (OSError, EOFError) as error:
        raise ValueError(f"{path}: not a valid .npy file ({error})") from None
    if not isinstance(array, np.ndarray):
        raise ValueError(f"{path}: expected a single array (.npy), got {type(array).__name__}")
    if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
        raise ValueError(f"{path}: the array has dtype {array.dtype}, which is not numeric")
    if np.iscomplexobj(array):
        raise ValueError(f"{path}: the array is complex; flows need real numbers")
    return array.astype(np.float64)


def read_array(path: str | os.PathLike) -> np.ndarray:
    """Read an `(N, D)` float64 array from a `.csv` or `.npy` file.

    CSV files may have one header row (detected when its fields are not numbers); delimiters `,` `;` tab and space are
    recognised. A 1-D array is read as `(N, 1)`.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: unknown suffix, malformed CSV (ragged rows, empty), non-numeric columns, arrays that are not 1-D or
            2-D, or non-finite values (NaN, inf), each named in one line.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such data file: {path}")
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a data file")
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        array = _read_csv(path)
    elif suffix == ".npy":
        array = _read_npy(path)
    else:
        raise ValueError(
            f"{path}: unknown data file type {suffix or '(none)'!r}; use one of {', '.join(FILE_SUFFIXES)}"
        )
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2:
        raise ValueError(f"{path}: expected a table of shape (N, D), got an array of shape {array.shape}")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"{path}: the table is empty (shape {array.shape})")
    bad = ~np.isfinite(array)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise ValueError(
            f"{path}: {int(bad.sum())} non-finite value(s) (NaN or inf), the first at row {row + 1}, column {col + 1}"
        )
    return array


def file_splits(path: str | os.PathLike, *, val: float = 0.1, test: float = 0.1, seed: int = 0) -> Splits:
    """Read a CSV/TSV/NPY file and split it into train/val/test by a seeded permutation (80/10/10 by default).

    The column names of a CSV/TSV header are kept in `info["columns"]`.
    """
    array = read_array(path)
    if not (0 < val < 1 and 0 < test < 1 and val + test < 1):
        raise ValueError(f"val and test fractions must be in (0, 1) and sum below 1, got {val} and {test}")
    splits = split_array(array, str(path), val=val, test=test, seed=seed)
    splits.info.update(source=str(path), seed=seed)
    columns = column_names(path)
    if columns is not None:
        splits.info["columns"] = columns
    return splits
