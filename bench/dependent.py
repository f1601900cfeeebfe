"""Flows for dependent data (Kirchler et al., ICML 2023): test NLL of the i.i.d. flow against the dependent-data flow.

Data (``flowkit.data``): ``equicorrelated_groups`` (Pareto group sizes, one correlation rho
within each group) and ``random_kinship`` (Sigma = lambda I + (1 - lambda) K with the paper's
random dense K), both with n = 2000 training points of p = 2 through the paper's 2-D maps
(``cres`` by default), and ``stock_pairs`` (the S&P 500 and NASDAQ on each trading day, a
group of two; real data, from the files bundled with ``arch``). Validation and test points of
the synthetic sets are independent draws of the marginal; those of ``stock_pairs`` are the
last days.

For each data set and seed the *same* flow (NSF, autoregressive, 3 layers, 16 bins, hidden
(64, 64), bound 8, initialised from the seed) trains for the *same* steps (Adam, cosine
schedule, batch 256) twice: with ``MaximumLikelihood`` (i.i.d.) and with
``DependentMaximumLikelihood`` (mini-batch estimator, rho or lambda refitted on the latents
of all training points every ``--update-every`` steps by ``DependenceUpdate``, starting from
0.5). The metric is the paper's: the mean marginal NLL ``-flow.log_prob(x)`` of the test
points, in nats, with its standard error over the test points; the gain is the i.i.d. NLL
minus the dependent NLL, paired over the same test points, and its standard error over the
seeds (and over the test points within a seed). The recovered rho or lambda is reported next
to the truth.

Run: ``python bench/dependent.py`` (about 15 minutes on one core); ``--quick`` for a smoke
run. Writes ``bench/results/dependent.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch

import flowkit
from flowkit.data import equicorrelated_groups, random_kinship, stock_pairs
from flowkit.data.evaluation import log_prob_batched
from flowkit.train import DependenceUpdate, DependentMaximumLikelihood, MaximumLikelihood, fit, with_indices

RESULTS = Path(__file__).resolve().parent / "results"


def make_flow(seed: int) -> flowkit.Flow:
    torch.manual_seed(seed)
    return flowkit.flows.NSF(2, transforms=3, bins=16, hidden=(64, 64), bound=8.0)


def load(name: str, seed: int, n: int) -> flowkit.data.DependentSplits:
    if name == "equi":
        return equicorrelated_groups("cres", n=n, rho=0.7, seed=seed)
    if name == "rm":
        return random_kinship("cres", n=n, lam=0.5, seed=seed)
    return stock_pairs()


def train(data, dependent: bool, seed: int, steps: int, every: int) -> tuple[flowkit.Flow, float | None, float]:
    flow = make_flow(seed)
    start = time.perf_counter()
    settings = dict(steps=steps, batch_size=256, lr=2e-3, progress=False, seed=seed)
    if not dependent:
        fit(flow, MaximumLikelihood(), data.train, **settings)
        return flow, None, time.perf_counter() - start
    structure = {"groups": data.groups} if data.groups is not None else {"kinship": data.kinship}
    objective = DependentMaximumLikelihood(**structure, value=0.5)
    update = DependenceUpdate(objective, flow, data.train, every=every)
    fit(flow, objective, with_indices(data.train), callbacks=[update], **settings)
    return flow, objective.value, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", nargs="+", default=["equi", "rm", "stocks"], choices=["equi", "rm", "stocks"])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--update-every", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 seed, 60 steps, n = 400")
    parser.add_argument("--out", type=Path, default=RESULTS / "dependent.json")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.steps, args.n, args.update_every = 1, 60, 400, 20
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    results: dict = {"settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    for name in args.sets:
        runs = []
        for seed in range(args.seeds):
            data = load(name, seed, args.n)
            truth = data.truth.get("rho", data.truth.get("lam"))
            nll = {}
            for dependent in (False, True):
                flow, value, seconds = train(data, dependent, seed, args.steps, args.update_every)
                nll["dependent" if dependent else "iid"] = -log_prob_batched(flow, data.test).double()
                if dependent:
                    estimate, dep_seconds = value, seconds
                else:
                    iid_seconds = seconds
            gain = nll["iid"] - nll["dependent"]
            run = {
                "seed": seed,
                "n_train": len(data.train),
                "n_test": len(data.test),
                "iid_nll": float(nll["iid"].mean()),
                "iid_se": float(nll["iid"].std() / math.sqrt(len(gain))),
                "dependent_nll": float(nll["dependent"].mean()),
                "dependent_se": float(nll["dependent"].std() / math.sqrt(len(gain))),
                "gain": float(gain.mean()),
                "gain_se_points": float(gain.std() / math.sqrt(len(gain))),
                "estimate": estimate,
                "truth": truth,
                "seconds": {"iid": iid_seconds, "dependent": dep_seconds},
            }
            runs.append(run)
            print(name, json.dumps(run), flush=True)
        gains = np.array([r["gain"] for r in runs])
        se_seeds = float(gains.std(ddof=1) / math.sqrt(len(gains))) if len(gains) > 1 else float("nan")
        se_points = float(math.sqrt(sum(r["gain_se_points"] ** 2 for r in runs)) / len(runs))
        summary = {
            "iid_nll": float(np.mean([r["iid_nll"] for r in runs])),
            "dependent_nll": float(np.mean([r["dependent_nll"] for r in runs])),
            "gain": float(gains.mean()),
            "gain_se_seeds": se_seeds,
            "gain_se_test_points": se_points,
            "gain_over_se_seeds": float(gains.mean() / se_seeds) if se_seeds > 0 else float("nan"),
            "estimates": [r["estimate"] for r in runs],
            "truth": runs[0]["truth"],
        }
        results[name] = {"runs": runs, "summary": summary}
        print(name, "summary", json.dumps(summary), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
