"""Reference MD of alanine dipeptide: Langevin frames from OpenMM, cached on disk and read back."""

import numpy as np
import pytest
import torch

pytest.importorskip("openmm")

from flowkit.bijectors.internal import same_chirality  # noqa: E402
from flowkit.data import alanine_dipeptide_md  # noqa: E402
from flowkit.targets.alanine import ALANINE_CHIRAL_CENTRES, alanine_dipeptide_positions  # noqa: E402


def test_md_frames_cached_and_reproducible(tmp_path):
    kw = dict(ns=0.002, interval=0.1, equilibration=0.5, root=tmp_path)
    x = alanine_dipeptide_md(1000.0, seed=3, **kw)
    assert x.shape == (20, 66) and x.dtype == torch.float64 and bool(torch.isfinite(x).all())
    files = list((tmp_path / "alanine_dipeptide").glob("*.npy"))
    assert len(files) == 1 and "T1000" in files[0].name and "seed3" in files[0].name
    # the cache is read back (a tampered cache file is what comes back)
    np.save(files[0], np.load(files[0]) + 1.0)
    torch.testing.assert_close(alanine_dipeptide_md(1000.0, seed=3, **kw), x + 1.0)
    # a fresh run with the same seed gives the same frames; another seed, others
    torch.testing.assert_close(alanine_dipeptide_md(1000.0, seed=3, cache=False, **kw), x)
    other = alanine_dipeptide_md(1000.0, seed=4, cache=False, **kw)
    assert float((other - x).abs().max()) > 1e-3
    assert len(list((tmp_path / "alanine_dipeptide").glob("*.npy"))) == 1  # cache=False writes nothing
    # frames are molecules: C-H bonds of the ACE methyl stay near 0.109 nm, L-alanine stays L
    pos = x.reshape(-1, 22, 3)
    bonds = (pos[:, [0, 2, 3]] - pos[:, [1]]).norm(dim=-1)
    assert float(bonds.min()) > 0.08 and float(bonds.max()) < 0.14
    assert bool(same_chirality(x, alanine_dipeptide_positions(), ALANINE_CHIRAL_CENTRES).all())


def test_md_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="temperature"):
        alanine_dipeptide_md(0.0, ns=0.001, root=tmp_path)
    with pytest.raises(ValueError, match="no frames"):
        alanine_dipeptide_md(300.0, ns=0.001, interval=10.0, root=tmp_path)
    with pytest.raises(ValueError, match="solvent"):
        alanine_dipeptide_md(300.0, ns=0.001, solvent="tip3p", root=tmp_path)
