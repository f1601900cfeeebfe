"""Label learning flows against majority vote and snorkel's LabelModel on the digits weak-signal task.

`digits_weak_signals` (the binary task "digit >= 5", weak signals from logistic regressions on random pixel
subsets fitted to 20 labelled images) with its estimated error bounds and with the oracle ones (each signal's
true error). For each seed: accuracy on the unlabelled training images of the signals' majority vote, of
snorkel's `LabelModel` (cardinality 2, on the signals' votes; the `bench` extra, skipped when missing) and of a
`LabelLearningFlow` fitted with `LabelLearningObjective` by `fit`, with its final constraint penalties.

    python bench/weak_supervision.py --seeds 3 --steps 800 --threads 1

(the defaults; a few minutes per seed on a busy machine). Markdown table; JSON with `--out`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np
import torch

from flowkit.applications.weak_supervision import (
    LabelLearningFlow,
    LabelLearningObjective,
    constraint_penalties,
    digits_weak_signals,
    majority_vote,
)
from flowkit.train import fit


def snorkel_accuracy(signals: torch.Tensor, labels: torch.Tensor, seed: int) -> float | None:
    try:
        from snorkel.labeling.model import LabelModel
    except ImportError:
        return None
    votes = (signals > 0.5).long().numpy()
    model = LabelModel(cardinality=2, verbose=False)
    model.fit(votes, n_epochs=500, seed=seed, progress_bar=False)
    return float((model.predict(votes, tie_break_policy="random") == labels.numpy()).mean())


def one_run(seed: int, oracle: bool, args: argparse.Namespace) -> dict[str, Any]:
    start = time.perf_counter()
    task = digits_weak_signals(seed=seed, oracle_bounds=oracle)
    torch.manual_seed(seed)
    flow = LabelLearningFlow(task.features.shape[1])
    objective = LabelLearningObjective(task.bounds, weight=args.weight)
    rows = torch.cat([task.features, task.signals], 1)
    fit(flow, objective, rows, steps=args.steps, batch_size=256, lr=1e-3, progress=False, seed=seed)
    with torch.no_grad():
        y = flow.sample((1,), context=task.features)[0]
        penalties = {k: float(v) for k, v in constraint_penalties(y, task.signals, task.bounds).items()}
    predicted = (flow.predict_proba(task.features) > 0.5).long()
    return {
        "seed": seed,
        "bounds": "oracle" if oracle else "estimated",
        "majority_vote": float((majority_vote(task.signals) == task.labels).float().mean()),
        "snorkel": snorkel_accuracy(task.signals, task.labels, seed),
        "llf": float((predicted == task.labels).float().mean()),
        "penalties": penalties,
        "seconds": time.perf_counter() - start,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--weight", type=float, default=10.0, help="weight of the penalties")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    runs = [one_run(seed, oracle, args) for oracle in (False, True) for seed in range(args.seeds)]
    if any(r["snorkel"] is None for r in runs):
        print("snorkel is not installed (pip install snorkel, or the bench extra): its column is empty")
    print("| bounds | seed | majority vote | snorkel LabelModel | LLF | LLF penalties (simplex, bounds) |")
    print("|---|---|---|---|---|---|")
    for r in runs:
        snorkel = "-" if r["snorkel"] is None else f"{r['snorkel']:.3f}"
        p = r["penalties"]
        print(
            f"| {r['bounds']} | {r['seed']} | {r['majority_vote']:.3f} | {snorkel} | {r['llf']:.3f} | "
            f"{p['simplex']:.4f}, {p['error_bounds']:.4f} |"
        )
    for kind in ("estimated", "oracle"):
        rows = [r for r in runs if r["bounds"] == kind]
        mean = {
            k: float(np.mean([r[k] for r in rows if r[k] is not None] or [np.nan]))
            for k in ("majority_vote", "snorkel", "llf")
        }
        print(f"| {kind} | mean | {mean['majority_vote']:.3f} | {mean['snorkel']:.3f} | {mean['llf']:.3f} | |")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"threads": args.threads, "args": vars(args), "runs": runs}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
