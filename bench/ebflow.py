"""EBFlow on CPU: time per training step (ML vs SSM vs DSM vs FDSM) and digits NLL after equal wall time.

Part 1, scaling. The flow is EBFlow's fully connected model: two dense ``D x D`` layers
(``flowkit.bijectors.Linear``), each followed by a smooth leaky ReLU (alpha = 0.3), over
N(0, I). One training step (loss, backward, Adam update) at batch 100 on 2 threads, for
D = 64, 256, 784, 1536, 3072, in one run. Maximum likelihood needs log|det W| and its
gradient W^-T, O(D^3) per layer; the score-matching objectives drop those terms
(``ladj_is_constant``) and cost O(B D^2). The scaling exponent is the least-squares slope
of log(time) against log(D) over D = 256..3072.

Part 2, digits. sklearn's 8x8 digits (``flowkit.data.digits``: dequantised to [0, 1]^64,
split 1257/180/360 by a fixed permutation with seed 0), with the logit preprocessing
(``flowkit.bijectors.Logit``, alpha = 0.05) outside the model ("match after
preprocessing"), and the same two-layer model at D = 64. Each objective trains for the same
wall time (Adam, batch 100, fresh dequantisation noise per batch, EMA 0.999 of the
weights); the test NLL of the EMA weights is exact (``flowkit.train.exact_log_prob``, the
logit's log-determinant added back), in nats on [0, 1]^64 and in bits/dim of the discrete
images (``flowkit.data.bits_per_dim``). The model, chosen for the speed comparison,
is small: a full-covariance Gaussian scores 2.96 bits/dim on this split.

Run: ``python bench/ebflow.py`` (about 10 minutes on 2 cores); ``--quick`` for a smoke run.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from flowkit.bijectors import Chain, Linear, Logit, SmoothLeakyReLU
from flowkit.data import digits
from flowkit.data.digits import DIGITS_LEVELS, bits_per_dim
from flowkit.distributions import StandardNormal
from flowkit.flows import Flow
from flowkit.train import EMA, ScoreMatching, exact_log_prob

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("ml", "ssm", "dsm", "fdsm")
#: "wall": elapsed time; "cpu": CPU time of this process, which other processes on a busy
#: machine do not inflate (equal to the wall time of an idle machine with one thread).
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def dense_flow(features: int, alpha: float = 0.3) -> Flow:
    """EBFlow's FC model: Linear, smooth leaky ReLU, Linear, smooth leaky ReLU, over N(0, I)."""
    layers = Chain(
        Linear(features), SmoothLeakyReLU(features, alpha), Linear(features), SmoothLeakyReLU(features, alpha)
    )
    return Flow(layers, StandardNormal(features))


class MaximumLikelihoodLoss:
    """-mean log p(x) / D: the exact NLL, with every log|det W| and its gradient."""

    def loss(self, flow: Flow, batch: torch.Tensor) -> torch.Tensor:
        return -flow.log_prob(batch).mean() / batch.shape[-1]


def objective(method: str, sigma: float, epsilon: float):
    return MaximumLikelihoodLoss() if method == "ml" else ScoreMatching(method, sigma=sigma, epsilon=epsilon)


def time_steps(features: int, method: str, batch: int, min_time: float, min_steps: int, args) -> dict:
    """Median seconds per training step (after two warm-up steps), on the clock ``args.clock``."""
    clock = CLOCKS[args.clock]
    torch.manual_seed(0)
    flow = dense_flow(features)
    loss_fn = objective(method, args.sigma, args.epsilon)
    optimizer = torch.optim.Adam(flow.parameters(), lr=1e-4)
    x = torch.randn(batch, features)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_fn.loss(flow, x).backward()
        optimizer.step()

    for _ in range(2):
        step()
    times: list[float] = []
    start = clock()
    while len(times) < min_steps or clock() - start < min_time:
        t0 = clock()
        step()
        times.append(clock() - t0)
        if len(times) >= 200:
            break
    return {"median_s": float(np.median(times)), "min_s": float(np.min(times)), "steps": len(times)}


def slope(dims: list[int], seconds: list[float]) -> float:
    """Least-squares slope of log(seconds) against log(D)."""
    return float(np.polyfit(np.log(dims), np.log(seconds), 1)[0])


