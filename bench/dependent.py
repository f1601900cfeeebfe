"""Flows for dependent data (Kirchler et al., ICML 2023): test NLL of the i.i.d. flow against the dependent-data flow.

Data (``flowkit.data``), at the paper's design sizes (its ``configs/defaults``):

- ``equi``: ``equicorrelated_groups("cres", n=10000, rho=(0.5, 0.99), max_group=1000)``, Pareto
  (alpha = 0.5) group sizes up to 1000 points, each group with its own correlation
  rho_g ~ U(0.5, 0.99), as the paper's ``equi_*`` sets;
- ``rm``: ``random_kinship("cres", n=5000, lam=0.5)``, Sigma = lambda I + (1 - lambda) K with the
  paper's random dense K;
- ``stocks``: ``stock_pairs()``, the S&P 500 and NASDAQ on each trading day, a group of two (real
  data, from the files bundled with ``arch``; days split in time order).

The synthetic sets have 5000 validation and 5000 test points, independent draws of the marginal
(the paper's ``N_valid``); for independent points the marginal NLL ``-flow.log_prob(x)`` is their
exact likelihood under either model, so it is the validation loss and the test metric of both, as
in the paper's code.

For each set and seed, the *same* flow (NSF, autoregressive, 3 layers, 16 bins, hidden (64, 64),
bound 8, initialised from the seed) trains for the *same* steps (Adam, cosine schedule, batch 256,
learning rate 2e-3, data order from the seed) with the *same* validation: the mean marginal NLL of
the same validation points every ``--val-every`` steps, and the weights of the best validation
restored at the end (``fit(..., val_data=data.val, restore_best=True)``; the paper keeps the
checkpoint of the best validation loss too). The models:

- ``iid``: ``MaximumLikelihood``;
- ``dependent``: ``DependentMaximumLikelihood`` (mini-batch estimator), the parameters refitted on
  the latents of all training points every ``--update-every`` steps by ``DependenceUpdate``
  (from 0.5), and once more on the restored weights: for ``equi`` one rho per group (the paper's
  model), for ``rm`` lambda, for ``stocks`` one shared rho;
- ``dependent_shared`` (``equi`` only): one rho shared by all groups, a misspecified model of the
  per-group data.

Metrics: the mean test NLL in nats; per seed the paired gain ``gain_s = NLL_iid,s - NLL_dep,s``
on the same test points, with its standard error over the test points; over seeds, the mean gain
and its standard error ``std(gain_s, ddof=1) / sqrt(seeds)`` (the training randomness). The
recovered parameters are reported next to the truth (for per-group rho: the mean absolute error
over the groups of two or more points, plain and weighted by group size). For ``stocks`` the
validation and test days are pairs, so the joint test NLL per point is reported too: the
dependent flow's under the test days' Sigma with the learned rho
(``objective.held_out(groups=data.test_groups).log_likelihood``), the i.i.d. flow's with rho = 0
(its marginal NLL), as the paper's ``eval_with_cov``.

Options: ``--models`` (e.g. ``iid dependent_oracle``: equi with each group's true rho fixed, a
diagnosis), ``--equi-n/--equi-rho/--equi-max-group`` (another equicorrelated design),
``--control-variate`` (the objectives' control variate), ``--noise`` (only the SD of the mini-batch
loss at the true rho's on exact latents), ``--val-every``, ``--quick`` (a smoke run).

Run: ``nice -n 10 python bench/dependent.py`` (15 minutes of CPU, 47 minutes of wall time on a
loaded 2-core machine); writes ``bench/results/dependent.json`` (or ``--out``). Measured
(one thread, 3 seeds, gain = NLL_iid - NLL_dep in nats, mean +- SE over seeds; table and diagnosis
in ``docs/api/dependent.md``): rm 0.43 +- 0.21 (2.0 SE), equi (a rho per group) -0.11 +- 0.09,
equi (shared rho) -0.00 +- 0.08, stocks 0.19 +- 0.01 (17 SE); equi with the true rho's fixed
0.073 +- 0.027 (2.7 SE); equi on ``--equi-n 2000 --equi-rho 0.7 --equi-max-group 100``: 0.046 +- 0.011
(a rho per group), 0.044 +- 0.007 (shared); equi with ``--control-variate``: seeds -2.58, +0.11, +0.02
(a rho per group; seed 0 diverges early); equi with a rho per group size: -0.21 +- 0.26.
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

#: The models trained on each set: the name and the `rho=` tying of the dependent objective (None: i.i.d.).
MODELS = {"equi": {"iid": None, "dependent": "group", "dependent_shared": "shared"}}
DEFAULT_MODELS = {"iid": None, "dependent": "shared"}
#: On request (``--models``): equi with each group's true rho, fixed (no update), a diagnosis; a rho per group size.
EXTRA_MODELS = {"equi": {"dependent_oracle": "oracle", "dependent_size": "size"}}


def make_flow(seed: int) -> flowkit.Flow:
    torch.manual_seed(seed)
    return flowkit.flows.NSF(2, transforms=3, bins=16, hidden=(64, 64), bound=8.0)


def load(name: str, seed: int, args) -> flowkit.data.DependentSplits:
    quick = args.quick
    held_out = dict(n_val=500, n_test=500) if quick else dict(n_val=5000, n_test=5000)
    if name == "equi":
        n = 1000 if quick else args.equi_n
        rho = args.equi_rho[0] if len(args.equi_rho) == 1 else tuple(args.equi_rho)
        return equicorrelated_groups("cres", n=n, rho=rho, max_group=args.equi_max_group, seed=seed, **held_out)
    if name == "rm":
        return random_kinship("cres", n=400 if quick else 5000, lam=0.5, seed=seed, **held_out)
    return stock_pairs()


def train(data, tying: str | None, seed: int, args) -> tuple[flowkit.Flow, DependentMaximumLikelihood | None, dict]:
    flow = make_flow(seed)
    start = time.process_time()
    settings = dict(
        steps=args.steps,
        batch_size=256,
        lr=2e-3,
        progress=False,
        seed=seed,
        val_data=data.val,
        val_every=args.val_every,
        restore_best=True,
    )
    if tying is None:
        history = fit(flow, MaximumLikelihood(), data.train, **settings)
        objective = None
    else:
        oracle = tying == "oracle"
        structure = {"groups": data.groups, "rho": "group" if oracle else tying} if data.groups is not None else {}
        variate = args.control_variate and not oracle
        objective = DependentMaximumLikelihood(
            **(structure or {"kinship": data.kinship}), value=0.5, control_variate=variate
        )
        if oracle:  # each group's true rho, kept fixed
            truth = torch.as_tensor(data.truth["rho"], dtype=torch.float64).expand(objective.structure.parameters)
            objective.logits = torch.logit(truth.clamp(objective.eps, 1 - objective.eps))
        callbacks = [] if oracle else [DependenceUpdate(objective, flow, data.train, every=args.update_every)]
        history = fit(flow, objective, with_indices(data.train), callbacks=callbacks, **settings)
    seconds = time.process_time() - start
    info = {"cpu_seconds": seconds, "best_step": history.best_step, "best_val": history.best_val_loss}
    return flow, objective, info


def parameter_fit(data, objective: DependentMaximumLikelihood) -> dict:
    """The recovered lambda or rho against the truth (per-group rho: errors over groups of two or more)."""
    truth = data.truth.get("rho", data.truth.get("lam"))
    values = objective.values
    if values.numel() == 1:
        estimate = float(values[0])
        if isinstance(truth, list):  # one rho for groups that each have their own: the point-weighted truth
            sizes = objective.structure.sizes.numpy()
            truth = float((np.asarray(truth) * sizes).sum() / sizes.sum())
        return {"estimate": estimate, "truth": truth}
    structure = objective.structure
    sizes = structure.sizes.numpy()
    rho = structure.group_rho(values).numpy()
    keep = sizes > 1
    error = np.abs(rho - np.asarray(truth))[keep]
    return {
        "groups": int(keep.sum()),
        "mae": float(error.mean()),
        "mae_size_weighted": float((error * sizes[keep]).sum() / sizes[keep].sum()),
        "mae_groups_of_100_or_more": float(error[sizes[keep] >= 100].mean()) if (sizes >= 100).any() else None,
    }


def estimator_noise(data, batches: int = 200, batch_size: int = 256, seed: int = 0) -> dict:
    """SD of the mini-batch loss at the true rho's on exact latents (identity flow): the estimator's own noise.

    Latents drawn afresh from the set's Sigma with its true per-group rho; the same batches give the
    i.i.d. loss's SD (its points' log N(z; 0, I)) for comparison.
    """
    g = torch.Generator().manual_seed(seed)
    objective = DependentMaximumLikelihood(groups=data.groups, rho="group")
    truth = torch.as_tensor(data.truth["rho"], dtype=torch.float64).expand(objective.structure.parameters)
    objective.logits = torch.logit(truth.clamp(objective.eps, 1 - objective.eps))
    rho = objective.structure.group_rho(objective.values)[data.groups, None]
    groups = int(data.groups.max()) + 1
    shared = torch.randn(groups, 2, generator=g, dtype=torch.float64)[data.groups]
    z = rho.sqrt() * shared + (1 - rho).sqrt() * torch.randn(len(data.groups), 2, generator=g, dtype=torch.float64)
    dependent, iid = [], []
    for _ in range(batches):
        index = torch.randperm(objective.n, generator=g)[:batch_size]
        dependent.append(float(objective.point_terms(z[index], index).mean()))
        iid.append(float((-0.5 * z[index].square().sum(1) - math.log(2 * math.pi)).mean()))
    full = float(objective.latent_log_likelihood(z)) / objective.n
    return {"full": full, "dependent_sd": float(np.std(dependent, ddof=1)), "iid_sd": float(np.std(iid, ddof=1))}


def summarise(runs: list[dict], models: list[str]) -> dict:
    summary: dict = {}
    for model in models:
        summary[f"{model}_nll"] = float(np.mean([r["nll"][model] for r in runs]))
    for model in models:
        if model == "iid" or "iid" not in models:
            continue
        gains = np.array([r["gain"][model]["mean"] for r in runs])
        se = float(gains.std(ddof=1) / math.sqrt(len(gains))) if len(gains) > 1 else float("nan")
        summary[f"gain_{model}"] = {
            "mean": float(gains.mean()),
            "se_seeds": se,
            "over_se_seeds": float(gains.mean() / se) if se > 0 else float("nan"),
            "min_over_se_points": float(min(r["gain"][model]["mean"] / r["gain"][model]["se_points"] for r in runs)),
            "per_seed": gains.tolist(),
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", nargs="+", default=["equi", "rm", "stocks"], choices=["equi", "rm", "stocks"])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--update-every", type=int, default=100)
    parser.add_argument("--val-every", type=int, default=50)
    parser.add_argument("--equi-n", type=int, default=10000, help="training points of equi (the paper's 10000)")
    parser.add_argument("--equi-rho", type=float, nargs="+", default=[0.5, 0.99], help="one rho, or a range per group")
    parser.add_argument("--equi-max-group", type=int, default=1000, help="the largest group of equi (the paper's 1000)")
    parser.add_argument("--models", nargs="+", help="train only these models (e.g. iid); gains need iid and another")
    parser.add_argument("--control-variate", action="store_true", help="the dependent objectives' control variate")
    parser.add_argument("--noise", action="store_true", help="equi only: the mini-batch loss's SD at the truth")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 seed, 60 steps, small sets")
    parser.add_argument("--out", type=Path, default=RESULTS / "dependent.json")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.steps, args.update_every, args.val_every = 1, 60, 20, 20
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    results: dict = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "clock": "process CPU time",
        "threads": torch.get_num_threads(),
    }
    if args.noise:
        noise = [estimator_noise(load("equi", seed, args), seed=seed) for seed in range(args.seeds)]
        design = {"equi_n": args.equi_n, "equi_rho": args.equi_rho, "max_group": args.equi_max_group}
        print(json.dumps({**design, "noise": noise}))
        return
    for name in args.sets:
        available = {**MODELS.get(name, DEFAULT_MODELS), **EXTRA_MODELS.get(name, {})}
        chosen = args.models or list(MODELS.get(name, DEFAULT_MODELS))
        models = {m: t for m, t in available.items() if m in chosen}
        runs = []
        for seed in range(args.seeds):
            data = load(name, seed, args)
            run: dict = {"seed": seed, "n_train": len(data.train), "n_val": len(data.val), "n_test": len(data.test)}
            nll, run["nll"], run["nll_se"], run["train"], run["parameters"] = {}, {}, {}, {}, {}
            joint = {}
            for model, tying in models.items():
                flow, objective, info = train(data, tying, seed, args)
                points = -log_prob_batched(flow, data.test).double()
                nll[model] = points
                run["nll"][model] = float(points.mean())
                run["nll_se"][model] = float(points.std() / math.sqrt(len(points)))
                run["train"][model] = info
                if objective is not None:
                    run["parameters"][model] = parameter_fit(data, objective)
                if data.test_groups is not None:
                    with torch.no_grad():
                        if objective is None:
                            joint[model] = float(points.mean())
                        else:
                            held = objective.held_out(groups=data.test_groups)
                            joint[model] = -float(held.log_likelihood(flow, data.test.to(torch.float32))) / len(points)
            run["gain"] = {}
            for model in models:
                if model != "iid" and "iid" in models:
                    gain = nll["iid"] - nll[model]
                    se = float(gain.std() / math.sqrt(len(gain)))
                    run["gain"][model] = {"mean": float(gain.mean()), "se_points": se}
            if joint:
                run["joint_test_nll"] = joint
            runs.append(run)
            print(name, json.dumps(run), flush=True)
        summary = summarise(runs, list(models))
        if runs[0].get("joint_test_nll"):
            summary["joint_test_nll"] = {m: float(np.mean([r["joint_test_nll"][m] for r in runs])) for m in models}
        results[name] = {"runs": runs, "summary": summary}
        print(name, "summary", json.dumps(summary), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")  # after each set: a partial run keeps its sets
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
