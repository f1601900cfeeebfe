"""The benchmark scripts of bench/ with their peer models (zuko, nflows, normflows), run in-process."""

import json

import pytest
import torch


def test_bench_likelihood_command(script, tmp_path, capsys):
    out = tmp_path / "b.json"
    argv = [
        "--datasets",
        "8gaussians",
        "--models",
        "flowkit-maf,zuko-maf",
        "--steps",
        "5",
        "--seeds",
        "2",
        "--n-train",
        "400",
        "--transforms",
        "1",
        "--hidden",
        "8,8",
        "--out",
        str(out),
    ]
    assert script("likelihood").main(argv) == 0
    printed = capsys.readouterr().out
    assert "| 8gaussians | flowkit-maf |" in printed and "| 8gaussians | zuko-maf |" in printed
    result = json.loads(out.read_text())
    assert [s["model"] for s in result["summary"]] == ["flowkit-maf", "zuko-maf"]
    assert len(result["runs"]) == 4
    flowkit_runs = [r for r in result["runs"] if r["model"] == "flowkit-maf"]
    mean = sum(r["test_nll"] for r in flowkit_runs) / 2
    assert result["summary"][0]["test_nll"] == pytest.approx(mean)
    # matched size: the same number of parameters as zuko's MAF
    assert result["summary"][0]["parameters"] == result["summary"][1]["parameters"]


@pytest.mark.parametrize("name", ["zuko-nsf", "zuko-maf", "zuko-realnvp", "nflows-nsf", "nflows-maf", "zuko-sospf"])
def test_peers_match_flowkit_sizes_and_standardise(script, name):
    import flowkit

    peers = script("peers")
    x = torch.randn(64, 3) * 10 + 5
    peer = peers.build_peer(name, 3, transforms=2, hidden=(8, 8), standardize_with=x)
    flow = flowkit.flows.build_flow(name.split("-", 1)[1], 3, transforms=2, hidden=(8, 8))
    assert flowkit.flows.registry.count_parameters(peer) == flowkit.flows.registry.count_parameters(flow)
    assert peer.log_prob(x).shape == (64,) and torch.isfinite(peer.log_prob(x)).all()
    assert peer.sample(5).shape == (5, 3)
    with pytest.raises(ValueError, match="unknown peer flow 'torch-nsf'"):
        peers.build_peer("torch-nsf", 3)


@pytest.mark.parametrize("coupling", [False, True])
def test_speed_builds_the_same_nsf_in_every_library(script, coupling):
    speed = script("speed")
    sizes = set()
    for library in speed.LIBRARIES:
        module, log_prob, sample = speed.build(library, "coupling" if coupling else "autoregressive", 4, 2, 4, 3.0, 8)
        assert log_prob(torch.randn(7, 4)).shape == (7,), library
        assert sample(3).shape == (3, 4), library
        sizes.add(sum(p.numel() for p in module.parameters() if p.requires_grad))
    assert len(sizes) == 1, sizes