def scaling(args) -> dict:
    table: dict[str, dict[int, dict]] = {m: {} for m in METHODS}
    print(
        f"\nseconds per training step ({args.clock} clock), batch {args.batch}, "
        f"{torch.get_num_threads()} threads (median)"
    )
    print(f"{'D':>6} " + " ".join(f"{m:>10}" for m in METHODS) + "   ML/SSM  ML/DSM  ML/FDSM")
    for d in args.dims:
        for m in METHODS:
            table[m][d] = time_steps(d, m, args.batch, args.min_time, args.min_steps, args)
        t = {m: table[m][d]["median_s"] for m in METHODS}
        print(
            f"{d:>6} "
            + " ".join(f"{t[m]:>10.4f}" for m in METHODS)
            + f"   {t['ml'] / t['ssm']:6.2f}  {t['ml'] / t['dsm']:6.2f}  {t['ml'] / t['fdsm']:6.2f}",
            flush=True,
        )
    fit_dims = [d for d in args.dims if d >= 256]
    exponents: dict[str, dict[str, float]] = {}
    if len(fit_dims) > 1:
        for stat in ("median_s", "min_s"):
            exponents[stat] = {m: slope(fit_dims, [table[m][d][stat] for d in fit_dims]) for m in METHODS}
            print(
                f"scaling exponents over D = {fit_dims[0]}..{fit_dims[-1]} ({stat[:-2]} times): "
                + ", ".join(f"{m} {e:.2f}" for m, e in exponents[stat].items())
            )
    return {
        "steps": {m: {str(d): v for d, v in table[m].items()} for m in METHODS},
        "exponents": exponents,
        "fit_dims": fit_dims,
    }


def digits_nll(args) -> dict:
    data = digits(seed=0)
    counts = torch.as_tensor(np.asarray(data.info["counts"]), dtype=torch.float32)
    logit = Logit(data.features, alpha=args.logit_alpha)
    results = {}
    print(
        f"\ndigits: {args.budget:.0f} s ({args.clock} clock) of training per objective, batch {args.batch}, "
        "then exact NLL of the EMA weights"
    )
    print(f"{'method':>6} {'steps':>7} {'val nats':>10} {'test nats':>10} {'test bits/dim':>14}")
    for method in METHODS:
        torch.manual_seed(args.seed)
        flow = dense_flow(data.features)
        if method == "ml":
            loss_fn = MaximumLikelihoodLoss()
        else:
            loss_fn = ScoreMatching(method, sigma=args.sigma, epsilon=args.epsilon)
        optimizer = torch.optim.Adam(flow.parameters(), lr=args.lr)
        ema = EMA(flow, decay=args.ema)
        steps = 0
        clock = CLOCKS[args.clock]
        start = clock()
        while clock() - start < args.budget:
            idx = torch.randint(len(counts), (args.batch,))
            x = (counts[idx] + torch.rand(args.batch, data.features)) / DIGITS_LEVELS  # fresh dequantisation
            with torch.no_grad():
                y = logit.call(x)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn.loss(flow, y)
            if torch.isfinite(loss):
                loss.backward()
                optimizer.step()
                ema.update()
            steps += 1
        with ema.average():
            val = float(-exact_log_prob(flow, data.val, preprocessing=logit).mean())
            test = float(-exact_log_prob(flow, data.test, preprocessing=logit).mean())
        bpd = float(bits_per_dim(-test, data.features, DIGITS_LEVELS))
        results[method] = {"steps": steps, "val_nll": val, "test_nll": test, "test_bits_per_dim": bpd}
        print(f"{method:>6} {steps:>7} {val:>10.2f} {test:>10.2f} {bpd:>14.3f}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[64, 256, 784, 1536, 3072])
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="'cpu' (process CPU time) for a busy machine, with --threads 1",
    )
    parser.add_argument("--min-time", type=float, default=3.0, help="seconds of timed steps per (D, method)")
    parser.add_argument("--min-steps", type=int, default=3)
    parser.add_argument("--sigma", type=float, default=0.1, help="DSM noise level (logit space)")
    parser.add_argument("--epsilon", type=float, default=0.1, help="FDSM step (logit space)")
    parser.add_argument("--budget", type=float, default=60.0, help="training seconds per objective on digits")
    parser.add_argument("--lr", type=float, default=1e-4, help="Adam learning rate (EBFlow: 1e-4)")
    parser.add_argument("--ema", type=float, default=0.999)
    parser.add_argument("--logit-alpha", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-scaling", action="store_true")
    parser.add_argument("--skip-digits", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a smoke run: small D, short budgets")
    parser.add_argument("--out", type=Path, default=RESULTS / "ebflow.json")
    args = parser.parse_args()
    if args.quick:
        args.dims, args.min_time, args.budget = [64, 256, 512], 0.2, 3.0
    torch.set_num_threads(args.threads)
    # other processes on the machine distort the timings: record the load
    out = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "loadavg_at_start": list(os.getloadavg()),
        "torch": torch.__version__,
    }
    if not args.skip_scaling:
        out["scaling"] = scaling(args)
    if not args.skip_digits:
        out["digits"] = digits_nll(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
