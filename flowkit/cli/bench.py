"""`flowkit bench likelihood`: flowkit's presets on the same data and budget, compared by test NLL.

Every model sees the same splits, the same standardisation (a fixed map
inside the model, so NLLs are in the data's units), the same optimiser (Adam,
cosine decay), batch size, step budget and seeds, and is trained by the same
[`fit`][flowkit.train.fit] loop with the best validation checkpoint restored.
Reported per dataset and model: the test NLL in nats (mean over seeds, with
two standard errors over the test points and two standard errors over the
seeds), bits/dim for dequantised images, the parameter count, and the wall
and CPU time per run. Results print as a markdown table and are written as JSON.

The models are named `flowkit-NAME` for each name of
[`PRESET_NAMES`][flowkit.flows.PRESET_NAMES]. The comparison with zuko and
nflows flows of matched size is the script `python bench/likelihood.py`,
which runs this benchmark with its peer models added to [`MODELS`][flowkit.cli.bench.MODELS].
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ..data import Splits, available_tabular, evaluate_nll, load, standardize, training_data
from ..data.toy import TOY_DATASETS, toy_splits
from ..flows import Flow
from ..flows.registry import PRESET_NAMES, PRESETS, build_flow, count_parameters, parse_hidden
from ..train import MaximumLikelihood, fit
from .arguments import add_threads, positive_float, positive_int

__all__ = [
    "MODELS",
    "DEFAULT_MODELS",
    "add_parser",
    "add_arguments",
    "flowkit_model",
    "run",
    "train_and_evaluate",
    "markdown_table",
    "paired_table",
]

Builder = Callable[..., torch.nn.Module]
"""A model builder: `(features, *, transforms, hidden, bins, standardize_with) -> module with log_prob(x)`."""


def flowkit_model(
    name: str,
    features: int,
    *,
    transforms: int | None = None,
    hidden: Sequence[int] | None = None,
    bins: int = 8,
    standardize_with: torch.Tensor | None = None,
) -> Flow:
    """The preset `name` of [`build_flow`][flowkit.flows.build_flow], standardised by `standardize_with` when given.

    The standardisation is the fixed map of [`standardize`][flowkit.data.standardize], put first in the flow.
    """
    flow = build_flow(name, features, transforms=transforms, hidden=hidden, bins=bins)
    return flow if standardize_with is None else standardize(flow, standardize_with)


MODELS: dict[str, Builder] = {f"flowkit-{name}": partial(flowkit_model, name) for name in PRESET_NAMES}
"""Model name -> builder: `flowkit-NAME` for each flowkit preset."""

DEFAULT_MODELS: tuple[str, ...] = tuple(f"flowkit-{name}" for name, preset in PRESETS.items() if preset.bench)
"""Models run by default: the presets declared `bench=True`, which this benchmark compares with zuko, nflows and
normflows. The other presets run when named with `--models`; the families have their own benchmarks against their
peers (`bench/families.py`, `bench/continuous.py`)."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `flowkit bench` and its benchmark `likelihood`."""
    parser = subparsers.add_parser("bench", help="run a benchmark", description="Run one of flowkit's benchmarks.")
    sub = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    summary = "flowkit's presets on the same data and budget, compared by test NLL"
    child = sub.add_parser(
        "likelihood", help=summary, description=f"{summary} (against zuko and nflows: bench/likelihood.py)."
    )
    add_arguments(child)
    child.set_defaults(func=run)
    return parser


def add_arguments(
    parser: argparse.ArgumentParser, models: Mapping[str, Builder] = MODELS, default: Sequence[str] = DEFAULT_MODELS
) -> argparse.ArgumentParser:
    """Add the likelihood benchmark's options to `parser`, with `models` to choose from and `default` run."""
    add = parser.add_argument
    add(
        "--datasets",
        default="moons,digits",
        help="comma-separated names; '2d' = all 2-D sets, 'tabular' = the MAF sets present under --root "
        "(default: moons,digits; the defaults take minutes, the full benchmark is "
        "--datasets 2d,digits,tabular --steps 1000 --seeds 3)",
    )
    add(
        "--models",
        default=",".join(default),
        help=f"comma-separated: {', '.join(models)} (default: {','.join(default)})",
    )
    add("--steps", type=positive_int, default=500, help="optimisation steps per run (default 500)")
    add("--batch-size", type=positive_int, default=256, help="batch size (default 256)")
    add("--lr", type=positive_float, default=1e-3, help="initial learning rate (default 1e-3)")
    add("--transforms", type=int, default=None, help="layers (default: the preset's)")
    add("--hidden", default=None, help="hidden sizes, e.g. 128,128 (default: the preset's)")
    add("--bins", type=int, default=8, help="spline bins (default 8)")
    add("--seeds", type=positive_int, default=2, help="number of seeds (0, 1, ...; default 2)")
    add("--n-train", type=positive_int, default=20000, help="training points of the 2-D sets (default 20000)")
    add("--root", default=None, help="data directory of the tabular sets (default $FLOWKIT_DATA or ./data)")
    add_threads(parser, "default 1 for data of at most 16 features")
    add("--out", default="bench/results/likelihood.json", help="JSON output file")
    return parser