def test_speed_reports_each_thread_count_and_the_cpu(script, tmp_path, capsys):
    speed = script("speed")
    out = tmp_path / "speed.json"
    argv = ["--kinds", "autoregressive", "--features", "3", "--libraries", "flowkit", "--layers", "1", "--bins", "4"]
    argv += ["--hidden", "8", "--batch", "16", "--repeats", "1", "--iters", "1", "--no-memory", "--styles", "matched"]
    threads = torch.get_num_threads()
    try:
        speed.main([*argv, "--threads", "1", "2", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    report = json.loads(out.read_text())
    assert report["cpu"] == speed.cpu_name() and report["cpu"]
    assert len(report["load_average"]) == 3
    assert [entry["threads"] for entry in report["configs"]] == [1, 2]
    printed = capsys.readouterr().out
    assert f"CPU: {report['cpu']}" in printed
    assert "matched construction, 1 thread:" in printed and "matched construction, 2 threads:" in printed


def test_profile_autoregressive_writes_one_table_per_profile(script, tmp_path, capsys):
    profiler = script("profile_autoregressive")
    argv = ["--features", "3", "--libraries", "flowkit", "--layers", "1", "--bins", "4", "--hidden", "8"]
    argv += ["--batch", "16", "--steps", "1", "--threads", "1", "--out", str(tmp_path)]
    threads = torch.get_num_threads()
    try:
        assert profiler.main(argv) == 0
    finally:
        torch.set_num_threads(threads)
    tables = {path.name: path.read_text() for path in tmp_path.glob("*.txt")}
    assert set(tables) == {"train_D3_flowkit.txt", "sample_D3_flowkit.txt"}
    assert "Self CPU" in tables["train_D3_flowkit.txt"] and "aten::mm" in tables["train_D3_flowkit.txt"]
    assert "sample, autoregressive NSF D=3" in tables["sample_D3_flowkit.txt"]
    assert "CPU: " in capsys.readouterr().out


def test_families_benchmark_pairs_models_with_their_references(script, tmp_path):
    families = script("families")
    out = tmp_path / "f.json"
    argv = ["--datasets", "8gaussians", "--models", "flowkit-naf,flowkit-nsf,zuko-naf", "--steps", "2"]
    argv += ["--seeds", "2", "--n-train", "300", "--transforms", "1", "--hidden", "8", "--out", str(out)]
    assert families.main([*argv, "--timing-rounds", "1", "--timing-steps", "1"]) == 0
    report = json.loads(out.read_text())
    pairs = {(c["model"], c["reference"]): c for c in report["comparisons"]}
    assert set(pairs) == {("flowkit-naf", "flowkit-nsf"), ("flowkit-naf", "zuko-naf")}
    runs = {(r["model"], r["seed"]): r["test_nll"] for r in report["runs"]}
    difference = sum(runs[("flowkit-naf", s)] - runs[("zuko-naf", s)] for s in (0, 1)) / 2
    assert pairs[("flowkit-naf", "zuko-naf")]["difference"] == pytest.approx(difference)
    times = report["time_per_step_s"]["8gaussians"]
    assert pairs[("flowkit-naf", "zuko-naf")]["time_ratio"] == pytest.approx(times["zuko-naf"] / times["flowkit-naf"])


def test_families_benchmark_trains_the_free_form_flow_at_nsf_cpu_time(script, tmp_path):
    families = script("families")
    out = tmp_path / "ff.json"
    argv = ["--datasets", "8gaussians", "--models", "flowkit-free-form,flowkit-nsf", "--steps", "4", "--seeds", "1"]
    argv += ["--n-train", "300", "--hidden", "8", "--out", str(out), "--timing-rounds", "1", "--timing-steps", "1"]
    assert families.main(argv) == 0
    report = json.loads(out.read_text())
    times = report["time_per_step_s"]["8gaussians"]
    steps = {r["model"]: r["steps"] for r in report["runs"]}
    assert steps["flowkit-nsf"] == 4
    assert steps["flowkit-free-form"] == max(1, round(4 * times["flowkit-nsf"] / times["flowkit-free-form"]))
    (pair,) = report["comparisons"]
    assert (pair["model"], pair["reference"]) == ("flowkit-free-form", "flowkit-nsf")
    assert pair["within_0.1_nats"] == (pair["difference"] <= 0.1)


def test_bench_shared_conditioners(script, tmp_path):
    out = tmp_path / "shared.json"
    argv = ["--dataset", "moons", "--steps", "3", "--seeds", "2", "--transforms", "3", "--hidden", "8", "--bins", "4"]
    results = script("shared").main([*argv, "--out", str(out)])
    assert json.loads(out.read_text())["variants"].keys() == results["variants"].keys()
    variants = results["variants"]
    assert set(variants) == {"independent", "nanoflow", "output", "naive"}
    assert variants["naive"]["parameters"] < variants["output"]["parameters"] < variants["nanoflow"]["parameters"]
    for name in ("nanoflow", "output", "naive"):
        assert set(variants[name]["vs_independent"]) == {"difference", "paired_se"}


@pytest.mark.slow
def test_continuous_benchmark_trains_a_subset_and_counts_both_libraries_evaluations(script, tmp_path):
    continuous = script("continuous")
    out = tmp_path / "c.json"
    assert continuous.main(["--quick", "--models", "flowkit,zuko", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    models = report["summary"]["moons"]["models"]
    assert set(models) == {"flowkit", "zuko"}
    assert models["flowkit"]["nfe_last_quarter"] > 0 and models["zuko"]["nfe_last_quarter"] > 0
    checks = report["summary"]["moons"]["checks"]
    ratio = models["zuko"]["median_step_seconds"] / models["flowkit"]["median_step_seconds"]
    assert checks["zuko_step_time_over_flowkit"] == pytest.approx(ratio)
    with pytest.raises(SystemExit):
        continuous.main(["--quick", "--models", "flowkit,cnf2", "--out", str(out)])
