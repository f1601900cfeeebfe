"""``flowkit boltzmann alanine-dipeptide``: a tiny run on cached MD writes a model that loads, metrics and plots."""

import json

import pytest

pytest.importorskip("openmm")

import argparse  # noqa: E402

import numpy as np  # noqa: E402
import openmm.app  # noqa: E402
import openmm.unit  # noqa: E402
import torch  # noqa: E402
from trajectory_files import read_dcd  # noqa: E402

import flowkit  # noqa: E402
from flowkit.cli import main  # noqa: E402
from flowkit.cli.targets import TARGET_SPECS, Evaluation  # noqa: E402
from flowkit.stats import blocked_mean, free_energy_profile  # noqa: E402
from flowkit.targets.alanine import backbone_dihedrals  # noqa: E402


def test_boltzmann_alanine_dipeptide(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWKIT_DATA", str(tmp_path / "data"))
    out = tmp_path / "aldp"
    args = ["boltzmann", "alanine-dipeptide", "--temperature", "800", "--md-ns", "0.004", "--steps", "3"]
    args += ["--trajectory-frames", "16"]
    args += ["--batch-size", "8", "--transforms", "2", "--hidden", "8", "--eval-samples", "64", "--imh-steps", "8"]
    assert main([*args, "--out", str(out), "--no-progress", "--threads", "1"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["target"] == "alanine-dipeptide" and metrics["temperature"] == 800.0 and metrics["steps"] == 3
    assert metrics["w_kl"] == 0.1  # the target's default (TargetSpec.defaults); --steps 3 given wins over its 3000
    assert 0 <= metrics["p_phi_positive_raw"] <= 1 and 0 <= metrics["mirror_fraction"] <= 1
    # The last 10% of the MD frames are held out; the weights kept are those of the best held-out NLL.
    frames = flowkit.data.alanine_dipeptide_md(800.0, 0.004, 0)
    assert metrics["validation_samples"] == max(1, int(0.1 * frames.shape[0]))
    assert 1 <= metrics["best_step"] <= 3
    with torch.no_grad():
        held_out = flow_nll_of(flowkit.io.load(out / "model"), frames[-metrics["validation_samples"] :].float())
    assert held_out == pytest.approx(metrics["best_val_nll"], rel=1e-5)
    assert {"ramachandran.png", "free_energy.png", "history.csv"} <= {p.name for p in out.iterdir()}
    # P(phi > 0) with errors, in MD (the --md-ns frames, 10 blocks) and reweighted; F(phi) against MD
    phi_md, _ = backbone_dihedrals(frames)
    p_md, p_md_error = blocked_mean((phi_md > 0).double(), 10)
    assert metrics["p_phi_positive_md"] == pytest.approx(p_md) and metrics["p_phi_positive_md_error"] == p_md_error
    assert 0 <= metrics["p_phi_positive_reweighted"] <= 1 and metrics["p_phi_positive_reweighted_error"] >= 0
    assert 0 < metrics["ess_l_alanine"] <= 1 and 0 < metrics["ess"] <= 1
    assert metrics["free_energy_vs_md"]["bins"] >= 1
    table = np.genfromtxt(out / "free_energy.csv", delimiter=",", names=True)
    assert table.dtype.names == ("phi", "F_flow", "F_flow_error", "F_raw", "F_md", "F_md_error") and len(table) == 36
    md_profile = free_energy_profile(phi_md, error="blocks", blocks=10)
    np.testing.assert_allclose(table["F_md"], md_profile.free_energy, rtol=1e-6)
    # the resampled configurations: a PDB (topology, first frame) and a DCD of --trajectory-frames frames
    pdb = openmm.app.PDBFile(str(out / "samples.pdb"))
    assert pdb.topology.getNumAtoms() == 22
    dcd = read_dcd(out / "samples.dcd") / 10.0  # angstrom -> nm
    assert dcd.shape == (metrics["trajectory_frames"], 22, 3) == (16, 22, 3)
    first = np.asarray(pdb.getPositions(asNumpy=True).value_in_unit(openmm.unit.nanometer))
    np.testing.assert_allclose(first, dcd[0], rtol=0, atol=6e-5)
    assert len(np.unique(dcd.reshape(16, -1), axis=0)) == metrics["trajectory_distinct_frames"]
    assert list((tmp_path / "data" / "alanine_dipeptide").glob("md_T800_vacuum_ns0.004_*.npy"))
    flow = flowkit.io.load(out / "model")
    assert flow.sample((2,)).shape == (2, 66)
    assert main(["boltzmann", "alanine-dipeptide", "--temperature", "-5", "--steps", "1", "--out", str(out)]) == 2


def flow_nll_of(flow, x):
    return -flow.log_prob(x).mean().item()


def test_alanine_files_hold_the_resampled_samples(tmp_path, monkeypatch):
    # The table entry's metrics and files on a tiny untrained flow: the DCD and PDB hold the configurations drawn
    # by systematic resampling of the L-alanine samples, to file precision, in angstrom.
    monkeypatch.setenv("FLOWKIT_DATA", str(tmp_path / "data"))
    spec = TARGET_SPECS["alanine-dipeptide"]
    args = argparse.Namespace(temperature=800.0, solvent="vacuum", md_ns=0.004, seed=1, trajectory_frames=40, w_kl=0.1)
    args.transforms, args.hidden, args.samples = 2, "8", 0
    target = spec.build_target(args)
    flow = spec.build_flow(args, target, None)
    torch.manual_seed(0)
    x, log_w = flowkit.sampling.importance_sample(flow, target, 64)
    run = Evaluation(flow, target, x, log_w, chain=x[:2])
    metrics = spec.metrics(args, run)
    spec.write(args, run, tmp_path)
    keep = flowkit.bijectors.internal.same_chirality(
        x.double(), flow.bijector[0].reference.double(), flowkit.targets.alanine.ALANINE_CHIRAL_CENTRES
    )
    index = flowkit.sampling.resample(log_w[keep], 40, generator=torch.Generator().manual_seed(1))
    expected = x[keep][index].double().reshape(40, 22, 3).numpy()
    np.testing.assert_allclose(read_dcd(tmp_path / "samples.dcd") / 10.0, expected, rtol=1e-6, atol=1e-7)
    pdb = openmm.app.PDBFile(str(tmp_path / "samples.pdb"))
    first = np.asarray(pdb.getPositions(asNumpy=True).value_in_unit(openmm.unit.nanometer))
    np.testing.assert_allclose(first, expected[0], rtol=0, atol=5.01e-5)
    assert metrics["trajectory_distinct_frames"] == len(torch.unique(index))
    p, error = flowkit.sampling.reweight(backbone_dihedrals(x[keep])[0] > 0, log_w[keep])
    assert metrics["p_phi_positive_reweighted"] == pytest.approx(float(p))
    assert metrics["p_phi_positive_reweighted_error"] == pytest.approx(float(error))
