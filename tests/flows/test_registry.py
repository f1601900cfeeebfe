"""flowkit.flows.registry: the presets by name that the command line builds."""

import pytest
import torch

import flowkit
from flowkit.flows import PRESET_NAMES, PRESETS, build_flow, parse_hidden
from flowkit.flows.registry import count_parameters


def test_names_are_the_registry_keys():
    assert PRESET_NAMES == tuple(PRESETS)
    assert PRESET_NAMES[:5] == ("nsf", "nsf-coupling", "realnvp", "maf", "lattice") and "cnf" in PRESET_NAMES


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_builds_every_preset(name):
    flow = build_flow(name.upper(), 4, transforms=2, hidden=(8, 8), bins=4)
    assert isinstance(flow, flowkit.flows.FlowModel) and tuple(flow.event_shape) == (4,)
    x = torch.randn(5, 4)
    assert flow.log_prob(x).shape == (5,) and torch.isfinite(flow.log_prob(x)).all()
    assert flow.sample((4,)).shape == (4, 4)
    assert build_flow(name, 4) is not None  # the default size


def test_presets_and_their_default_sizes():
    assert isinstance(build_flow("maf", 2), flowkit.flows.MAF)
    assert isinstance(build_flow("realnvp", 2), flowkit.flows.RealNVP)
    nsf, coupling = build_flow("nsf", 4), build_flow("nsf-coupling", 4)
    assert isinstance(nsf, flowkit.flows.NSF) and isinstance(coupling, flowkit.flows.NSF)
    assert count_parameters(nsf) != count_parameters(coupling)  # autoregressive vs coupling layers
    assert count_parameters(build_flow("realnvp", 2)) == count_parameters(
        flowkit.flows.RealNVP(2, transforms=8, hidden=(128, 128))
    )
    assert count_parameters(build_flow("maf", 2)) == count_parameters(
        flowkit.flows.MAF(2, transforms=5, hidden=(64, 64))
    )


def test_unknown_name_is_a_clear_error_listing_the_names():
    with pytest.raises(ValueError, match="unknown flow 'glow'; choose one of nsf, nsf-coupling, realnvp, maf, lattice"):
        build_flow("glow", 2)


def test_bad_sizes_are_errors():
    with pytest.raises(ValueError, match="transforms must be at least 1"):
        build_flow("nsf", 2, transforms=0)
    with pytest.raises(ValueError, match="realnvp needs at least 2 features"):
        build_flow("realnvp", 1)
    with pytest.raises(ValueError, match="lattice needs a square number"):
        build_flow("lattice", 8)
    with pytest.raises(ValueError, match="hidden sizes must be positive"):
        build_flow("maf", 2, hidden=(8, 0))


def test_parse_hidden():
    assert parse_hidden("128,64") == parse_hidden("128x64") == parse_hidden([128, 64]) == (128, 64)
    for bad in ("a,b", "12,x", "", "0"):
        with pytest.raises(ValueError, match="hidden sizes must be"):
            parse_hidden(bad)
