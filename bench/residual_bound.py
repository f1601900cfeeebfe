"""Residual flows: does each library keep its Lipschitz bound, and does its 2-D density integrate to one?

A residual block `x + g(x)` is invertible, and its log-det series converges, only while `Lip(g) < 1`;
both libraries promise it by spectral normalisation with the bound `coefficient` (0.97). This script
trains flowkit's `ResidualFlow` and normflows' residual flow (`peers.py`, `normflows-residual`) the way
`bench/families.py` does (same data, `fit`, steps, seed), then reports for each

- the largest spectral norm of a linear layer of the trained model, as it is evaluated (exact
  singular values of the weights it uses);
- the mass of its density on a grid over the mean +- `--limit` standard deviations of the data
  (a normalised density gives 1 minus the tails; a non-invertible map gives more);
- its test NLL (nats).

    python bench/residual_bound.py --dataset moons --steps 1000 --threads 1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import likelihood
import torch

import flowkit
from flowkit.cli import bench
from flowkit.data import evaluate_nll, training_data
from flowkit.train import MaximumLikelihood, fit

#: The models compared: flowkit's preset and its normflows peer.
MODELS = ("flowkit-residual", "normflows-residual")


def layer_norms(flow: torch.nn.Module) -> list[float]:
    """Exact spectral norms of the weights each linear layer of a residual block uses (eval mode)."""
    norms = []
    for module in flow.modules():
        if isinstance(module, flowkit.bijectors.Residual):
            norms += module.spectral_norms().tolist()
        elif type(module).__name__ == "InducedNormLinear":  # normflows: the weight its forward uses
            weight = module.compute_weight(update=False).detach()
            norms.append(torch.linalg.matrix_norm(weight, ord=2).item())
    return norms


def grid_mass(flow: torch.nn.Module, data: torch.Tensor, limit: float, points: int) -> float:
    """Riemann sum of the density over the box mean +- `limit` standard deviations, `points` per axis."""
    mean, std = data.double().mean(0), data.double().std(0)
    axes = [torch.linspace(float(m - limit * s), float(m + limit * s), points) for m, s in zip(mean, std, strict=True)]
    grid = torch.cartesian_prod(*axes).float()
    cell = float((axes[0][1] - axes[0][0]) * (axes[1][1] - axes[1][0]))
    log_p = torch.cat([flow.log_prob(chunk).detach() for chunk in grid.split(10_000)])
    return float(log_p.double().exp().sum() * cell)


def main(argv: list[str] | None = None) -> int:
    """Train each model, print and write (JSON) its largest layer norm, grid mass and test NLL."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="moons", help="a built-in 2-D set (default moons)")
    parser.add_argument("--steps", type=int, default=1000, help="optimisation steps (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    parser.add_argument("--lr", type=float, default=1e-3, help="initial learning rate (default 1e-3)")
    parser.add_argument("--batch-size", type=int, default=256, help="batch size (default 256)")
    parser.add_argument("--n-train", type=int, default=20000, help="training points (default 20000)")
    parser.add_argument("--limit", type=float, default=6.0, help="half-width of the grid in standard deviations")
    parser.add_argument("--points", type=int, default=300, help="grid points per axis (default 300)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--out", default="bench/results/residual_bound.json", help="JSON output")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = bench._load(args.dataset, None, args.n_train)
    rows = []
    for name in MODELS:
        torch.manual_seed(args.seed)
        flow = likelihood.MODELS[name](2, transforms=None, hidden=None, bins=8, standardize_with=data.train)
        fit(
            flow,
            MaximumLikelihood(),
            training_data(data),
            steps=args.steps,
            batch_size=args.batch_size,
            lr=args.lr,
            val_data=data.val,
            restore_best=True,
            progress=False,
            seed=args.seed,
            threads=args.threads,
        )
        flow.eval()
        norms = layer_norms(flow)
        row = {
            "model": name,
            "max_layer_norm": max(norms),
            "layers_above_bound": sum(n > 0.97 * (1 + 1e-4) for n in norms),
            "layers": len(norms),
            "grid_mass": grid_mass(flow, data.train, args.limit, args.points),
            "test_nll": evaluate_nll(flow, data.test).mean,
        }
        rows.append(row)
        print(
            f"{name}: largest layer norm {row['max_layer_norm']:.3f} (bound 0.97; {row['layers_above_bound']} of "
            f"{row['layers']} layers above it), density mass on the grid {row['grid_mass']:.4f}, "
            f"test NLL {row['test_nll']:.4f}",
            flush=True,
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": vars(args), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
