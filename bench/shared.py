"""Shared conditioners (NanoFlow) against independent ones: test NLL and parameter count of coupling NSFs.

Each variant is `flowkit.flows.NSF(coupling=True, shared=...)` at the same depth and widths: `independent`
(`shared=False`), `nanoflow` (`True`: one trunk, per-step embedding, gates and output projection), `output` (the output
layer shared too) and `naive` (one conditioner for all steps, the ablation). The data are standardised with the
training set's mean and scale; the NLL is in nats on the standardised test set (lower is better), mean over seeds with
the paired standard error of the difference to `independent`.

    python bench/shared.py --dataset digits --seeds 3 --steps 1500
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch

import flowkit
from flowkit.flows import NSF
from flowkit.train import MaximumLikelihood, fit

VARIANTS = {"independent": False, "nanoflow": True, "output": "output", "naive": "naive"}


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(1)
    splits = flowkit.data.load(args.dataset, seed=0)
    mean, scale = splits.train.mean(0), splits.train.std(0).clamp_min(1e-3)
    train, val, test = ((x - mean) / scale for x in (splits.train, splits.val, splits.test))
    hidden = tuple(int(h) for h in args.hidden.split(","))
    results: dict = {"command": vars(args), "variants": {}}
    for name in args.variants.split(","):
        rows = []
        for seed in range(args.seeds):
            torch.manual_seed(seed)
            flow = NSF(train.shape[1], args.transforms, args.bins, hidden, coupling=True, shared=VARIANTS[name])
            start = time.perf_counter()
            fit(
                flow,
                MaximumLikelihood(),
                train,
                steps=args.steps,
                batch_size=256,
                lr=args.lr,
                val_data=val,
                progress=False,
                seed=seed,
                threads=1,
                restore_best=True,
                val_every=max(1, args.steps // 20),
            )
            with torch.no_grad():
                nll = float(-flow.log_prob(test).mean())
            rows.append({"seed": seed, "nll": nll, "seconds": time.perf_counter() - start})
            print(f"{name} seed {seed}: test NLL {nll:.3f} ({rows[-1]['seconds']:.0f} s)", flush=True)
        params = sum(p.numel() for p in flow.parameters())
        results["variants"][name] = {"parameters": params, "runs": rows}
    base = [r["nll"] for r in results["variants"].get("independent", {"runs": []})["runs"]]
    for name, entry in results["variants"].items():
        nlls = [r["nll"] for r in entry["runs"]]
        entry["nll"] = sum(nlls) / len(nlls)
        if base and name != "independent" and len(base) == len(nlls) > 1:
            diffs = [a - b for a, b in zip(nlls, base, strict=True)]
            mean_diff = sum(diffs) / len(diffs)
            var = sum((d - mean_diff) ** 2 for d in diffs) / (len(diffs) - 1)
            entry["vs_independent"] = {"difference": mean_diff, "paired_se": math.sqrt(var / len(diffs))}
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--transforms", type=int, default=8)
    parser.add_argument("--bins", type=int, default=8)
    parser.add_argument("--hidden", default="128,128")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--out", default=None, help="write the results as JSON to this file")
    args = parser.parse_args(argv)
    results = run(args)
    for name, entry in results["variants"].items():
        line = f"{name:12s} params {entry['parameters']:8d}  test NLL {entry['nll']:.3f}"
        if "vs_independent" in entry:
            d = entry["vs_independent"]
            line += f"  vs independent {d['difference']:+.3f} +- {d['paired_se']:.3f}"
        print(line)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()