Loader = Callable[[], Splits]
"""A dataset loader of the caller's (e.g. the small sets of `bench/likelihood.py`): `() -> Splits`."""


def _dataset_names(spec: str, root: str | None, groups: Mapping[str, Sequence[str]] | None = None) -> list[str]:
    names: list[str] = []
    for item in (s.strip().lower() for s in spec.split(",") if s.strip()):
        if item == "2d":
            names += list(TOY_DATASETS)
        elif item == "tabular":
            names += available_tabular(root)
        elif groups and item in groups:
            names += list(groups[item])
        else:
            names.append(item)
    return list(dict.fromkeys(names))


def _load(name: str, root: str | None, n_train: int, loaders: Mapping[str, Loader] | None = None) -> Splits:
    if loaders and name in loaders:
        return loaders[name]()
    return toy_splits(name, n_train=n_train) if name in TOY_DATASETS else load(name, root=root)


def train_and_evaluate(
    model: str,
    data: Splits,
    args: argparse.Namespace,
    seed: int,
    models: Mapping[str, Builder] = MODELS,
    objective: Any = None,
) -> dict[str, Any]:
    """Train the model called `model` (a key of `models`) with one seed on one dataset.

    `objective` is maximum likelihood unless given (a free-form flow trains by its own).

    Returns:
        Its test NLL with two standard errors, bits/dim for image data, parameter count and times.
    """
    torch.manual_seed(seed)
    hidden = parse_hidden(args.hidden) if args.hidden else None
    flow = models[model](
        data.features, transforms=args.transforms, hidden=hidden, bins=args.bins, standardize_with=data.train
    )
    train = training_data(data)
    wall, cpu = time.perf_counter(), time.process_time()
    history = fit(
        flow,
        MaximumLikelihood() if objective is None else objective,
        train,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        val_data=data.val,
        restore_best=True,
        progress=False,
        seed=seed,
        threads=getattr(args, "threads", None),
    )
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    nll = evaluate_nll(flow, data.test)
    result = {
        "dataset": data.name,
        "model": model,
        "seed": seed,
        "parameters": count_parameters(flow),
        "test_nll": nll.mean,
        "test_nll_2se": nll.two_se,
        "best_step": history.best_step,
        "skipped_steps": len(history.skipped),
        "wall_s": wall,
        "cpu_s": cpu,
    }
    if data.levels:
        result["test_bits_per_dim"] = nll.bits_per_dim(data.features, data.levels)[0]
    return result


