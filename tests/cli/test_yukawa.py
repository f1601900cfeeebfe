"""`flowkit boltzmann yukawa`: a lattice flow on the Yukawa model, observables with the chiral condensate."""

import json

from flowkit import io
from flowkit.cli import main
from flowkit.flows import LatticeFlow


def test_boltzmann_yukawa_writes_observables_with_the_condensate(tmp_path):
    out = tmp_path / "yukawa"
    argv = ["boltzmann", "yukawa", "--L", "4", "--m2", "-1", "--lam", "0.5", "--g", "1.0", "--flow", "lattice", "--z2"]
    argv += ["--transforms", "2", "--hidden", "4", "--steps", "3", "--batch-size", "16", "--eval-samples", "200"]
    argv += ["--imh-steps", "200", "--hmc-steps", "60", "--out", str(out), "--no-progress", "--no-plots"]
    assert main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["target"] == "yukawa" and metrics["event_shape"] == [4, 4]
    observables = metrics["observables"]
    assert set(observables) == {"imh", "hmc"}
    for entry in observables.values():
        value, error = entry["abs_chiral_condensate"]
        assert value > 0 and error >= 0
        assert entry["chi2"][0] > 0
    assert isinstance(io.load(out / "model"), LatticeFlow)


def test_boltzmann_yukawa_refuses_an_odd_lattice(tmp_path, capsys):
    assert main(["boltzmann", "yukawa", "--L", "5", "--steps", "1", "--out", str(tmp_path / "y")]) == 2
    assert "L must be even" in capsys.readouterr().err
