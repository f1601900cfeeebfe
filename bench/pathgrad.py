"""Time per training step of the reverse-KL gradient estimators: fast path, standard path, reparameterised.

For each flow (RealNVP with affine couplings, NSF with rational-quadratic
spline couplings) and dimension D, a flow of ``transforms`` coupling layers
with ``hidden`` conditioners is trained against the many-well target of
dimension D (the 2-D double well at D = 2). One step is: draw z from the base,
the estimator's loss, backward, one Adam step. The estimators are
interleaved within each repeat (machine-speed drifts hit them alike) on the
same z, and the median step time over repeats is reported, with the ratios
fast/standard (the speed-up of Vaitl et al.'s recursion), fast/reparam (the
overhead of a path gradient; issue 33's goal <= 1.3) and fast/dropin (issue
33's goal <= 0.6).

The last two columns are the same two ratios in the FLOPs of the step's matrix
products, counted by torch's profiler (``matmul_work``): the floor of the time
ratios for these algorithms, whatever their implementation, since the products
dominate a step's arithmetic.

Two sticking-the-landing baselines are timed:

- ``standard``: flowkit's ``PathGradientVI(target, "standard")``, which keeps
  the sampling pass's graph and adds one normalizing pass at the detached
  sample (two passes through the flow);
- ``dropin``: the reference's drop-in estimator (Vaitl et al. 2024, Alg. 2;
  ``DropInPathQP`` in lenz3000/unified-path-gradients): sample without a
  graph, the score by a normalizing pass, then sample again with a graph
  (three passes). It is defined here, not in the library; before timing, the
  script checks in float64 that its gradient equals the fast estimator's.

Run: ``python bench/pathgrad.py`` (D = 2, 32, 64; 6 couplings of 2 x 128;
batch 256; 1 thread). Results go to ``bench/results/pathgrad.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import flowkit
from flowkit.targets import ManyWell
from flowkit.train import PathGradientVI

ESTIMATORS = ("fast", "standard", "reparam")
TIMED = (*ESTIMATORS, "dropin")


class DropInPathGradient(PathGradientVI):
    """The reference's drop-in sticking-the-landing estimator (Vaitl et al. 2024, Alg. 2), for timing only."""

    def __init__(self, target) -> None:
        super().__init__(target, "standard")

    def loss(self, flow, z):
        with torch.no_grad():
            x0 = flow.bijector.inverse(z)[0]
        leaf = x0.clone().requires_grad_(True)
        neg_log_w = flow.log_prob(leaf) + self.target.energy(leaf)
        (direction,) = torch.autograd.grad(neg_log_w.sum(), leaf)
        x = flow.bijector.inverse(z)[0]
        t = (x * direction).sum() / z.shape[0]
        return neg_log_w.detach().mean() + t - t.detach()


def check_dropin(kind: str, dim: int, args: argparse.Namespace) -> float:
    """Largest relative difference between the drop-in and fast gradients on one float64 batch."""
    torch.manual_seed(1)
    flow = build(kind, dim, args.transforms, (32,)).double()
    for p in flow.parameters():  # move off the identity initialisation
        p.data.add_(0.05 * torch.randn_like(p))
    target = ManyWell(dim).double()
    z = flow.base.sample((16,))
    grads = []
    for objective in (PathGradientVI(target, "fast"), DropInPathGradient(target)):
        flow.zero_grad()
        objective.loss(flow, z).backward()
        grads.append(torch.cat([p.grad.flatten() for p in flow.parameters()]))
    return float((grads[0] - grads[1]).abs().max() / grads[0].abs().max())


def build(kind: str, dim: int, transforms: int, hidden: tuple[int, ...]) -> flowkit.Flow:
    if kind == "realnvp":
        return flowkit.flows.RealNVP(dim, transforms=transforms, hidden=hidden)
    return flowkit.flows.NSF(dim, transforms=transforms, hidden=hidden, coupling=True)


def training_setup(kind: str, dim: int, args: argparse.Namespace) -> tuple[flowkit.Flow, dict, torch.optim.Optimizer]:
    """The seeded flow, every timed estimator against the many-well target of dimension `dim`, and Adam."""
    torch.manual_seed(0)
    flow = build(kind, dim, args.transforms, tuple(args.hidden))
    target = ManyWell(dim)
    objectives = {name: PathGradientVI(target, name) for name in ESTIMATORS}
    objectives["dropin"] = DropInPathGradient(target)
    return flow, objectives, torch.optim.Adam(flow.parameters(), lr=1e-4)


