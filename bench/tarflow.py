"""Transformer autoregressive flows (TarFlow) against Glow, the KV cache, likelihood classifiers, latent flows.

Parts (``--parts``, comma-separated):

* ``bpd``: test bits/dim on the 8x8 digits (and 14x14 Fashion-MNIST with ``--root``) of flowkit's ``TarFlow``
  (its width chosen so that its parameter count matches Glow's), flowkit's ``Glow`` and normflows' Glow
  (``bench/peers.py``; skipped when normflows is missing), each trained for the same budget of process CPU time
  (``--budget``, ``--fashion-budget``), ``--seeds`` seeds, uniform dequantisation afresh at every batch;
* ``cache``: sampling time of one TarFlow block at 28x28 with 4x4 patches (49 patches), decoding with the
  key/value cache against recomputing the prefix at every step; interleaved rounds, median ratio;
* ``classifier``: a class-conditional TarFlow trained on the digits (labels dropped at rate 0.1) used as a
  likelihood classifier (argmax_y log p(x | y), and FlowBack's optimised soft label on a subset) against a small
  convolutional classifier trained for the same CPU time (on the digits, and on Fashion-MNIST with ``--root``);
* ``align``: FlowBack's feature alignment: TarFlow's bits/dim after the same steps with and without the
  alignment loss (teacher: the convolutional classifier of ``classifier``, trained on the same data; no
  foundation-model weights can be downloaded here);
* ``latent``: SimFlow's latent flows on the digits: fixed encoder variance (0.5) trained jointly, a learned
  variance trained jointly, and a frozen autoencoder with a post-hoc flow, scored by the Frechet distance between
  the penultimate-layer features (of the convolutional classifier trained on the digits) of samples and of test
  images. This is *not* Inception FID: a small digits classifier's features, comparable only within this table.

Run: ``python bench/tarflow.py [--root DIR]`` (DIR: Fashion-MNIST's idx files). Results go to
``bench/results/tarflow.json``, rewritten after every run.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch
from torch import nn

import flowkit
from flowkit.data import bits_per_dim, digits_images, fashion_mnist, image_labels
from flowkit.flows import Glow, LatentFlow, TarFlow
from flowkit.flows.tarflow import classify, optimize_label
from flowkit.testing import randomize
from flowkit.train import FeatureAlignment, LatentFlowLoss

try:
    import peers
except ImportError:  # run from elsewhere than bench/
    peers = None


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class Task:
    """Integer training images (with labels), dequantised test images and labels, on a device."""

    def __init__(self, name: str, splits, labels, device: str, test_points: int) -> None:
        self.name, self.levels = name, splits.levels
        self.counts = torch.as_tensor(splits.info["counts"], dtype=torch.float32, device=device)
        self.labels = labels[0].to(device)
        self.test = splits.test[:test_points].to(device)
        self.test_labels = labels[2][:test_points].to(device)
        self.shape = tuple(self.counts.shape[1:])
        self.dims = math.prod(self.shape)

    def batch(self, size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(len(self.counts), (size,), generator=gen).to(self.counts.device)
        x = self.counts[idx]
        u = torch.rand(x.shape, generator=gen).to(x.device)
        return ((x + u) / self.levels).clamp(1e-6, 1 - 1e-6), self.labels[idx]


def one_hot(labels: torch.Tensor, classes: int = 10) -> torch.Tensor:
    return nn.functional.one_hot(labels, classes).float()


def timed_training(model: nn.Module, loss_fn, task: Task, args, seconds: float | None, steps: int | None, seed: int):
    """Adam (lr ``--lr``, clip 100) for a budget of process CPU time (``seconds``) or ``steps``."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    model.train()
    start, done, skipped = time.process_time(), 0, 0
    while (seconds is None or time.process_time() - start < seconds) and (steps is None or done < steps):
        x, y = task.batch(args.batch_size, gen)
        loss = loss_fn(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), 100.0)
        if torch.isfinite(loss) and torch.isfinite(norm):
            opt.step()
        else:
            skipped += 1
        done += 1
    model.eval()
    return {"steps": done, "cpu_seconds": round(time.process_time() - start, 1), "skipped": skipped}


