"""Image flows on 14x14 Fashion-MNIST: Glow against flat flows, against normflows' Glow, and EIW against Glow.

Three comparisons, all with test bits/dim (uniform dequantisation, fresh noise
at every batch, `K = 256` levels, `D = 196`; mean and two standard errors over
the test images evaluated):

* ``wall``: flowkit's Glow, a flat RealNVP and a flat coupling NSF (both on the
  196 logit-transformed pixels) each trained for the same wall-clock budget;
* ``peer``: flowkit's Glow step against normflows' Glow at the same architecture
  (`bench/peers.py:normflows_glow`, same parameter count): time per training
  step (log_prob, mean, backward, Adam step; median over interleaved rounds),
  the bytes of the distinct storages autograd saves for backward in one step
  (``torch.autograd.graph.saved_tensors_hooks``), and bits/dim after the same
  number of steps;
* ``eiw``: EIW (Glow with the reference code's learned shuffle before the split)
  against Glow (the fixed channel order at the split), same steps, 3 seeds,
  reported as mean +- 2 SE over seeds.

The machine this ran on is shared (2 cores, several jobs at once): the times are
noisy, which the interleaving and the medians reduce but do not remove.

Run: ``python bench/images.py --root DIR`` where DIR holds Fashion-MNIST's idx files
(`/usr/share/datasets/fashion-mnist` from the Debian package `dataset-fashion-mnist`,
or `apt-get download dataset-fashion-mnist && dpkg -x *.deb X`, DIR =
`X/usr/share/datasets/fashion-mnist`). Results go to ``bench/results/images.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import peers
import torch
from torch import nn

import flowkit
from flowkit.bijectors import Chain, Logit, Reshape
from flowkit.data import bits_per_dim, fashion_mnist
from flowkit.flows import EIW, NSF, Flow, Glow, RealNVP
from flowkit.utils import auxiliary_loss

SHAPE = (1, 14, 14)
DIMS = 196
LEVELS = 256


def flat(preset: Flow, alpha: float) -> Flow:
    """A vector flow on the logit of the flattened image (the same preprocessing as Glow's)."""
    return Flow(Chain(Logit(SHAPE, alpha), Reshape(SHAPE, (DIMS,)), preset.bijector), preset.base)


def _flat_alpha(args: argparse.Namespace) -> float:
    return args.alpha if args.flat_alpha is None else args.flat_alpha


def build(name: str, args: argparse.Namespace) -> nn.Module:
    hidden = (args.hidden, args.hidden)
    if name == "glow":
        return Glow(SHAPE, args.levels, args.steps_per_level, hidden, alpha=args.alpha)
    if name == "eiw":
        return EIW(SHAPE, args.levels, args.steps_per_level, hidden, alpha=args.alpha)
    if name == "realnvp":
        return flat(RealNVP(DIMS, transforms=8, hidden=(256, 256)), _flat_alpha(args))
    if name == "nsf":
        return flat(NSF(DIMS, transforms=5, bins=8, hidden=(256, 256), coupling=True), _flat_alpha(args))
    if name == "normflows-glow":
        sizes = {"levels": args.levels, "steps": args.steps_per_level, "hidden": args.hidden}
        return peers.normflows_glow(SHAPE, **sizes, alpha=args.alpha)
    raise ValueError(name)


def log_prob(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model.log_prob(x, None) if not isinstance(model, Flow) else model.log_prob(x)


class Batches:
    """Random batches of training counts, dequantised afresh."""

    def __init__(self, counts: torch.Tensor, batch: int, seed: int) -> None:
        self.counts, self.batch = counts, batch
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self) -> torch.Tensor:
        idx = torch.randint(len(self.counts), (self.batch,), generator=self.gen)
        x = self.counts[idx]
        return (x + torch.rand(x.shape, generator=self.gen)) / LEVELS


def train(model: nn.Module, batches: Batches, *, seconds: float | None = None, steps: int | None = None) -> dict:
    """Adam (lr 1e-3, gradient norm clipped at 100) for a wall-clock budget or a number of steps."""
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    done, start, skipped = 0, time.perf_counter(), 0
    while (seconds is None or time.perf_counter() - start < seconds) and (steps is None or done < steps):
        loss = -log_prob(model, batches()).mean()
        aux = auxiliary_loss(model) if isinstance(model, Flow) else None
        total = loss if aux is None else loss + aux
        opt.zero_grad(set_to_none=True)
        total.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 100.0)
        if torch.isfinite(total) and torch.isfinite(norm):
            opt.step()
        else:
            skipped += 1
        done += 1
    return {"steps": done, "seconds": round(time.perf_counter() - start, 1), "skipped": skipped}


@torch.no_grad()
def evaluate(model: nn.Module, test: torch.Tensor) -> dict:
    model.eval()
    lp = torch.cat([log_prob(model, b) for b in test.split(500)]).double()
    bpd = bits_per_dim(lp, DIMS, LEVELS)
    finite = torch.isfinite(bpd)
    bpd = bpd[finite]
    return {
        "test_bits_per_dim": float(bpd.mean()),
        "test_bits_per_dim_2se": float(2 * bpd.std() / math.sqrt(len(bpd))),
        "test_points": int(finite.sum()),
    }


def parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def saved_mib(model: nn.Module, x: torch.Tensor) -> float:
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = -log_prob(model, x).mean()
    loss.backward()
    return sum(storages.values()) / 2**20


def peer_speed(args: argparse.Namespace, batches: Batches) -> dict:
    torch.manual_seed(0)
    models = {"flowkit-glow": build("glow", args), "normflows-glow": build("normflows-glow", args)}
    x = batches()
    opts = {}
    for name, model in models.items():
        model.train()
        log_prob(model, x)  # ActNorm's data-dependent initialisation
        opts[name] = torch.optim.Adam(model.parameters(), lr=1e-3)
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            start = time.perf_counter()
            for _ in range(args.round_steps):
                loss = -log_prob(model, x).mean()
                opts[name].zero_grad(set_to_none=True)
                loss.backward()
                opts[name].step()
            times[name].append((time.perf_counter() - start) / args.round_steps * 1000)
    out = {}
    for name, model in models.items():
        out[name] = {
            "parameters": parameters(model),
            "ms_per_step_median": round(statistics.median(times[name]), 1),
            "ms_per_step_rounds": [round(t, 1) for t in times[name]],
            "saved_for_backward_mib": round(saved_mib(model, x), 2),
        }
    ratio = out["normflows-glow"]["ms_per_step_median"] / out["flowkit-glow"]["ms_per_step_median"]
    out["speedup_normflows_over_flowkit"] = round(ratio, 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=None, help="folder of Fashion-MNIST's idx files")
    parser.add_argument("--parts", default="peer,wall,eiw", help="comma-separated: peer, wall, eiw")
    parser.add_argument("--budget", type=float, default=150.0, help="seconds per model in 'wall'")
    parser.add_argument("--train-steps", type=int, default=150, help="steps per model in 'peer' and 'eiw'")
    parser.add_argument("--seeds", type=int, default=3, help="seeds in 'eiw'")
    parser.add_argument("--levels", type=int, default=2)
    parser.add_argument("--steps-per-level", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--alpha", type=float, default=0.0, help="logit squeeze of every model (default 0)")
    parser.add_argument(
        "--flat-alpha",
        type=float,
        default=None,
        help="logit squeeze of the flat RealNVP and NSF (default: --alpha); the NSF's splines act on [-5, 5] "
        "and are the identity outside, so it needs a bounded logit (0.05)",
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds in 'peer'")
    parser.add_argument("--round-steps", type=int, default=5, help="steps per timing round in 'peer'")
    parser.add_argument("--test-points", type=int, default=2000, help="test images evaluated")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "images.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    data = fashion_mnist(args.root, size=14)
    counts = torch.as_tensor(data.info["counts"], dtype=torch.float32)
    test = data.test[: args.test_points]
    parts = set(args.parts.split(","))
    results: dict = {
        "config": {**vars(args), "shape": SHAPE, "torch": torch.__version__},
        "flowkit": flowkit.__version__,
    }

    def run(name: str, seed: int, **budget: float) -> dict:
        torch.manual_seed(seed)
        model = build(name, args)
        log = train(model, Batches(counts, args.batch_size, seed), **budget)
        row = {"model": name, "seed": seed, "parameters": parameters(model), **log, **evaluate(model, test)}
        print(json.dumps(row), flush=True)
        return row

    if "peer" in parts:
        results["peer"] = peer_speed(args, Batches(counts, args.batch_size, 0))
        print(json.dumps(results["peer"]), flush=True)
        results["peer_training"] = [run(name, 0, steps=args.train_steps) for name in ("glow", "normflows-glow")]
    if "wall" in parts:
        results["wall"] = [run(name, 0, seconds=args.budget) for name in ("glow", "realnvp", "nsf")]
    if "eiw" in parts:
        rows = [run(name, seed, steps=args.train_steps) for seed in range(args.seeds) for name in ("glow", "eiw")]
        summary = {}
        for name in ("glow", "eiw"):
            values = [r["test_bits_per_dim"] for r in rows if r["model"] == name]
            se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
            summary[name] = {"mean": statistics.mean(values), "two_se": 2 * se, "values": values}
        results["eiw"] = {"runs": rows, "summary": summary}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(table(results))


def table(results: dict) -> str:
    lines = []
    if "peer" in results:
        lines += ["| model | parameters | ms/step | saved MiB |", "|---|---|---|---|"]
        for name in ("flowkit-glow", "normflows-glow"):
            r = results["peer"][name]
            lines.append(f"| {name} | {r['parameters']} | {r['ms_per_step_median']} | {r['saved_for_backward_mib']} |")
        lines.append(f"speed-up (normflows / flowkit): {results['peer']['speedup_normflows_over_flowkit']}")
    for key in ("peer_training", "wall"):
        if key in results:
            lines += ["", f"| {key} | steps | seconds | test bits/dim |", "|---|---|---|---|"]
            for r in results[key]:
                bpd = f"{r['test_bits_per_dim']:.3f} +- {r['test_bits_per_dim_2se']:.3f}"
                lines.append(f"| {r['model']} | {r['steps']} | {r['seconds']} | {bpd} |")
    if "eiw" in results:
        lines += ["", "| model | test bits/dim, mean +- 2 SE over seeds |", "|---|---|"]
        for name, s in results["eiw"]["summary"].items():
            lines.append(f"| {name} | {s['mean']:.3f} +- {s['two_se']:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
