import numpy as np
import pytest
import torch

from flowkit.data import file_splits, load, read_array


def test_csv_with_header_and_npy_give_the_same_table(tmp_path):
    table = np.random.default_rng(0).normal(size=(50, 3))
    np.save(tmp_path / "x.npy", table)
    lines = ["a,b,c"] + [",".join(repr(float(v)) for v in row) for row in table]
    (tmp_path / "x.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "y.csv").write_text("\n".join(lines[1:]) + "\n")
    for name in ("x.npy", "x.csv", "y.csv"):
        np.testing.assert_allclose(read_array(tmp_path / name), table, rtol=0, atol=1e-15)


def test_semicolon_and_1d_files(tmp_path):
    (tmp_path / "s.csv").write_text("1;2\n3;4\n")
    np.testing.assert_array_equal(read_array(tmp_path / "s.csv"), [[1, 2], [3, 4]])
    np.save(tmp_path / "v.npy", np.arange(5))
    assert read_array(tmp_path / "v.npy").shape == (5, 1)


def test_file_splits_are_a_seeded_permutation(tmp_path):
    table = np.arange(200, dtype=float).reshape(100, 2)
    np.save(tmp_path / "x.npy", table)
    s = load(tmp_path / "x.npy")
    assert (len(s.train), len(s.val), len(s.test)) == (80, 10, 10)
    together = torch.cat([s.train, s.val, s.test]).numpy()
    assert sorted(together[:, 0]) == sorted(table[:, 0])  # a partition of the rows
    assert torch.equal(file_splits(tmp_path / "x.npy").test, s.test)
    assert not torch.equal(file_splits(tmp_path / "x.npy", seed=1).test, s.test)


@pytest.mark.parametrize(
    "content,message",
    [
        ("", "bad CSV: the file is empty"),
        ("1,2\n3,4,5\n", "bad CSV: line 2 has 3 fields, expected 2"),
        ("x,y\n1,2\n3,abc\n", "column 'y' is not numeric \\(line 3 holds 'abc'\\)"),
        ("1,2\nfoo,4\n", "column 1 is not numeric \\(line 2 holds 'foo'\\)"),
        ("1,2\n3,nan\n", "1 non-finite value\\(s\\) \\(NaN or inf\\), the first at row 2, column 2"),
        ("a,b\n", "bad CSV: no data rows"),
    ],
)
def test_bad_csv_files_give_one_line_errors(tmp_path, content, message):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as info:
        read_array(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_bad_npy_and_other_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such data file"):
        read_array(tmp_path / "missing.csv")
    with pytest.raises(FileNotFoundError, match="no such data file"):
        load(tmp_path / "missing.npy")
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="refusing to unpickle"):
        read_array(tmp_path / "obj.npy")
    np.save(tmp_path / "s.npy", np.array(["a", "b"]))
    with pytest.raises(ValueError, match="not numeric"):
        read_array(tmp_path / "s.npy")
    np.save(tmp_path / "cube.npy", np.zeros((2, 2, 2)))
    with pytest.raises(ValueError, match=r"expected a table of shape \(N, D\)"):
        read_array(tmp_path / "cube.npy")
    np.save(tmp_path / "inf.npy", np.array([[1.0, np.inf]]))
    with pytest.raises(ValueError, match="non-finite"):
        read_array(tmp_path / "inf.npy")
    (tmp_path / "junk.npy").write_bytes(b"not an npy file")
    with pytest.raises(ValueError, match="not a valid .npy file"):
        read_array(tmp_path / "junk.npy")
    (tmp_path / "x.txt").write_text("1,2\n")
    with pytest.raises(ValueError, match="unknown data file type '.txt'"):
        read_array(tmp_path / "x.txt")
    with pytest.raises(ValueError, match="is a directory"):
        read_array(tmp_path)
    np.save(tmp_path / "tiny.npy", np.zeros((3, 2)))
    with pytest.raises(ValueError, match="too few"):
        load(tmp_path / "tiny.npy")
