"""FAB against reverse KL and against ML + reverse KL, from the target's energy, target evaluations counted.

Targets: FAB's GMM-40 (``GaussianMixture(40, 2)``, means in [-40, 40]^2, exact log Z = 0), the many-well
(``ManyWell(dim)``, exact log Z) and, with ``--targets alanine``, alanine dipeptide at 1000 K in vacuum
(OpenMM; no exact log Z: P(phi > 0) against flowkit's cached MD). Methods, each with the same flow, optimiser,
steps and batch size:

- ``fab``: ``flowkit.train.FAB`` (AIS towards p^2/q with ``--ais-steps`` HMC steps of 5 leapfrog steps,
  step sizes adapted, prioritised replay buffer of ``--buffer`` points, one AIS run per 4 steps);
- ``rkl``: reverse KL (``BoltzmannGenerator`` without samples, fast path gradient);
- ``ml_rkl``: ``BoltzmannGenerator`` with ``--ml-samples`` exact target samples (MD frames for alanine) for
  the maximum-likelihood term plus the reverse KL. The exact samples are counted apart (``data_samples``).

Every target is wrapped in a counter of the configurations at which its energy (or energy and force) is
evaluated: ``train_evaluations`` is what training cost, whatever the method (FAB's own count is checked
against it). Evaluation, the same for every method: ``--eval`` flow samples with their importance weights
(ESS, log Z with its standard error); for FAB also AIS towards p (alpha = 1) from the trained flow, FAB's own
estimator; for GMM-40 each mode's reweighted mass (samples assigned to the nearest mean) with its
delta-method error, and how many of the 40 are within 3 SE of 1/40 (a perfect sampler has each one in with
probability 0.997, all 40 with probability 0.90), and the modes holding any raw flow sample. The flow for the
2-D mixture is RealNVP behind a fixed ``Standardization`` of scale 40/sqrt(3) (the box of the means, the same for
every method: the base N(0, 1) would otherwise sit in one mode).

Run: ``python bench/fab.py --threads 1`` (results in ``bench/results/fab.json``; ``--summarize FILE...`` prints
the table of saved results: means over seeds, ranges in brackets). Measured figures are in ``docs/api/fab.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from flowkit import sampling
from flowkit.bijectors import Chain, Standardization
from flowkit.flows import Flow, RealNVP
from flowkit.targets import GaussianMixture, ManyWell, Target
from flowkit.train import FAB, BoltzmannGenerator, fit


class Counted(Target):
    """A target that counts the configurations at which its energy or force is evaluated."""

    _flowkit_register = False

    def __init__(self, inner: Target) -> None:
        super().__init__()
        self.inner = inner
        self.event_shape = inner.event_shape
        self.log_Z = inner.log_Z
        self.has_samples = inner.has_samples
        self.count = 0

    def _batch(self, x: torch.Tensor) -> int:
        return math.prod(x.shape[: x.dim() - len(self.event_shape)])

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        self.count += self._batch(x)
        return self.inner.energy(x)

    def force(self, x: torch.Tensor) -> torch.Tensor:
        self.count += self._batch(x)
        return self.inner.force(x)

    def energy_and_force(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.count += self._batch(x)  # one evaluation of both
        return self.inner.energy_and_force(x)

    def sample(self, n: Any, generator: torch.Generator | None = None) -> torch.Tensor:
        return self.inner.sample(n, generator)


def build(target_name: str, args: argparse.Namespace, seed: int) -> tuple[Target, Flow, Any, dict[str, Any]]:
    """The target, a fresh flow, the ML samples and FAB's settings for one target."""
    torch.manual_seed(seed)
    hidden = tuple(args.hidden)
    if target_name == "gmm":
        target = GaussianMixture(40, 2, seed=0)
        inner = RealNVP(2, transforms=args.transforms, hidden=hidden)
        scale = 40.0 / math.sqrt(3.0)
        flow = Flow(Chain(Standardization([0.0, 0.0], [scale, scale]), inner.bijector), inner.base)
        samples = target.sample(args.ml_samples, generator=torch.Generator().manual_seed(seed))
        return target, flow, samples, {"step_size": 1.0}
    if target_name == "manywell":
        target = ManyWell(args.manywell_dim)
        flow = RealNVP(args.manywell_dim, transforms=args.transforms, hidden=hidden)
        samples = target.sample(args.ml_samples, generator=torch.Generator().manual_seed(seed))
        return target, flow, samples, {"step_size": 0.3}
    if target_name == "alanine":
        from flowkit.data import alanine_dipeptide_md
        from flowkit.flows import internal_coordinate_flow
        from flowkit.targets import AlanineDipeptide
        from flowkit.targets.alanine import alanine_internal_coordinates

        target = AlanineDipeptide(1000.0)
        internal = alanine_internal_coordinates(target.minimum())
        flow = internal_coordinate_flow(internal, max(1, args.transforms // 2), hidden, seed=seed)
        md = alanine_dipeptide_md(1000.0, 1.0, 0).float()
        samples = md[torch.randperm(md.shape[0], generator=torch.Generator().manual_seed(seed))[: args.ml_samples]]
        return target, flow, samples, {"step_size": 0.002}
    raise ValueError(f"unknown target {target_name}")


def objective(method: str, target: Counted, samples: torch.Tensor, fab: dict[str, Any], args: argparse.Namespace):
    if method == "fab":
        return FAB(target, ais_steps=args.ais_steps, replay_buffer=args.buffer, **fab)
    if method == "rkl":
        return BoltzmannGenerator(target)
    if method == "ml_rkl":
        return BoltzmannGenerator(target, samples=samples)
    raise ValueError(f"unknown method {method}")


def mode_masses(target: GaussianMixture, x: torch.Tensor, log_w: torch.Tensor) -> dict[str, Any]:
    """Each mode's reweighted mass (nearest mean) and error; how many are within 3 SE of 1/K."""
    nearest = torch.cdist(x.double(), target.means.double()).argmin(-1)
    indicator = torch.nn.functional.one_hot(nearest, target.n_modes).double()
    mass, error = sampling.reweight(indicator, log_w)
    k = target.n_modes
    within = ((mass - 1.0 / k).abs() < 3 * error) & (error > 0)
    return {
        "modes_within_3se": int(within.sum()),
        "modes_with_raw_samples": int((indicator.sum(0) > 0).sum()),
        "mode_mass_min": float(mass.min()),
        "mode_mass_max": float(mass.max()),
        "mode_mass_error_max": float(error.max()),
    }


def evaluate(name: str, method: str, target: Counted, flow: Flow, obj: Any, args: argparse.Namespace):
    flow.eval()
    before = target.count
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        x, log_w = sampling.importance_sample(flow, target, args.eval)
        log_Z, log_Z_error = sampling.log_Z(log_w)
    out: dict[str, Any] = {"ess": sampling.ess(log_w), "log_Z": log_Z, "log_Z_error": log_Z_error}
    if target.log_Z is not None:
        out["log_Z_abs_error"] = abs(log_Z - target.log_Z)
    if name == "gmm":
        out.update(mode_masses(target.inner, x, log_w))
    if name == "alanine":
        from flowkit.targets.alanine import backbone_dihedrals

        phi, _ = backbone_dihedrals(x)
        p, p_error = sampling.reweight((phi > 0).double(), log_w)
        out["p_phi_positive"] = [float(p), float(p_error)]
    if method == "fab":
        result = sampling.ais(
            flow, target, args.ais_steps, args.eval_ais, alpha=1.0, step_size=obj.step_sizes, adapt=False
        )
        out["ais_log_Z"] = [result.log_Z, result.log_Z_error]
        out["ais_ess"] = result.ess
        if target.log_Z is not None:
            out["ais_log_Z_abs_error"] = abs(result.log_Z - target.log_Z)
        if name == "gmm":
            out["ais_modes"] = mode_masses(target.inner, result.samples, result.log_w)
    out["eval_evaluations"] = target.count - before
    return out


def summarize(rows: list[dict[str, Any]]) -> str:
    """A markdown table: per target and method, the mean over seeds (and the spread) of the main figures."""
    keys = [
        ("train_evaluations", "{:.3g}"),
        ("ess", "{:.3f}"),
        ("log_Z_abs_error", "{:.3f}"),
        ("ais_log_Z_abs_error", "{:.3f}"),
        ("modes_within_3se", "{:.1f}"),
        ("modes_with_raw_samples", "{:.1f}"),
        ("p_phi_positive", "{:.3f}"),
        ("train_seconds", "{:.0f}"),
    ]
    present = [(k, f) for k, f in keys if any(k in r for r in rows)]
    lines = ["| target | method | seeds | " + " | ".join(k for k, _ in present) + " |"]
    lines.append("|---" * (3 + len(present)) + "|")
    for target in dict.fromkeys(r["target"] for r in rows):
        for method in dict.fromkeys(r["method"] for r in rows if r["target"] == target):
            group = [r for r in rows if r["target"] == target and r["method"] == method]
            cells = []
            for key, form in present:
                values = [r[key][0] if isinstance(r.get(key), list) else r.get(key) for r in group]
                values = [v for v in values if v is not None]
                if not values:
                    cells.append("-")
                    continue
                mean = sum(values) / len(values)
                spread = f" ({form.format(min(values))}..{form.format(max(values))})" if len(values) > 1 else ""
                cells.append(form.format(mean) + spread)
            lines.append(f"| {target} | {method} | {len(group)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--targets", nargs="+", default=["gmm", "manywell"], choices=["gmm", "manywell", "alanine"])
    parser.add_argument("--methods", nargs="+", default=["fab", "rkl", "ml_rkl"], choices=["fab", "rkl", "ml_rkl"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--transforms", type=int, default=8)
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    parser.add_argument("--ais-steps", type=int, default=4)
    parser.add_argument("--buffer", type=int, default=4096, help="FAB's replay buffer (0: none)")
    parser.add_argument("--ml-samples", type=int, default=10_000)
    parser.add_argument("--manywell-dim", type=int, default=16)
    parser.add_argument("--eval", type=int, default=50_000, help="flow samples for ESS, log Z and mode masses")
    parser.add_argument("--eval-ais", type=int, default=10_000, help="FAB's AIS samples for its own log Z")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "fab.json"))
    parser.add_argument("--summarize", nargs="+", default=None, help="only print the table of these JSON results")
    args = parser.parse_args()
    if args.summarize:
        print(summarize([row for path in args.summarize for row in json.loads(Path(path).read_text())["rows"]]))
        return
    args.buffer = args.buffer or None
    torch.set_num_threads(args.threads)
    rows = []
    for name in args.targets:
        for seed in args.seeds:
            for method in args.methods:  # interleaved: each seed runs every method in turn
                inner, flow, samples, fab = build(name, args, seed)
                target = Counted(inner)
                obj = objective(method, target, samples, fab, args)
                start = time.perf_counter()
                history = fit(
                    flow,
                    obj,
                    steps=args.steps,
                    batch_size=args.batch_size,
                    lr=args.lr,
                    progress=False,
                    seed=seed,
                )
                seconds = time.perf_counter() - start
                row = {
                    "target": name,
                    "method": method,
                    "seed": seed,
                    "train_seconds": round(seconds, 1),
                    "skipped_steps": len(history.skipped),
                    "train_evaluations": target.count,
                    "data_samples": samples.shape[0] if method == "ml_rkl" else 0,
                }
                if method == "fab":
                    assert obj.target_evaluations == target.count, (obj.target_evaluations, target.count)
                row.update(evaluate(name, method, target, flow, obj, args))
                rows.append(row)
                print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": vars(args), "rows": rows}, indent=2))
    print(summarize(rows))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