def time_steps(kind: str, dim: int, args: argparse.Namespace) -> dict[str, float]:
    flow, objectives, optimizer = training_setup(kind, dim, args)
    times: dict[str, list[float]] = {name: [] for name in TIMED}
    for repeat in range(args.warmup + args.repeats):
        z = flow.base.sample((args.batch_size,))
        for name in TIMED:
            start = time.perf_counter()
            for _ in range(args.steps):
                optimizer.zero_grad(set_to_none=True)
                objectives[name].loss(flow, z).backward()
                optimizer.step()
            if repeat >= args.warmup:
                times[name].append((time.perf_counter() - start) / args.steps)
    return {name: statistics.median(values) for name, values in times.items()}


def matmul_work(kind: str, dim: int, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Matrix products of one training step of each estimator: their number and GFLOP (torch's profiler).

    Also the step's number of aten operator calls (nested ones included), whose ratios the time ratios
    approach where dispatch, not arithmetic, dominates (small layers, fast cores).

    The products dominate a step's arithmetic, so their FLOP ratios are the floor of the time ratios that
    no implementation of an estimator's algorithm goes below (elementwise work and the Adam step, alike or
    similar for all, only dilute them). The fast estimator adds, to the reparameterised step, one
    vector-Jacobian product of each conditioner (about one more conditioner forward pass in FLOPs); the
    drop-in one adds a normalizing pass and its backward to the points, and a sampling pass without graph.
    """
    from torch.profiler import profile

    flow, objectives, optimizer = training_setup(kind, dim, args)
    z = flow.base.sample((args.batch_size,))
    work = {}
    for name in TIMED:

        def step(name=name):
            optimizer.zero_grad(set_to_none=True)
            objectives[name].loss(flow, z).backward()
            optimizer.step()

        step()
        with profile(with_flops=True) as prof:
            step()
        events = prof.events()
        products = [e for e in events if e.name in ("aten::mm", "aten::addmm", "aten::bmm")]
        work[name] = {
            "matmuls": len(products),
            "gflop": sum(e.flops or 0 for e in products) / 1e9,
            "aten_calls": sum(e.name.startswith("aten::") for e in events),  # nested calls included
        }
    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[2, 32, 64])
    parser.add_argument("--flows", nargs="+", default=["realnvp", "nsf"], choices=["realnvp", "nsf"])
    parser.add_argument("--transforms", type=int, default=6)
    parser.add_argument("--hidden", type=int, nargs="+", default=[128, 128])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5, help="steps per timing")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "pathgrad.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    flowkit.set_validation(False)

    rows = []
    header = ("fast ms", "standard ms", "reparam ms", "dropin ms", "fast/std", "fast/rep", "fast/dropin", "dropin=fast")
    header += ("flop f/rep", "flop f/drop")
    print(f"{'flow':8s} {'D':>4s} " + " ".join(f"{h:>11s}" for h in header))
    for kind in args.flows:
        for dim in args.dims:
            agreement = check_dropin(kind, dim, args)
            t = time_steps(kind, dim, args)
            work = matmul_work(kind, dim, args)
            floor = {other: work["fast"]["gflop"] / work[other]["gflop"] for other in ("reparam", "dropin")}
            row = {
                "flow": kind,
                "dim": dim,
                **{f"{name}_ms": 1e3 * t[name] for name in TIMED},
                "fast_over_standard": t["fast"] / t["standard"],
                "fast_over_reparam": t["fast"] / t["reparam"],
                "fast_over_dropin": t["fast"] / t["dropin"],
                "dropin_vs_fast_max_rel_diff": agreement,
                "matmul_work": work,
                "matmul_flop_fast_over_reparam": floor["reparam"],
                "matmul_flop_fast_over_dropin": floor["dropin"],
            }
            rows.append(row)
            values = [row[f"{name}_ms"] for name in TIMED]
            values += [row["fast_over_standard"], row["fast_over_reparam"], row["fast_over_dropin"]]
            print(
                f"{kind:8s} {dim:4d} " + " ".join(f"{v:11.2f}" for v in values) + f" {agreement:11.1e}"
                f" {floor['reparam']:11.3f} {floor['dropin']:11.3f}",
                flush=True,
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": vars(args), "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
