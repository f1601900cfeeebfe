"""Image flows: Glow against flat flows and against normflows' Glow, EIW against Glow, on Fashion-MNIST and digits.

Four comparisons, all with test bits/dim (uniform dequantisation, fresh noise
at every batch; mean and two standard errors over the test images evaluated),
and budgets in *process CPU time* by default (``--clock cpu``: on a shared
machine, equal wall time is not equal compute):

* ``wall``: flowkit's Glow, a flat RealNVP and a flat coupling NSF (both on the
  196 logit-transformed pixels of 14x14 Fashion-MNIST) each trained for the same
  budget, ``--wall-seeds`` seeds, mean +- 2 SE over seeds. Glow and RealNVP use the
  logit with ``--alpha`` (0); the NSF's splines act on [-5, 5] and are the identity
  outside, where the logits of dark pixels fall with ``alpha = 0``, so it gets the
  bounded logit ``--nsf-alpha`` (0.05);
* ``peer``: flowkit's Glow step against normflows' Glow at the same architecture
  (`bench/peers.py:normflows_glow`, same parameter count, the same three 3x3
  convolutions per coupling): time per training step (log_prob, mean, backward,
  Adam step; median over interleaved rounds), the time of the conditioner networks
  alone (forward and backward of the eight ConvNets on inputs of their shapes, in
  the layout each library runs them), the bytes of the distinct storages autograd
  saves for backward in one step (``torch.autograd.graph.saved_tensors_hooks``),
  and bits/dim after the same number of steps;
* ``eiw``: EIW (Glow with the reference code's learned shuffle before the split)
  against Glow (the fixed channel order at the split), same steps, 3 seeds,
  reported as mean +- 2 SE over seeds;
* ``digits``: the same four models on the 8x8 digits (17 levels, D = 64) and Glow
  with a learned variational dequantiser (`Dequantized(..., VariationalDequantizer)`,
  trained on the counts; its test bits/dim are the one-sample variational bound
  on the test counts), each for ``--digits-budget`` seconds, ``--seeds`` seeds.

Run: ``python bench/images.py --root DIR`` where DIR holds Fashion-MNIST's idx files
(`/usr/share/datasets/fashion-mnist` from the Debian package `dataset-fashion-mnist`,
or `apt-get download dataset-fashion-mnist && dpkg -x *.deb X`, DIR =
`X/usr/share/datasets/fashion-mnist`). Results go to ``bench/results/images.json``
(rewritten after every run, so an interrupted run keeps what it measured).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import peers
import torch
from torch import nn

import flowkit
from flowkit.bijectors import Chain, Logit, Reshape
from flowkit.data import bits_per_dim, digits_images, fashion_mnist
from flowkit.flows import EIW, NSF, Flow, Glow, RealNVP
from flowkit.flows.images import Dequantized, VariationalDequantizer
from flowkit.nn import ConvNet
from flowkit.utils import auxiliary_loss


@dataclass
class Task:
    """A dataset: image shape, quantisation levels, training counts and test images."""

    name: str
    shape: tuple[int, int, int]
    levels: int
    counts: torch.Tensor  # integer training images (as floats)
    test: torch.Tensor  # dequantised test images in [0, 1] (a fixed draw)

    @property
    def dims(self) -> int:
        return math.prod(self.shape)

    def test_counts(self) -> torch.Tensor:
        return (self.test * self.levels).floor().clamp(0, self.levels - 1)


def clock(args: argparse.Namespace) -> Callable[[], float]:
    return time.process_time if args.clock == "cpu" else time.perf_counter


def flat(preset: Flow, shape: tuple[int, int, int], alpha: float) -> Flow:
    """A vector flow on the logit of the flattened image."""
    dims = math.prod(shape)
    return Flow(Chain(Logit(shape, alpha), Reshape(shape, (dims,)), preset.bijector), preset.base)


def build(name: str, task: Task, args: argparse.Namespace) -> nn.Module:
    shape, dims = task.shape, task.dims
    hidden = (args.hidden, args.hidden)
    flat_hidden = (args.flat_hidden, args.flat_hidden)
    if name == "glow":
        return Glow(shape, args.levels, args.steps_per_level, hidden, alpha=args.alpha)
    if name == "eiw":
        return EIW(shape, args.levels, args.steps_per_level, hidden, alpha=args.alpha)
    if name == "glow-vdeq":
        glow = Glow(shape, args.levels, args.steps_per_level, hidden, alpha=args.alpha)
        return Dequantized(glow, task.levels, VariationalDequantizer(shape, task.levels, (args.hidden // 2,) * 2))
    if name == "realnvp":
        return flat(RealNVP(dims, transforms=8, hidden=flat_hidden), shape, args.alpha)
    if name == "nsf":
        return flat(NSF(dims, transforms=5, bins=8, hidden=flat_hidden, coupling=True), shape, args.nsf_alpha)
    if name == "normflows-glow":
        sizes = {"levels": args.levels, "steps": args.steps_per_level, "hidden": args.hidden}
        return peers.normflows_glow(shape, **sizes, alpha=args.alpha)
    raise ValueError(name)


def log_prob(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model.log_prob(x) if isinstance(model, (Flow, Dequantized)) else model.log_prob(x, None)


def on_counts(model: nn.Module) -> bool:
    """Whether the model takes integer images (and its log_prob is already of the discrete data)."""
    return isinstance(model, Dequantized)


class Batches:
    """Random batches of training counts, dequantised afresh (or the counts themselves)."""

    def __init__(self, task: Task, batch: int, seed: int, dequantize: bool = True) -> None:
        self.task, self.batch, self.dequantize = task, batch, dequantize
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self) -> torch.Tensor:
        idx = torch.randint(len(self.task.counts), (self.batch,), generator=self.gen)
        x = self.task.counts[idx]
        if not self.dequantize:
            return x
        return (x + torch.rand(x.shape, generator=self.gen)) / self.task.levels


def train(
    model: nn.Module,
    batches: Batches,
    now: Callable[[], float],
    *,
    seconds: float | None = None,
    steps: int | None = None,
) -> dict:
    """Adam (lr 1e-3, gradient norm clipped at 100) for a time budget (on `now`) or a number of steps."""
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    done, start, skipped = 0, now(), 0
    while (seconds is None or now() - start < seconds) and (steps is None or done < steps):
        loss = -log_prob(model, batches()).mean()
        aux = auxiliary_loss(model) if isinstance(model, (Flow, Dequantized)) else None
        total = loss if aux is None else loss + aux
        opt.zero_grad(set_to_none=True)
        total.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 100.0)
        if torch.isfinite(total) and torch.isfinite(norm):
            opt.step()
        else:
            skipped += 1
        done += 1
    return {"steps": done, "seconds": round(now() - start, 1), "skipped": skipped}


@torch.no_grad()
def evaluate(model: nn.Module, task: Task) -> dict:
    model.eval()
    test = task.test_counts() if on_counts(model) else task.test
    lp = torch.cat([log_prob(model, b) for b in test.split(500)]).double()
    if on_counts(model):  # log P of the counts: D log K is already in
        bpd = -lp / (task.dims * math.log(2))
    else:
        bpd = bits_per_dim(lp, task.dims, task.levels)
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


def _nets(model: nn.Module, batch: int, height: int, width: int) -> Callable[[], None]:
    """Forward and backward of the model's conditioner networks alone, on inputs of their shapes.

    flowkit's run through `ConvNet.forward` (channels-last); normflows' through their own forward.
    """
    import normflows as nf

    nets = [m for m in model.modules() if isinstance(m, (ConvNet, nf.nets.ConvNet2d))]
    inputs = [torch.randn(batch, m.net[0].in_channels, height, width) for m in nets]

    def run() -> None:
        for net, x in zip(nets, inputs, strict=True):
            out = net(x.requires_grad_())
            out.backward(torch.ones_like(out))

    return run


def peer_speed(args: argparse.Namespace, task: Task, now: Callable[[], float]) -> dict:
    torch.manual_seed(0)
    models = {"flowkit-glow": build("glow", task, args), "normflows-glow": build("normflows-glow", task, args)}
    x = Batches(task, args.batch_size, 0)()
    squeezed = task.shape[1] // 2, task.shape[2] // 2  # every level of the 14x14 Glow runs on 7x7
    nets = {name: _nets(model, args.batch_size, *squeezed) for name, model in models.items()}
    opts = {}
    for name, model in models.items():
        model.train()
        log_prob(model, x)  # ActNorm's data-dependent initialisation
        opts[name] = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(name: str) -> None:
        loss = -log_prob(models[name], x).mean()
        opts[name].zero_grad(set_to_none=True)
        loss.backward()
        opts[name].step()

    times: dict[str, list[float]] = {name: [] for name in models}
    net_times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name in models:
            for work, out in ((lambda n=name: step(n), times), (nets[name], net_times)):
                start = now()
                for _ in range(args.round_steps):
                    work()
                out[name].append((now() - start) / args.round_steps * 1000)
    out = {}
    for name, model in models.items():
        out[name] = {
            "parameters": parameters(model),
            "ms_per_step_median": round(statistics.median(times[name]), 1),
            "ms_per_step_rounds": [round(t, 1) for t in times[name]],
            "conditioner_nets_ms_median": round(statistics.median(net_times[name]), 1),
            "saved_for_backward_mib": round(saved_mib(model, x), 2),
        }
    fk, nf = out["flowkit-glow"], out["normflows-glow"]
    out["speedup_normflows_over_flowkit"] = round(nf["ms_per_step_median"] / fk["ms_per_step_median"], 2)
    # If everything but flowkit's conditioner networks cost nothing, the step could be at most this much faster.
    out["speedup_bound_nets_only"] = round(nf["ms_per_step_median"] / fk["conditioner_nets_ms_median"], 2)
    out["clock"] = args.clock
    return out


def summarise(rows: list[dict], names: tuple[str, ...]) -> dict:
    summary = {}
    for name in names:
        values = [r["test_bits_per_dim"] for r in rows if r["model"] == name]
        if not values:
            continue
        se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
        steps = [r["steps"] for r in rows if r["model"] == name]
        summary[name] = {"mean": statistics.mean(values), "two_se": 2 * se, "values": values, "steps": steps}
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=None, help="folder of Fashion-MNIST's idx files")
    parser.add_argument("--parts", default="peer,wall,eiw,digits", help="comma-separated: peer, wall, eiw, digits")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help="process CPU time or wall time")
    parser.add_argument("--budget", type=float, default=150.0, help="seconds per model in 'wall'")
    parser.add_argument("--wall-seeds", type=int, default=3, help="seeds in 'wall'")
    parser.add_argument("--wall-models", default="glow,realnvp,nsf", help="comma-separated models in 'wall'")
    parser.add_argument("--digits-budget", type=float, default=15.0, help="seconds per model in 'digits'")
    parser.add_argument("--train-steps", type=int, default=150, help="steps per model in 'peer' and 'eiw'")
    parser.add_argument("--seeds", type=int, default=3, help="seeds in 'eiw' and 'digits'")
    parser.add_argument("--levels", type=int, default=2)
    parser.add_argument("--steps-per-level", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64, help="hidden channels of Glow's conditioners")
    parser.add_argument("--flat-hidden", type=int, default=256, help="hidden units of the flat flows' MLPs")
    parser.add_argument("--alpha", type=float, default=0.0, help="logit squeeze of Glow, EIW and RealNVP")
    parser.add_argument("--nsf-alpha", type=float, default=0.05, help="logit squeeze of the flat NSF")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds in 'peer'")
    parser.add_argument("--round-steps", type=int, default=5, help="steps per timing round in 'peer'")
    parser.add_argument("--test-points", type=int, default=2000, help="test images evaluated")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "images.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    now = clock(args)
    parts = set(args.parts.split(","))
    results: dict = {
        "config": {**vars(args), "torch": torch.__version__},
        "flowkit": flowkit.__version__,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        out.write_text(json.dumps(results, indent=2))

    def run(name: str, task: Task, seed: int, **budget: float) -> dict:
        torch.manual_seed(seed)
        model = build(name, task, args)
        log = train(model, Batches(task, args.batch_size, seed, not on_counts(model)), now, **budget)
        row = {"task": task.name, "model": name, "seed": seed, "parameters": parameters(model), **log}
        row.update(evaluate(model, task))
        print(json.dumps(row), flush=True)
        return row

    def sweep(part: str, names: tuple[str, ...], task: Task, seeds: int, **budget: float) -> None:
        """Every model of `names` on `task` for each seed, in turn; the summary and the file after each run."""
        results[part] = {"runs": []}
        for seed in range(seeds):
            for name in names:
                results[part]["runs"].append(run(name, task, seed, **budget))
                results[part]["summary"] = summarise(results[part]["runs"], names)
                save()

    if parts & {"peer", "wall", "eiw"}:
        data = fashion_mnist(args.root, size=14)
        counts = torch.as_tensor(data.info["counts"], dtype=torch.float32)
        fmnist = Task("fashion-mnist-14", (1, 14, 14), 256, counts, data.test[: args.test_points])
    if "peer" in parts:
        results["peer"] = peer_speed(args, fmnist, now)
        print(json.dumps(results["peer"]), flush=True)
        results["peer_training"] = []
        for name in ("glow", "normflows-glow"):
            results["peer_training"].append(run(name, fmnist, 0, steps=args.train_steps))
            save()

    if "wall" in parts:
        sweep("wall", tuple(args.wall_models.split(",")), fmnist, args.wall_seeds, seconds=args.budget)
    if "eiw" in parts:
        sweep("eiw", ("glow", "eiw"), fmnist, args.seeds, steps=args.train_steps)
    if "digits" in parts:
        data = digits_images()
        counts = torch.as_tensor(data.info["counts"], dtype=torch.float32)
        digits = Task("digits-8x8", (1, 8, 8), data.levels, counts, data.test)
        names = ("glow", "eiw", "glow-vdeq", "realnvp", "nsf")
        sweep("digits", names, digits, args.seeds, seconds=args.digits_budget)
    save()
    print(table(results))
    return 0


def table(results: dict) -> str:
    lines = []
    if "peer" in results:
        p = results["peer"]
        lines += [
            f"| model ({p['clock']} clock) | parameters | ms/step | conditioner nets ms | saved MiB |",
            "|---|---|---|---|---|",
        ]
        for name in ("flowkit-glow", "normflows-glow"):
            r = p[name]
            lines.append(
                f"| {name} | {r['parameters']} | {r['ms_per_step_median']} | {r['conditioner_nets_ms_median']} "
                f"| {r['saved_for_backward_mib']} |"
            )
        lines.append(
            f"speed-up (normflows / flowkit): {p['speedup_normflows_over_flowkit']}; "
            f"bound if only flowkit's nets cost time: {p['speedup_bound_nets_only']}"
        )
    if "peer_training" in results:
        lines += ["", "| peer_training | steps | seconds | test bits/dim |", "|---|---|---|---|"]
        for r in results["peer_training"]:
            bpd = f"{r['test_bits_per_dim']:.3f} +- {r['test_bits_per_dim_2se']:.3f}"
            lines.append(f"| {r['model']} | {r['steps']} | {r['seconds']} | {bpd} |")
    for key in ("wall", "eiw", "digits"):
        if key in results and results[key].get("summary"):
            lines += ["", f"| {key} | steps per seed | test bits/dim, mean +- 2 SE over seeds |", "|---|---|---|"]
            for name, s in results[key]["summary"].items():
                lines.append(f"| {name} | {s['steps']} | {s['mean']:.3f} +- {s['two_se']:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
