"""`flowkit fit DATA`: fit a flow to a dataset by maximum likelihood and write the model, metrics and plots.

DATA is a built-in name (`moons`, `digits`, `power`, ...) or a CSV/TSV/NPY
file. The output directory receives `model/` ([`flowkit.io.save`][flowkit.io.save]),
`metrics.json` (train/val/test NLL in nats with two standard errors, and
bits/dim for dequantised image data), `history.csv`/`history.json`,
the training checkpoint (`--resume` continues from it), and PNG plots.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from .arguments import add_threads, non_negative_float, positive_float, positive_int
from .presets import declared_presets, preset_names, presets_help

__all__ = ["add_parser", "run", "fit_dataset", "prepare_output", "OUTPUTS"]

#: What `flowkit fit` writes in its output directory (removed by `--force` before a new run).
OUTPUTS = (
    "model",
    "metrics.json",
    "history.csv",
    "history.json",
    "checkpoint.safetensors",
    "training_curves.png",
    "density.png",
    "samples.png",
    "pairwise.png",
    "marginal.png",
)

#: The trainings `--train` chooses from.
TRAININGS = ("likelihood", "flow-matching")
#: The regularisers `--regularize` names (those of the cnf preset's vector field).
REGULARIZERS = ("kinetic", "jacobian")
#: The weight of a `--regularize` regulariser given without one (RNODE's choice for tabular data).
DEFAULT_REGULARIZATION = 0.01


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the `flowkit fit` subcommand."""
    vectors, images, fitted = (preset_names(*kinds) for kinds in (("vector", "lattice"), ("image",), ("data",)))
    parser = subparsers.add_parser(
        "fit",
        help="fit a flow to data (built-in name or CSV/TSV/NPY file)",
        description="Fit a flow to a dataset by maximum likelihood; write the model, metrics.json, history and plots.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"flows on vectors (--flow NAME or --model NAME), at their default sizes [the options change them]:\n"
        f"{presets_help(vectors)}\nimage flows (--model NAME for digits-images, fashion-mnist, fashion-mnist-28; "
        f"--transforms: steps per level):\n{presets_help(images)}\nflows fitted to the training data (--model NAME; "
        f"for heavy tails, they scale the data themselves):\n{presets_help(fitted)}",
    )
    add = parser.add_argument
    add(
        "data",
        metavar="DATA",
        help="built-in dataset (moons, circles, checkerboard, 8gaussians, "
        "pinwheel, spirals, rings, digits, power, gas, hepmass, miniboone, bsds300; images for --model: "
        "digits-images, fashion-mnist, fashion-mnist-28) or a .csv/.tsv/.npy file",
    )
    add(
        "--flow", default="nsf", type=str.lower, choices=vectors, metavar="NAME", help="a flow on vectors (default nsf)"
    )
    add(
        "--model",
        default=None,
        type=str.lower,
        choices=preset_names(),
        metavar="NAME",
        help="any flow of the lists below, in place of --flow",
    )
    add(
        "--base",
        choices=("normal", "student-t"),
        default="normal",
        help="latent distribution of a --flow preset: standard normal, or Student-t with trained df (see --df)",
    )
    add("--df", type=positive_float, default=5.0, help="starting df of --base student-t (default 5)")
    add("--levels", type=positive_int, default=None, help="levels of an image flow (default: its own)")
    add("--coupling", action="store_true", help="the preset NAME-coupling of --flow NAME")
    add("--transforms", type=positive_int, default=None, help="number of layers (default: the flow's)")
    add("--hidden", default=None, help="hidden sizes, e.g. 128,128 (default: the flow's)")
    add("--bins", type=positive_int, default=None, help="spline bins (default: the flow's)")
    add(
        "--beta",
        type=float,
        default=10.0,
        help="weight of the reconstruction error of a free-form flow (--model free-form), which trains by free-form "
        "maximum likelihood (flowkit.train.FreeFormLikelihood; default 10)",
    )
    add("--steps", type=positive_int, default=2000, help="optimisation steps (default 2000)")
    add("--batch-size", type=positive_int, default=256, help="batch size (default 256)")
    add("--lr", type=positive_float, default=1e-3, help="initial learning rate, cosine-decayed (default 1e-3)")
    add("--clip", type=non_negative_float, default=5.0, help="gradient norm clip (default 5; 0 for none)")
    add(
        "--patience",
        type=positive_int,
        default=None,
        help="stop after this many validations without improvement; validations are every max(1, steps // 20) "
        "steps (at most an epoch apart), so that is patience x that many steps (the progress bar shows both)",
    )
    add("--no-standardize", action="store_true", help="do not standardise the data inside the model")
    add(
        "--robust-standardize",
        action="store_true",
        help="standardise by the median and the interquartile range (heavy tails, --base student-t)",
    )
    add(
        "--regularize",
        default=None,
        help="RNODE regularisers of a continuous flow (--model cnf) integrated along its trajectories: kinetic, "
        "jacobian or kinetic,jacobian, each with an optional weight, e.g. kinetic=0.05 (default weight 0.01)",
    )
    add(
        "--train",
        default="likelihood",
        choices=TRAININGS,
        help="likelihood (default) or flow-matching (a continuous flow only: conditional flow matching with "
        "minibatch optimal-transport pairs, no ODE solve in training; the NLLs reported are exact)",
    )
    add("--root", default=None, help="data directory of the tabular benchmarks (default $FLOWKIT_DATA or ./data)")
    add("--seed", type=int, default=0, help="seed of initialisation, data order and splits (default 0)")
    add_threads(parser, "default 1 for data of at most 16 features, else torch's; more slow small flows down")
    add("--out", default=None, help="output directory (default runs/<dataset>); an existing run is refused")
    add("--force", action="store_true", help="replace the run in --out (its model, metrics, history and plots)")
    add(
        "--resume",
        action="store_true",
        help="continue the run in --out from its checkpoint; --steps is the total number of steps, "
        "so give more steps than the run has taken to train further",
    )
    add("--no-plots", action="store_true", help="skip the PNG plots")
    add("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)
    return parser


def _regularizers(text: str | None) -> dict[str, float]:
    """`--regularize kinetic,jacobian=0.05` as the weights of a RegularizedLikelihood."""
    weights: dict[str, float] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        name, _, value = part.partition("=")
        name = name.strip().lower()
        if name not in REGULARIZERS:
            raise ValueError(f"--regularize: unknown regulariser {name!r}; choose from {', '.join(REGULARIZERS)}")
        try:
            weight = float(value) if value else DEFAULT_REGULARIZATION
        except ValueError:
            raise ValueError(f"--regularize: the weight of {name} must be a number, got {value!r}") from None
        if not (math.isfinite(weight) and weight >= 0):
            raise ValueError(f"--regularize: the weight of {name} must be finite and >= 0, got {weight}")
        weights[name] = weight
    return weights


def _objective(args: argparse.Namespace, flow: Any) -> Any:
    """The objective of `--train` and `--regularize`: maximum likelihood, RNODE-regularised for a continuous flow.

    A flow that maximum likelihood does not train (a free-form flow) trains by
    [`FreeFormLikelihood`][flowkit.train.FreeFormLikelihood] with `--beta`.
    """
    from ..bijectors.continuous import continuous_layers
    from ..train import FreeFormLikelihood, MaximumLikelihood
    from ..train.continuous import FlowMatching, RegularizedLikelihood

    regularize, training = getattr(args, "regularize", None), getattr(args, "train", "likelihood")
    if flow.free_form:
        if regularize or training != "likelihood":
            raise ValueError(f"{type(flow).__name__} trains by free-form likelihood: no --regularize or --train")
        return FreeFormLikelihood(beta=getattr(args, "beta", 10.0))
    continuous = bool(continuous_layers(flow))
    if (regularize or training == "flow-matching") and not continuous:
        raise ValueError("--regularize and --train flow-matching need a continuous flow (--model cnf)")
    if training == "flow-matching":
        if regularize:
            raise ValueError("--regularize applies to --train likelihood, not flow-matching")
        return FlowMatching("ot")
    return RegularizedLikelihood(**_regularizers(regularize)) if continuous else MaximumLikelihood()


def _preset_name(flow: str, coupling: bool) -> str:
    """The preset of `--flow NAME` with or without `--coupling` (`NAME-coupling`, for `nsf`: `nsf-coupling`)."""
    name = flow.lower()
    if not coupling or name.endswith("-coupling"):
        return name
    if f"{name}-coupling" not in declared_presets():
        raise ValueError(f"--coupling: there is no preset {name}-coupling (--flow NAME names the flow itself)")
    return f"{name}-coupling"


def fit_dataset(args: argparse.Namespace) -> dict[str, Any]:
    """Do the work of `flowkit fit` for parsed arguments; returns the metrics written to metrics.json."""
    import torch

    from .. import io
    from ..data import evaluate_nll, load, standardize, training_data
    from ..distributions import StudentT
    from ..flows import init_inducing
    from ..flows.registry import build_data_flow, build_flow, build_image_flow, count_parameters, parse_hidden
    from ..train import default_threads, fit

    if args.no_standardize and args.robust_standardize:
        raise ValueError("--robust-standardize and --no-standardize exclude each other")
    hidden = parse_hidden(args.hidden) if args.hidden else None
    data = load(args.data, root=args.root, seed=args.seed)
    threads = args.threads or default_threads(data.features)
    if threads:
        torch.set_num_threads(threads)  # small matrices: extra threads cost more than they give
    out = Path(args.out or Path("runs") / Path(data.name).stem)
    resumed_from = prepare_output(out, force=args.force, resume=args.resume, steps=args.steps)
    torch.manual_seed(args.seed)
    name = _preset_name(args.model or args.flow, args.coupling)
    declared = declared_presets()[name]
    if args.transforms is not None and not {"transforms", "steps"} & set(declared["arguments"]):
        sizes = ", ".join(f"--{size}" for size in ("hidden", "bins") if size in declared["arguments"])
        raise ValueError(f"--transforms does not apply to --model {name}: size it with {sizes}")
    kind = declared["kind"]
    vectors, images = kind in ("vector", "lattice"), "image data (digits-images, fashion-mnist, fashion-mnist-28)"
    dims = {"data": (2, "tabular data of shape (N, D)"), "image": (4, images)}.get(kind)
    if dims and data.train.dim() != dims[0]:
        raise ValueError(f"--model {name} needs {dims[1]}")
    if kind == "data":  # fitted to the training split: the tail flows and COMET scale the data themselves
        flow = build_data_flow(name, data.train, transforms=args.transforms, hidden=hidden, bins=args.bins)
    elif kind == "image":  # images in [0, 1], not standardised: the flow's logit layer preprocesses them
        flow = build_image_flow(name, data.train.shape[1:], levels=args.levels, steps=args.transforms, hidden=hidden)
    else:
        flow = build_flow(name, data.features, transforms=args.transforms, hidden=hidden, bins=args.bins)
        if getattr(args, "base", "normal") == "student-t":
            try:
                flow = flow.with_base(StudentT(flow.event_shape, df=args.df, learn_df=True))
            except ValueError as error:
                raise ValueError(f"--base student-t applies to the bijective presets: {error}") from None
        if not args.no_standardize:
            flow = standardize(flow, data.train, robust=args.robust_standardize)
        # Kernel conditioners (kernel-coupling) put their inducing points on the training data they will see.
        init_inducing(flow, data.train, generator=torch.Generator().manual_seed(args.seed))
    out.mkdir(parents=True, exist_ok=True)
    train = training_data(data)
    start = time.perf_counter()
    objective = _objective(args, flow)
    history = fit(
        flow,
        objective,
        train,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        clip=args.clip or None,
        val_data=data.val,
        patience=args.patience,
        restore_best=True,
        checkpoint_dir=out,
        resume=args.resume,
        progress=not args.no_progress,
        seed=args.seed,
        threads=torch.get_num_threads(),
    )
    seconds = time.perf_counter() - start
    flow.eval()
    io.save(flow, out / "model")
    metrics: dict[str, Any] = {
        "dataset": data.name,
        "features": data.features,
        "flow": name,
        "parameters": count_parameters(flow),
        "steps": history.steps_run,
        "resumed_from_step": resumed_from,
        "best_step": history.best_step,
        "skipped_steps": len(history.skipped),
        "train_seconds": round(seconds, 2),
        "standardized": not args.no_standardize and vectors,
        "robust_standardized": args.robust_standardize and vectors,
        "seed": args.seed,
        "objective": type(objective).__name__,
    }
    if "columns" in data.info:
        metrics["columns"] = list(data.info["columns"])
    for split in ("train", "val", "test"):
        nll = evaluate_nll(flow, getattr(data, split))
        metrics[f"{split}_nll"] = nll.mean
        metrics[f"{split}_nll_2se"] = nll.two_se
        if data.levels:
            bpd, bpd_2se = nll.bits_per_dim(data.features, data.levels)
            metrics[f"{split}_bits_per_dim"] = bpd
            metrics[f"{split}_bits_per_dim_2se"] = bpd_2se
    metrics = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    history.to_csv(out / "history.csv")
    if not args.no_plots:
        _plots(flow, history, data, out)
    return metrics


def prepare_output(
    out: Path, *, force: bool, resume: bool, steps: int, outputs: tuple[str, ...] = OUTPUTS
) -> int | None:
    """Check the output directory before a run; returns the step a resumed run continues from (None: a new run).

    A directory holding a run is refused unless `force` (its outputs are removed) or
    `resume` (its checkpoint is continued to `steps` in all). `outputs` names what the
    command writes (a run is there when one of them is; `--force` removes them).

    Raises:
        ValueError: `out` (or a folder above it) is an existing file; a run is there and neither `force` nor
            `resume` is given; `resume` without a checkpoint, or with `steps` no more than the checkpoint's step.
    """
    import shutil

    from .._validation import file_in_the_way
    from ..train.checkpoint import load_checkpoint

    if force and resume:
        raise ValueError("--force starts the run in --out again and --resume continues it; give one")
    where = file_in_the_way(out)
    if where is not None:
        raise ValueError(
            f"--out {out} {where} an existing file; --out names a directory (new or existing) for the run's "
            f"outputs ({', '.join(outputs[:2])}, ...)"
        )
    found = [name for name in outputs if (out / name).exists()]
    if resume:
        checkpoint = out / "checkpoint.safetensors"
        if not checkpoint.exists():
            raise ValueError(f"--resume: {out} holds no checkpoint.safetensors to continue from")
        done = int(load_checkpoint(checkpoint)["step"])
        if steps <= done:
            raise ValueError(
                f"--resume: the run in {out} has taken {done} steps and --steps {steps} is the total; "
                f"give more than {done} to train further"
            )
        return done
    if found and not force:
        raise ValueError(
            f"--out {out} holds a run ({', '.join(found)}); pass --force to replace it, --resume to continue "
            "it, or another --out"
        )
    for name in found:
        path = out / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return None


def _plots(flow: Any, history: Any, data: Any, out: Path) -> None:
    from .. import plot

    labels = data.info.get("columns")
    title = f"{data.name}: training curves"
    bits = (data.features, data.levels) if data.levels else None
    curves = plot.training_curves(history, smooth=25, title=title, ylabel="NLL (nats)", bits_per_dim=bits)
    figures = {"training_curves": curves}
    if data.features == 2:
        title = f"{data.name}: flow density and test data"
        figures["density"] = plot.density(flow, data.test, title=title, labels=labels)
        figures["samples"] = plot.samples_vs_data(flow, data.test, labels=labels)
    elif data.train.dim() == 4 and data.levels:
        figures["samples"] = plot.image_grid(flow.sample((64,)), title=f"{data.name}: samples")
        figures["bits_per_dim"] = plot.bits_per_dim_curve(history, data.features, data.levels, title=data.name)
    else:  # one dimension: its marginal (a histogram against the flow's); more: the pairwise marginals
        name = "marginal" if data.features == 1 else "pairwise"
        figures[name] = plot.pairwise(data.test, flow, n=1000, labels=labels)
    for name, fig in figures.items():
        fig.savefig(out / f"{name}.png", dpi=100)


def run(args: argparse.Namespace) -> int:
    """Run `flowkit fit` for parsed arguments; returns the exit code."""
    import torch

    threads = torch.get_num_threads()
    try:
        metrics = fit_dataset(args)
    finally:
        torch.set_num_threads(threads)  # matters when called in-process (tests, notebooks)

    def number(key: str) -> str:
        value = metrics.get(key)
        return "inf" if value is None else f"{value:.4f}"

    line = f"{metrics['dataset']}: test NLL {number('test_nll')} +- {number('test_nll_2se')} nats"
    if "test_bits_per_dim" in metrics:
        line += f" ({number('test_bits_per_dim')} bits/dim)"
    out = args.out or str(Path("runs") / Path(metrics["dataset"]).stem)
    resumed = metrics.get("resumed_from_step")
    steps = f"steps {resumed + 1}-{metrics['steps']}" if resumed is not None else f"{metrics['steps']} steps"
    print(f"{line}; {steps} in {metrics['train_seconds']:.1f} s; wrote {out}")
    return 0