@torch.no_grad()
def test_bpd(model: nn.Module, task: Task, context: torch.Tensor | None = None) -> dict:
    parts = []
    for i, x in enumerate(task.test.split(500)):
        ctx = None if context is None else context[i * 500 : i * 500 + len(x)]
        lp = model.log_prob(x, ctx) if isinstance(model, flowkit.flows.Flow) else model.log_prob(x, None)
        parts.append(lp.double().cpu())
    bpd = bits_per_dim(torch.cat(parts), task.dims, task.levels)
    bpd = bpd[torch.isfinite(bpd)]
    return {"test_bits_per_dim": float(bpd.mean()), "test_bits_per_dim_2se": float(2 * bpd.std() / len(bpd) ** 0.5)}


def matched_tarflow(shape, target: int, args, **options) -> TarFlow:
    """The TarFlow of ``--blocks`` blocks of ``--layers`` layers whose width brings it closest to ``target``."""
    widths = range(8, 257, 4)

    def size(width: int) -> int:
        return count(TarFlow(shape, blocks=args.blocks, width=width, layers=args.layers))

    best = min(widths, key=lambda w: abs(size(w) - target))
    return TarFlow(shape, blocks=args.blocks, width=best, layers=args.layers, heads=4, **options)


def summarise(rows: list[dict], key: str) -> dict:
    out = {}
    for name in dict.fromkeys(r["model"] for r in rows):
        values = [r[key] for r in rows if r["model"] == name]
        se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else float("nan")
        out[name] = {"mean": statistics.mean(values), "2se_over_seeds": 2 * se, "seeds": len(values)}
    return out


def part_bpd(task: Task, seconds: float, args, results: dict, save) -> None:
    def nll(model, x, y):
        lp = model.log_prob(x) if isinstance(model, flowkit.flows.Flow) else model.log_prob(x, None)
        return -lp.mean()

    rows = results.setdefault(f"bpd_{task.name}", {"runs": []})["runs"]
    for seed in range(args.seeds):
        torch.manual_seed(seed)
        glow = Glow(task.shape, 2, 4, (args.glow_hidden,) * 2).to(args.device)
        models = {"glow": glow, "tarflow": matched_tarflow(task.shape, count(glow), args).to(args.device)}
        if peers is not None:
            try:
                hidden = args.glow_hidden
                models["normflows-glow"] = peers.normflows_glow(task.shape, levels=2, steps=4, hidden=hidden).to(
                    args.device
                )
            except ImportError as error:
                print(f"normflows missing ({error}): its Glow is skipped", flush=True)
        for name, model in models.items():
            log = timed_training(model, nll, task, args, seconds, None, seed)
            row = {"task": task.name, "model": name, "seed": seed, "parameters": count(model), **log}
            row.update(test_bpd(model, task))
            print(json.dumps(row), flush=True)
            rows.append(row)
            results[f"bpd_{task.name}"]["summary"] = summarise(rows, "test_bits_per_dim")
            save()


def part_cache(args, results: dict, save) -> None:
    torch.manual_seed(0)
    block = flowkit.bijectors.TransformerAutoregressive((1, 28, 28), patch=4, width=64, layers=2, heads=4)
    block = randomize(block, scale=0.05).to(args.device).eval()
    z = torch.randn(args.cache_batch, 1, 28, 28, device=args.device)
    times: dict[str, list[float]] = {"cache": [], "no_cache": []}
    now = time.process_time if args.device == "cpu" else time.perf_counter  # CPU time on a shared machine
    with torch.no_grad():
        block.inverse(z, cache=True)  # warm up
        for _ in range(args.rounds):
            for name, cache in (("cache", True), ("no_cache", False)):
                start = now()
                x = block.inverse(z, cache=cache)[0]
                if args.device != "cpu":
                    torch.cuda.synchronize()
                times[name].append(now() - start)
        same = float((block.inverse(z, cache=True)[0] - block.inverse(z, cache=False)[0]).abs().max())
    ratios = [b / a for a, b in zip(times["cache"], times["no_cache"], strict=True)]
    results["cache"] = {
        "image": [1, 28, 28],
        "patch": 4,
        "patches": block.patches,
        "batch": args.cache_batch,
        "clock": "process CPU time" if args.device == "cpu" else "wall time",
        "seconds_cache_median": statistics.median(times["cache"]),
        "seconds_no_cache_median": statistics.median(times["no_cache"]),
        "speedup_median_of_interleaved_ratios": statistics.median(ratios),
        "max_abs_difference": same,
        "finite": bool(torch.isfinite(x).all()),
    }
    print(json.dumps(results["cache"]), flush=True)
    save()


