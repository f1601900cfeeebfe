"""flowkit.flows.registry: the presets by name, filled from the families' `@preset` declarations."""

import re

import pytest
import torch
from cases import FLOW_PRESETS

import flowkit
from flowkit.flows import DATA_PRESETS, PRESET_NAMES, PRESETS, Preset, build_flow, parse_hidden, preset
from flowkit.flows.registry import IMAGE_PRESETS, count_parameters


def test_names_are_the_registry_keys_in_order():
    assert PRESET_NAMES == tuple(PRESETS) == tuple(sorted(PRESETS))
    assert flowkit.flows.registry.PRESET_NAMES == PRESET_NAMES
    assert {"nsf", "nsf-coupling", "realnvp", "maf", "lattice", "cnf"} <= set(PRESET_NAMES)
    for table, kinds in ((PRESETS, {"vector", "lattice"}), (DATA_PRESETS, {"data"}), (IMAGE_PRESETS, {"image"})):
        assert all(isinstance(p, Preset) and p.name == name and p.kind in kinds for name, p in table.items())


@pytest.mark.parametrize("name", FLOW_PRESETS)
def test_every_preset_case_builds_a_flow_with_a_density_and_samples(name):
    flow, x = FLOW_PRESETS[name]()
    assert isinstance(flow, flowkit.flows.FlowModel) and tuple(flow.event_shape) == tuple(x.shape[1:])
    log_p = flow.log_prob(x)
    assert log_p.shape == (x.shape[0],) and torch.isfinite(log_p).all()
    assert flow.sample((4,)).shape == (4, *x.shape[1:])


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_every_preset_builds_at_its_default_size_case_insensitively(name):
    features = 16 if name == "lattice" else 4
    flow = build_flow(name.upper(), features)
    assert tuple(flow.event_shape) == (features,)
    assert count_parameters(flow) == count_parameters(PRESETS[name](features))


def test_presets_take_their_declared_default_sizes():
    assert PRESETS["realnvp"].arguments == {"transforms": 8, "hidden": (128, 128)}
    assert isinstance(build_flow("maf", 2), flowkit.flows.MAF)
    nsf, coupling = build_flow("nsf", 4), build_flow("nsf-coupling", 4)
    assert isinstance(nsf, flowkit.flows.NSF) and isinstance(coupling, flowkit.flows.NSF)
    assert count_parameters(nsf) != count_parameters(coupling)  # autoregressive vs coupling layers
    assert count_parameters(build_flow("realnvp", 2)) == count_parameters(
        flowkit.flows.RealNVP(2, transforms=8, hidden=(128, 128))
    )
    assert count_parameters(build_flow("maf", 2, transforms=2, hidden="16,16", bins=3)) == count_parameters(
        flowkit.flows.MAF(2, transforms=2, hidden=(16, 16))  # bins: not a size of maf, ignored
    )


def test_a_declaration_registers_its_constructor_unchanged():
    calls = []

    def build(features, **arguments):
        calls.append((features, arguments))
        return features

    try:
        assert preset("test-only", "a test preset", transforms=2, hidden=(3,))(build) is build
        assert PRESETS["test-only"](5, transforms=4, hidden=None) == 5
        assert calls == [(5, {"transforms": 4, "hidden": (3,)})]
    finally:
        del PRESETS["test-only"]
    with pytest.raises(ValueError, match="kind must be one of vector, lattice, image, data, got 'tabular'"):
        preset("x", "no such kind", kind="tabular")


def test_unknown_name_is_a_clear_error_listing_the_names():
    names = ", ".join(PRESETS)  # the declared names, sorted (every family adds its own)
    assert names.startswith("bnaf, ") and "nsf, nsf-coupling" in names
    with pytest.raises(ValueError, match=f"unknown flow 'glow'; choose one of {re.escape(names)}$"):
        build_flow("glow", 2)


def test_bad_sizes_are_errors():
    with pytest.raises(ValueError, match="transforms must be at least 1"):
        build_flow("nsf", 2, transforms=0)
    with pytest.raises(ValueError, match="features must be"):
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
