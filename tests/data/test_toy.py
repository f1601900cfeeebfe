import numpy as np
import pytest

import flowkit
from flowkit.data import TOY_DATASETS, toy, toy_splits


@pytest.mark.parametrize("name", list(TOY_DATASETS))
def test_toy_sets_are_seeded_2d_and_bounded(name):
    a, b, c = toy(name, 500, seed=3), toy(name, 500, seed=3), toy(name, 500, seed=4)
    assert a.shape == (500, 2) and np.isfinite(a).all()
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert np.abs(a).max() < 6


def test_toy_shapes_match_their_definition():
    rng_pts = toy("rings", 4000)
    radius = np.linalg.norm(rng_pts, axis=1)
    # four rings of radius 0.75, 1.5, 2.25, 3 with noise 0.08: every point lies near one of them
    assert np.min(np.abs(radius[:, None] - np.array([0.75, 1.5, 2.25, 3.0])), axis=1).max() < 0.5
    centres = 4 / np.sqrt(2) * np.stack([np.cos(np.arange(8) * np.pi / 4), np.sin(np.arange(8) * np.pi / 4)], 1)
    g = toy("8gaussians", 4000)
    nearest = np.linalg.norm(g[:, None] - centres, axis=2).min(1)
    assert nearest.std() < 0.6 and np.mean(nearest**2) == pytest.approx(2 * 0.5**2 / 2, rel=0.1)
    board = toy("checkerboard", 4000) / 2
    assert ((np.floor(board[:, 0]) + np.floor(board[:, 1])) % 2 == 0).all()


def test_toy_splits_are_independent_draws():
    s = toy_splits("moons", n_train=100, n_val=50, n_test=60, seed=1)
    assert (len(s.train), len(s.val), len(s.test)) == (100, 50, 60)
    assert not np.isin(s.val.numpy(), s.train.numpy()).all()
    assert str(s.train.dtype) == "torch.float32" and s.features == 2


def test_load_by_name_and_errors():
    assert flowkit.data.load("Moons").name == "moons"
    with pytest.raises(ValueError, match="unknown dataset 'mooons'"):
        flowkit.data.load("mooons")
    with pytest.raises(ValueError, match="unknown 2-D dataset"):
        toy("nope")
    with pytest.raises(ValueError, match="positive integer"):
        toy("moons", 0)
