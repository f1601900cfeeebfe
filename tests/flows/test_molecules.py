"""The internal-coordinate flow on alanine dipeptide: exact densities, samples are molecules, a short BG run."""

import math

import pytest
import torch

from flowkit.bijectors.internal import same_chirality
from flowkit.flows import internal_coordinate_flow
from flowkit.targets.alanine import (
    ALANINE_CHIRAL_CENTRES,
    alanine_dipeptide_positions,
    alanine_internal_coordinates,
)
from flowkit.testing import randomize


@pytest.fixture(scope="module")
def flow():
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        internal = alanine_internal_coordinates(alanine_dipeptide_positions())
        return randomize(internal_coordinate_flow(internal, blocks=1, hidden=(16,), bins=4), scale=0.05)
    finally:
        torch.set_default_dtype(default)


def test_density_of_samples_and_rigid_invariance(flow):
    torch.manual_seed(0)
    x, log_q = flow.sample_and_log_prob((64,))
    assert x.shape == (64, 66) and log_q.dtype == torch.float64
    torch.testing.assert_close(flow.log_prob(x), log_q, atol=1e-8, rtol=0)
    # rotate and translate the samples: the density on the quotient does not change
    angle = 0.7
    rot = torch.tensor(
        [[math.cos(angle), -math.sin(angle), 0.0], [math.sin(angle), math.cos(angle), 0.0], [0.0, 0.0, 1.0]],
        dtype=torch.float64,
    )
    moved = (x.reshape(-1, 22, 3) @ rot.T + torch.tensor([0.3, -1.0, 2.0], dtype=torch.float64)).reshape(-1, 66)
    torch.testing.assert_close(flow.log_prob(moved), log_q, atol=1e-8, rtol=0)


def test_base_is_uniform_on_the_circular_coordinates(flow):
    internal = flow.bijector[0]
    z = flow.base.sample((4000,))
    circ = z[:, internal.circular_idx]
    assert float(circ.min()) >= -math.pi and float(circ.max()) < math.pi
    assert abs(float(circ.mean())) < 0.1 and abs(float(circ.var()) - math.pi**2 / 3) < 0.2
    real = [i for i in range(60) if i not in internal.circular_idx]
    assert abs(float(z[:, real].var()) - 1.0) < 0.05


def test_short_boltzmann_generator_run_keeps_the_molecule():
    mm = pytest.importorskip("openmm")  # noqa: F841
    from flowkit.targets import AlanineDipeptide
    from flowkit.train import BoltzmannGenerator, fit

    target = AlanineDipeptide(1000.0)
    internal = alanine_internal_coordinates(target.positions)
    flow = internal_coordinate_flow(internal, blocks=1, hidden=(16,), bins=4)
    samples = (target.positions + 0.003 * torch.randn(64, 66, dtype=torch.float64)).float()
    before = target.evaluations
    history = fit(flow, BoltzmannGenerator(target, samples, w_kl=0.1), steps=5, batch_size=32, progress=False)
    assert len(history.loss) == 5 and all(math.isfinite(v) for v in history.loss)
    assert target.evaluations - before == 5 * 32
    with torch.no_grad():
        x = flow.sample((16,))
    # the handedness of CA is a stiff, non-circular coordinate: samples of a flow near the identity are L-alanine
    assert bool(same_chirality(x.double(), internal.reference.double(), ALANINE_CHIRAL_CENTRES).all())