class ConvClassifier(nn.Module):
    """A small CNN: two 3x3 convolutions, global pooling, a hidden layer (the features), the class logits."""

    def __init__(self, channels: int = 1, width: int = 32, features: int = 64, classes: int = 10) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1),
            nn.SiLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1),
            nn.SiLU(),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
            nn.Linear(8 * width, features),
            nn.SiLU(),
        )
        self.head = nn.Linear(features, classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x - 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class Features(nn.Module):
    """A classifier's penultimate features as a module (the teacher of the alignment loss)."""

    def __init__(self, classifier: ConvClassifier) -> None:
        super().__init__()
        self.classifier = classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier.features(x)


def train_classifier(task: Task, args, seconds: float, seed: int) -> tuple[ConvClassifier, dict]:
    torch.manual_seed(seed)
    net = ConvClassifier(task.shape[0]).to(args.device)
    log = timed_training(net, lambda m, x, y: nn.functional.cross_entropy(m(x), y), task, args, seconds, None, seed)
    with torch.no_grad():
        accuracy = float((net(task.test).argmax(-1) == task.test_labels).float().mean())
    return net, {"parameters": count(net), "test_accuracy": accuracy, **log}


def part_classifier(task: Task, args, results: dict, save) -> ConvClassifier:
    rows = results.setdefault(f"classifier_{task.name}", {"runs": []})["runs"]
    net = None
    for seed in range(args.seeds):
        net, log = train_classifier(task, args, args.classifier_budget, seed)
        rows.append({"model": "cnn", "seed": seed, **log})
        print(json.dumps(rows[-1]), flush=True)
        torch.manual_seed(seed)
        flow = TarFlow(task.shape, blocks=args.blocks, width=args.classifier_width, layers=args.layers, classes=10)
        flow = flow.to(args.device)
        log = timed_training(
            flow, lambda m, x, y: -m.log_prob(x, one_hot(y)).mean(), task, args, args.classifier_budget, None, seed
        )
        accuracy = float((classify(flow, task.test) == task.test_labels).float().mean())
        subset = task.test[: args.label_points]
        soft = optimize_label(flow, subset, steps=args.label_steps, lr=0.2)
        soft_accuracy = float((soft.argmax(-1) == task.test_labels[: args.label_points]).float().mean())
        rows.append(
            {
                "model": "tarflow-classifier",
                "seed": seed,
                "parameters": count(flow),
                "test_accuracy": accuracy,
                "optimized_label_accuracy": soft_accuracy,
                "optimized_label_points": len(subset),
                **test_bpd(flow, task, one_hot(task.test_labels)),
                **log,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
        results[f"classifier_{task.name}"]["summary"] = summarise(rows, "test_accuracy")
        save()
    assert net is not None
    return net


def part_align(task: Task, teacher: ConvClassifier, args, results: dict, save) -> None:
    rows = results.setdefault(f"align_{task.name}", {"runs": []})["runs"]
    features = Features(teacher).eval()
    for seed in range(args.seeds):
        for name, weight in (("tarflow", 0.0), ("tarflow+alignment", args.align_weight)):
            torch.manual_seed(seed)
            flow = TarFlow(task.shape, blocks=args.blocks, width=args.classifier_width, layers=args.layers, features=64)
            flow = flow.to(args.device)
            objective = FeatureAlignment(features, weight=weight, block=args.blocks // 2, layer=1)
            steps = args.align_steps
            log = timed_training(flow, lambda m, x, y, o=objective: o.loss(m, x), task, args, None, steps, seed)
            row = {"model": name, "seed": seed, "weight": weight, **log, **test_bpd(flow, task)}
            rows.append(row)
            print(json.dumps(row), flush=True)
            results[f"align_{task.name}"]["summary"] = summarise(rows, "test_bits_per_dim")
            save()


def frechet(a: torch.Tensor, b: torch.Tensor) -> float:
    """Frechet distance between Gaussians fitted to two feature sets (float64, eigen-decomposed square root)."""
    a, b = a.double(), b.double()
    mu_a, mu_b = a.mean(0), b.mean(0)
    cov_a, cov_b = torch.cov(a.T), torch.cov(b.T)
    vals, vecs = torch.linalg.eigh(cov_a)
    root_a = vecs @ torch.diag(vals.clamp(min=0).sqrt()) @ vecs.T
    middle = torch.linalg.eigvalsh(root_a @ cov_b @ root_a).clamp(min=0).sqrt().sum()
    return float((mu_a - mu_b).square().sum() + cov_a.trace() + cov_b.trace() - 2 * middle)


def part_latent(task: Task, scorer: ConvClassifier, args, results: dict, save) -> None:
    rows = results.setdefault(f"latent_{task.name}", {"runs": []})["runs"]
    with torch.no_grad():
        test_features = scorer.features(task.test)
        reference = frechet(scorer.features((task.counts[: len(task.test)] + 0.5) / task.levels), test_features)
    results[f"latent_{task.name}"]["train_vs_test_reference"] = reference
    steps = args.latent_steps
    for seed in range(args.seeds):
        variants = {
            "fixed-variance-joint": (0.5, [("joint", steps)]),
            "learned-variance-joint": (None, [("joint", steps)]),
            "frozen-encoder-post-hoc-flow": (0.5, [("autoencoder", steps // 2), ("flow", steps // 2)]),
        }
        for name, (variance, stages) in variants.items():
            torch.manual_seed(seed)
            model = LatentFlow(task.shape, latent_channels=2, hidden=32, variance=variance).to(args.device)
            logs = []
            for stage, n in stages:
                objective = LatentFlowLoss(args.latent_weight, stage)
                logs.append(timed_training(model, lambda m, x, y, o=objective: o.loss(m, x), task, args, None, n, seed))
            with torch.no_grad():
                samples = model.sample(len(task.test)).clamp(0, 1)
                z, _ = model.noisy_latents(task.test)
                recon = float((model.decode(z) - task.test).square().sum((1, 2, 3)).mean())
                score = frechet(scorer.features(samples), test_features)
            row = {
                "model": name,
                "seed": seed,
                "parameters": count(model),
                "steps": sum(log["steps"] for log in logs),
                "cpu_seconds": sum(log["cpu_seconds"] for log in logs),
                "feature_frechet_distance": score,
                "test_reconstruction_sse": recon,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
            results[f"latent_{task.name}"]["summary"] = summarise(rows, "feature_frechet_distance")
            save()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="bpd,cache,classifier,align,latent")
    parser.add_argument("--root", default=None, help="folder of Fashion-MNIST's idx files (bpd and classifier)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=60.0, help="CPU seconds per model on the digits (bpd)")
    parser.add_argument("--fashion-budget", type=float, default=120.0, help="CPU seconds per model, Fashion-MNIST")
    parser.add_argument("--classifier-budget", type=float, default=60.0, help="CPU seconds per classifier")
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--glow-hidden", type=int, default=64)
    parser.add_argument("--classifier-width", type=int, default=32, help="TarFlow width in classifier and align")
    parser.add_argument("--label-points", type=int, default=100, help="test points of the label optimisation")
    parser.add_argument("--label-steps", type=int, default=30)
    parser.add_argument("--align-steps", type=int, default=300)
    parser.add_argument("--align-weight", type=float, default=0.5)
    parser.add_argument("--latent-steps", type=int, default=600)
    parser.add_argument("--latent-weight", type=float, default=0.1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--cache-batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--test-points", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "tarflow.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    parts = set(args.parts.split(","))
    results: dict = {"config": {**vars(args), "torch": torch.__version__}, "flowkit": flowkit.__version__}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        out.write_text(json.dumps(results, indent=2))

    digits = Task("digits", digits_images(), image_labels("digits-images"), args.device, args.test_points)
    fashion = None
    if args.root is not None:
        splits = fashion_mnist(args.root, size=14)
        labels = image_labels("fashion-mnist", args.root)
        fashion = Task("fashion-mnist-14", splits, labels, args.device, args.test_points)
    if "cache" in parts:
        part_cache(args, results, save)
    if "bpd" in parts:
        part_bpd(digits, args.budget, args, results, save)
        if fashion is not None:
            part_bpd(fashion, args.fashion_budget, args, results, save)
    teacher = None
    if "classifier" in parts:
        teacher = part_classifier(digits, args, results, save)
        if fashion is not None:
            part_classifier(fashion, args, results, save)
    if teacher is None and parts & {"align", "latent"}:
        teacher = train_classifier(digits, args, args.classifier_budget, 0)[0]
    if "align" in parts:
        part_align(digits, teacher, args, results, save)
    if "latent" in parts:
        part_latent(digits, teacher, args, results, save)
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
