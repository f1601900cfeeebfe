"""Smooth normalizing flows: the SmoothMixture transformer's cost and accuracy, and training with forces.

Three parts, each written to ``bench/results/smooth.json``:

1. ``cost``: time of the elementwise forward and inverse (and forward + backward) of
   ``SmoothMixture(K)`` against ``RationalQuadraticSpline(K)`` on ``N`` elements with
   random parameters, float32 and float64, one thread; the median over repeats.
2. ``iterations``: the worst round-trip error ``|f^{-1}(f(x)) - x|`` (as a fraction of the
   interval, scaled by ``min(1, f'(x))`` in float32, where the output's own rounding
   dominates) per number of bisection steps and Newton steps after a 4-cell grid, with
   its time, and the fastest setting that reaches each tolerance (1e-5, 1e-8, 1e-12).
3. ``training``: on ``TorusDoubleWell``, a flow of circular ``SmoothMixture`` couplings
   (periodic tanh conditioners, uniform base) trained on ``--n-data`` exact samples by NLL
   alone and by NLL plus force matching (``ForceMatching(target, w_force)``), with the
   same NLL weight, steps, batches and seed (equal NLL budget). Reported on held-out
   samples: the force error ``mean |grad log q - F|^2`` (and relative to
   ``mean |F|^2``), the test NLL, ``KL(p || q)`` on a 128 x 128 grid, and the Kish ESS of
   ``--ess-samples`` importance-sampled flow samples. Target: the force error at least
   2x lower with forces, and a KL no worse.

Run: ``python bench/smooth.py`` (all parts; ``--parts cost,iterations`` for a subset,
``--steps``/``--seeds`` to shrink the training run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import flowkit
from flowkit.bijectors import Chain, Coupling
from flowkit.distributions import RigidBase
from flowkit.nn import MLP
from flowkit.sampling import ess
from flowkit.targets import TorusDoubleWell
from flowkit.targets.torus import torus_grid
from flowkit.train import ForceMatching, MaximumLikelihood, fit
from flowkit.train.force_matching import model_forces
from flowkit.transformers import RationalQuadraticSpline, SmoothMixture

RESULTS = Path(__file__).resolve().parent / "results" / "smooth.json"


def _median_time(fn, repeats: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_cost(n: int, components: int, repeats: int) -> list[dict]:
    rows = []
    for dtype in (torch.float32, torch.float64):
        gen = torch.Generator().manual_seed(0)
        for name, transformer in (
            ("SmoothMixture", SmoothMixture(components)),
            ("RationalQuadraticSpline", RationalQuadraticSpline(components, bound=1.0)),
        ):
            params = torch.randn(n, transformer.params_per_element, generator=gen, dtype=torch.float64).to(dtype)
            x = (0.02 + 0.96 * torch.rand(n, generator=gen, dtype=torch.float64)).to(dtype)
            if name == "RationalQuadraticSpline":
                x = 2 * x - 1
            with torch.no_grad():
                y, _ = transformer(x, params)

            def backward(transformer=transformer, x=x, params=params):
                p = params.clone().requires_grad_(True)
                out, ladj = transformer(x, p)
                (out.sum() + ladj.sum()).backward()

            with torch.no_grad():
                forward_s = _median_time(lambda t=transformer, x=x, p=params: t(x, p), repeats)
                inverse_s = _median_time(lambda t=transformer, y=y, p=params: t.inverse(y, p), repeats)
            backward_s = _median_time(backward, repeats)
            rows.append(
                {
                    "transformer": name,
                    "dtype": str(dtype).removeprefix("torch."),
                    "n": n,
                    "K": components,
                    "forward_ms": 1e3 * forward_s,
                    "inverse_ms": 1e3 * inverse_s,
                    "forward_backward_ms": 1e3 * backward_s,
                }
            )
            print(json.dumps(rows[-1]))
    smooth = {r["dtype"]: r for r in rows if r["transformer"] == "SmoothMixture"}
    spline = {r["dtype"]: r for r in rows if r["transformer"] != "SmoothMixture"}
    for dt, r in smooth.items():
        r["forward_vs_spline"] = r["forward_ms"] / spline[dt]["forward_ms"]
        r["inverse_vs_spline"] = r["inverse_ms"] / spline[dt]["inverse_ms"]
    return rows


def bench_iterations(n: int, components: int) -> dict:
    out: dict = {"grid": 4, "n": n, "K": components, "errors": [], "cheapest": {}}
    for dtype in (torch.float32, torch.float64):
        gen = torch.Generator().manual_seed(1)
        reference = SmoothMixture(components)
        params = 2 * torch.randn(n, reference.params_per_element, generator=gen, dtype=torch.float64).to(dtype)
        x = torch.rand(n, generator=gen, dtype=torch.float64).to(dtype)
        with torch.no_grad():
            y, ladj = reference(x, params)
        slope = ladj.exp().clamp(max=1) if dtype == torch.float32 else torch.ones_like(ladj)
        name = str(dtype).removeprefix("torch.")
        for bisection in (0, 2, 4, 6, 8, 10, 12, 16, 20, 24, 30):
            for newton in (0, 1, 2, 3, 4, 6):
                t = SmoothMixture(components, grid=4, bisection_steps=bisection, newton_steps=newton)
                with torch.no_grad():
                    start = time.perf_counter()
                    x_back, _ = t.inverse(y, params)
                    seconds = time.perf_counter() - start
                error = float(((x_back - x).abs() * slope).max())
                evaluations = 3 + bisection + newton  # grid values, then one map evaluation per step
                out["errors"].append(
                    {
                        "dtype": name,
                        "bisection": bisection,
                        "newton": newton,
                        "evaluations": evaluations,
                        "error": error,
                        "seconds": seconds,
                    }
                )
        for tol in (1e-5, 1e-8, 1e-12):
            ok = [r for r in out["errors"] if r["dtype"] == name and r["error"] <= tol]
            best = min(ok, key=lambda r: r["seconds"], default=None)
            bisection_only = min((r for r in ok if r["newton"] == 0), key=lambda r: r["seconds"], default=None)
            out["cheapest"][f"{name}@{tol:g}"] = {"fastest": best, "fastest_bisection_only": bisection_only}
        default = SmoothMixture(components)
        with torch.no_grad():
            x_back, _ = default.inverse(y, params)
        out[f"default_error_{name}"] = float(((x_back - x).abs() * slope).max())
    print(json.dumps(out["cheapest"], indent=1))
    return out


def torus_flow(layers: int = 4, components: int = 8, hidden: tuple[int, ...] = (64, 64)) -> flowkit.Flow:
    """Circular SmoothMixture couplings with periodic tanh conditioners over the uniform torus."""
    blocks = []
    for i in range(layers):
        t = SmoothMixture(components, circular=True)
        net = MLP(1, t.params_per_element, hidden, "tanh", periodic=True)
        blocks.append(Coupling(t, 2, parity=i % 2, conditioner=net))
    return flowkit.Flow(Chain(*blocks), RigidBase(["angle", "angle"]))


def evaluate(flow: flowkit.Flow, target: TorusDoubleWell, x_test: torch.Tensor, ess_samples: int) -> dict:
    flow.eval()
    _, forces = model_forces(flow, x_test, create_graph=False)
    reference = target.force(x_test)
    force_error = float((forces - reference).square().sum(-1).mean())
    with torch.no_grad():
        nll = float(-flow.log_prob(x_test).mean())
        points, area = torus_grid(128, dtype=x_test.dtype)
        log_p = target.log_prob(points)
        log_q = flow.log_prob(points)
        kl = float((log_p.exp() * (log_p - log_q)).sum() * area)
        mass = float(log_q.exp().sum() * area)
        x, log_q_x = flow.sample_and_log_prob((ess_samples,))
        log_w = -target.energy(x) - log_q_x
    return {
        "force_error": force_error,
        "force_error_relative": force_error / float(reference.square().sum(-1).mean()),
        "test_nll": nll,
        "test_nll_exact": -float(target.log_prob(x_test).mean()),
        "grid_kl": kl,
        "grid_mass": mass,
        "ess": float(ess(log_w)),
    }


def bench_training(args: argparse.Namespace) -> dict:
    target = TorusDoubleWell()
    runs = []
    for seed in range(args.seeds):
        gen = torch.Generator().manual_seed(1000 + seed)
        x_train = target.sample(args.n_data, generator=gen)
        x_test = target.sample(5000, generator=gen)
        for name, objective in (
            ("nll", MaximumLikelihood()),
            ("nll+forces", ForceMatching(target, w_force=args.w_force, w_nll=1.0)),
        ):
            torch.manual_seed(seed)
            flow = torus_flow(args.layers, args.components, tuple(args.hidden))
            start = time.perf_counter()
            fit(
                flow,
                objective,
                x_train,
                steps=args.steps,
                batch_size=args.batch_size,
                lr=args.lr,
                seed=seed,
                progress=False,
                schedule="cosine",
            )
            seconds = time.perf_counter() - start
            row = {
                "objective": name,
                "seed": seed,
                "train_s": seconds,
                **evaluate(flow, target, x_test, args.ess_samples),
            }
            runs.append(row)
            print(json.dumps(row))
    summary = {}
    for name in ("nll", "nll+forces"):
        rows = [r for r in runs if r["objective"] == name]
        summary[name] = {
            key: statistics.mean(r[key] for r in rows)
            for key in ("force_error", "force_error_relative", "test_nll", "grid_kl", "ess", "train_s")
        }
    base, forces = summary["nll"], summary["nll+forces"]
    per_seed = [
        (a["force_error"] / b["force_error"], b["grid_kl"] <= a["grid_kl"])
        for a, b in zip(
            [r for r in runs if r["objective"] == "nll"],
            [r for r in runs if r["objective"] == "nll+forces"],
            strict=True,
        )
    ]
    targets = {
        "force_error_ratio": base["force_error"] / forces["force_error"],
        "force_error_ratio_per_seed": [r for r, _ in per_seed],
        "kl_no_worse_per_seed": [k for _, k in per_seed],
        "met": base["force_error"] >= 2 * forces["force_error"] and forces["grid_kl"] <= base["grid_kl"],
    }
    print(json.dumps({"summary": summary, "targets": targets}, indent=1))
    return {"config": vars(args) | {"target": repr(target)}, "runs": runs, "summary": summary, "targets": targets}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="cost,iterations,training")
    parser.add_argument("--n", type=int, default=20_000, help="elements for the cost and iteration parts")
    parser.add_argument("--components", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--n-data", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--w-force", type=float, default=0.1)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    parser.add_argument("--ess-samples", type=int, default=10_000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    parts = args.parts.split(",")
    result: dict = {}
    if args.out.exists():
        result = json.loads(args.out.read_text())
    if "cost" in parts:
        result["cost"] = bench_cost(args.n, args.components, args.repeats)
    if "iterations" in parts:
        result["iterations"] = bench_iterations(args.n, args.components)
    if "training" in parts:
        result["training"] = bench_training(args)
    result["torch"] = torch.__version__
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    main()