def _finite_or_null(value: Any) -> Any:
    """`value` with every NaN or infinite float replaced by None (JSON has no NaN)."""
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_or_null(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    values = [r["test_nll"] for r in runs]
    n = len(values)
    mean = sum(values) / n
    spread = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else float("nan")
    summary = {
        "dataset": runs[0]["dataset"],
        "model": runs[0]["model"],
        "parameters": runs[0]["parameters"],
        "seeds": n,
        "test_nll": mean,
        "test_nll_2se_points": sum(r["test_nll_2se"] for r in runs) / n,
        "test_nll_2se_seeds": 2 * spread / math.sqrt(n) if n > 1 else float("nan"),
        "wall_s": sum(r["wall_s"] for r in runs) / n,
        "cpu_s": sum(r["cpu_s"] for r in runs) / n,
    }
    if "test_bits_per_dim" in runs[0]:
        summary["test_bits_per_dim"] = sum(r["test_bits_per_dim"] for r in runs) / n
    return summary


def _error(value: float) -> str:
    """A standard error for the table: "-" when there is none (one seed has no spread over seeds)."""
    return f"{value:.3f}" if math.isfinite(value) else "-"


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(int(round(seconds)), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{seconds:02d}" if minutes >= 60 else f"{minutes}:{seconds:02d}"


def markdown_table(summaries: list[dict[str, Any]], steps: int) -> str:
    """The per-model summaries of [`run`][flowkit.cli.bench.run] as a markdown table ("-": no spread with one seed)."""
    lines = [
        f"Test NLL in nats (lower is better), {steps} steps; +- 2 s.e. over test points / over seeds; time per run.",
        "",
        "| dataset | model | params | test NLL | +-2se (points) | +-2se (seeds) | bits/dim | wall s | CPU s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        bpd = f"{s['test_bits_per_dim']:.3f}" if "test_bits_per_dim" in s else ""
        lines.append(
            f"| {s['dataset']} | {s['model']} | {s['parameters']} | {s['test_nll']:.3f} "
            f"| {_error(s['test_nll_2se_points'])} | {_error(s['test_nll_2se_seeds'])} | {bpd} "
            f"| {s['wall_s']:.1f} | {s['cpu_s']:.1f} |"
        )
    return "\n".join(lines)


def paired_table(runs: list[dict[str, Any]]) -> str:
    """Each flowkit model against the best other model of each dataset, paired by seed, as a markdown table.

    The best other model is the one of lowest mean test NLL; the difference is flowkit's NLL minus
    its, seed by seed (same splits, same seed), with the standard error of the mean over seeds.
    """
    by_key: dict[tuple[str, str], dict[int, float]] = {}
    for r in runs:
        by_key.setdefault((r["dataset"], r["model"]), {})[r["seed"]] = r["test_nll"]
    datasets = list(dict.fromkeys(d for d, _ in by_key))
    lines = [
        "Paired test-NLL differences, flowkit minus the best other model (lowest mean), +- 1 s.e. over seeds;",
        "negative: flowkit better.",
        "",
        "| dataset | flowkit model | NLL | best other | NLL | difference | +-1se | diff/se |",
        "|---|---|---:|---|---:|---:|---:|---:|",
    ]
    for d in datasets:
        models = {m: v for (dd, m), v in by_key.items() if dd == d}
        others = {m: v for m, v in models.items() if not m.startswith("flowkit-")}
        if not others:
            continue
        best = min(others, key=lambda m: sum(others[m].values()) / len(others[m]))
        for m, v in models.items():
            if not m.startswith("flowkit-"):
                continue
            seeds = sorted(set(v) & set(others[best]))
            diffs = [v[s] - others[best][s] for s in seeds]
            n = len(diffs)
            mean = sum(diffs) / n
            se = math.sqrt(sum((x - mean) ** 2 for x in diffs) / (n - 1) / n) if n > 1 else float("nan")
            ratio = f"{mean / se:+.1f}" if math.isfinite(se) and se > 0 else "-"
            lines.append(
                f"| {d} | {m} | {sum(v[s] for s in seeds) / n:.3f} | {best} "
                f"| {sum(others[best][s] for s in seeds) / n:.3f} | {mean:+.3f} | {_error(se)} | {ratio} |"
            )
    return "\n".join(lines)


def run(
    args: argparse.Namespace,
    models: Mapping[str, Builder] = MODELS,
    loaders: Mapping[str, Loader] | None = None,
    groups: Mapping[str, Sequence[str]] | None = None,
) -> int:
    """Run the benchmark for parsed arguments: print the table and write the JSON; returns the exit code 0.

    Arguments:
        args: the options of [`add_arguments`][flowkit.cli.bench.add_arguments].
        models: model name -> builder; `args.models` names some of them.
        loaders: extra datasets, name -> loader, that `--datasets` may name.
        groups: extra names for groups of datasets in `--datasets` (as `2d` names the 2-D sets).

    Raises:
        ValueError: on a bad option, an unknown model or dataset, checked before the first run.
    """
    chosen = [m.strip().lower() for m in args.models.split(",") if m.strip()]
    for m in chosen:
        if m not in models:
            peer = m.split("-")[0] in ("zuko", "nflows", "normflows")
            hint = " (flows of other libraries: python bench/likelihood.py)" if peer else ""
            raise ValueError(f"unknown model {m!r}; choose from {', '.join(models)}{hint}")
    datasets = _dataset_names(args.datasets, args.root, groups)
    if not datasets:
        raise ValueError("no datasets to run (the tabular sets are absent under the data directory)")
    # Every dataset and the output directory are checked before the first (long) run.
    loaded = {name: _load(name, args.root, args.n_train, loaders) for name in datasets}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    runs: list[dict[str, Any]] = []
    summaries: list[dict[str, Any]] = []
    total, start = len(datasets) * len(chosen) * args.seeds, time.perf_counter()
    print(f"{total} runs of {args.steps} steps ({len(datasets)} datasets, {len(chosen)} models, {args.seeds} seeds)")
    for name in datasets:
        for model in chosen:
            per_seed = []
            for seed in range(args.seeds):
                result = train_and_evaluate(model, loaded[name], args, seed, models)
                done, elapsed = len(runs) + len(per_seed) + 1, time.perf_counter() - start
                eta = _duration(elapsed / done * (total - done))
                print(
                    f"  [{done}/{total}] {name} {model} seed {seed}: test NLL {result['test_nll']:.4f} "
                    f"({result['wall_s']:.1f} s; elapsed {_duration(elapsed)}, ETA {eta})",
                    flush=True,
                )
                per_seed.append(result)
            runs += per_seed
            summaries.append(_summarise(per_seed))
    print(markdown_table(summaries, args.steps))
    print()
    print(paired_table(runs))
    config = {k: v for k, v in vars(args).items() if k != "func"}
    report = {"config": config, "summary": summaries, "runs": runs}
    out.write_text(json.dumps(_finite_or_null(report), indent=1, default=str, allow_nan=False))
    print(f"wrote {out}")
    return 0
