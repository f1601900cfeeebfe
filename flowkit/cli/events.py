"""`flowkit events fit SOURCE --model NAME --out DIR`: fit a temporal point process to event sequences.

SOURCE is a file (`.csv` with sequence id, time and mark columns; `.jsonl`/`.json` in EasyTPP's or ifl-tpp's
layout) or the name of a built-in simulator (`hawkes`, `self-correcting`, `mmpp`, ...), which then also gives the
exact NLL per event of the test sequences. The sequences are split 60/20/20 by sequence; the output directory
receives `model/` ([`flowkit.io.save`][flowkit.io.save]), `metrics.json` (test NLL per event, time MAE, mark
accuracy, KS statistic of the time-rescaling residuals, and the gap to the exact NLL for a simulator), the fit
loop's history and checkpoint, and PNG plots (training curves, QQ plot, intensity, inter-event times).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from .arguments import add_threads, positive_float, positive_int

__all__ = ["add_parser", "run", "fit_events_source", "MODELS", "ENCODERS", "SIMULATOR_NAMES", "OUTPUTS"]

#: The inter-event distributions `--model` takes (those of `flowkit.events.model.DISTRIBUTIONS`; a test checks).
MODELS = ("lognormmix", "flow", "exponential", "weibull", "gamma")
#: The history encoders `--encoder` takes.
ENCODERS = ("gru", "transformer", "none")
#: The built-in simulators SOURCE may name (those of `flowkit.events.SIMULATORS`; a test checks).
SIMULATOR_NAMES = (
    "poisson", "hawkes", "hawkes-multi", "self-correcting", "renewal-gamma", "renewal-lognormal", "mmpp",
)  # fmt: skip
#: What the command writes in its output directory (removed by `--force`).
OUTPUTS = (
    "model",
    "metrics.json",
    "history.csv",
    "history.json",
    "checkpoint.safetensors",
    "training_curves.png",
    "qq.png",
    "intensity.png",
    "inter_event_times.png",
)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `flowkit events` and its subcommand `fit`."""
    parser = subparsers.add_parser(
        "events",
        help="fit temporal point processes to event sequences",
        description="Temporal point processes (intensity-free models, Shchur et al. 2020).",
    )
    sub = parser.add_subparsers(dest="events_command", required=True, metavar="COMMAND")
    child = sub.add_parser(
        "fit",
        help="fit a model to event sequences (a file or a simulator)",
        description="Fit an event model by maximum likelihood; write the model, metrics.json, history and plots. "
        f"SOURCE: a .csv (sequence id, time, mark), a .jsonl/.json (EasyTPP or ifl-tpp layout) or a simulator: "
        f"{', '.join(SIMULATOR_NAMES)}.",
    )
    add = child.add_argument
    add("source", metavar="SOURCE", help="event file (.csv, .jsonl, .json) or simulator name")
    add("--model", choices=MODELS, default="lognormmix", help="inter-event distribution (default lognormmix)")
    add("--encoder", choices=ENCODERS, default="gru", help="history encoder (default gru)")
    add("--out", required=True, help="output directory")
    add("--events", type=positive_int, default=5000, help="events to simulate for a simulator SOURCE (default 5000)")
    add("--epochs", type=positive_int, default=30, help="passes over the training sequences (default 30)")
    add("--batch-size", type=positive_int, default=32, help="sequences per batch (default 32)")
    add("--lr", type=positive_float, default=1e-2, help="learning rate (default 0.01)")
    add("--hidden", type=positive_int, default=32, help="history vector size (default 32)")
    add("--components", type=positive_int, default=16, help="mixture components of lognormmix (default 16)")
    add("--num-marks", type=positive_int, default=None, help="number of marks (default: from the data)")
    add("--window-end", type=float, default=None, help="observation window end of a CSV (default: last event)")
    add("--seed", type=int, default=0, help="seed of the simulation, split and training (default 0)")
    add("--force", action="store_true", help="replace a run already in --out")
    add("--no-plots", action="store_true", help="skip the PNG plots")
    add_threads(child, "default: torch's")
    child.set_defaults(func=run)
    return parser


def _load_source(args: argparse.Namespace) -> tuple[Any, Any]:
    """The sequences of SOURCE and the simulator that drew them (None for a file)."""
    from .. import events

    if args.source in SIMULATOR_NAMES:
        return events.simulate(args.source, args.events, seed=args.seed)
    path = Path(args.source)
    if not path.exists():
        raise ValueError(f"{args.source} is neither a file nor a simulator ({', '.join(SIMULATOR_NAMES)})")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return events.read_csv(path, num_marks=args.num_marks, window_end=args.window_end), None
    if suffix in (".jsonl", ".json"):
        return events.read_jsonl(path, num_marks=args.num_marks), None
    raise ValueError(f"{args.source}: an event file must end in .csv, .jsonl or .json")


def fit_events_source(args: argparse.Namespace) -> dict[str, Any]:
    """Run `flowkit events fit` for parsed arguments; returns the metrics written to `metrics.json`."""
    import torch

    from .. import events, io
    from .fit import prepare_output

    out = Path(args.out)
    prepare_output(out, force=args.force, resume=False, steps=0, outputs=OUTPUTS)
    sequences, process = _load_source(args)
    train, val, test = sequences.split((0.6, 0.2, 0.2), seed=args.seed)
    torch.manual_seed(args.seed)
    model = events.EventModel(
        num_marks=sequences.num_marks,
        distribution=args.model,
        encoder=args.encoder,
        hidden=args.hidden,
        components=args.components,
    ).double()
    start = time.perf_counter()
    history = events.fit_events(
        model, train, val, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
        checkpoint_dir=out, progress=True,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    model.eval()
    metrics: dict[str, Any] = {
        "source": args.source,
        "model": args.model,
        "encoder": args.encoder,
        "num_marks": sequences.num_marks,
        "events": {"train": train.num_events, "val": val.num_events, "test": test.num_events},
        "sequences": {"train": len(train), "val": len(val), "test": len(test)},
        **events.evaluate(model, test),
        "train_nll_per_event": model.nll_per_event(train),
        "epochs": args.epochs,
        "steps": history.steps_run,
        "train_seconds": seconds,
    }
    if process is not None:
        metrics["exact_nll_per_event"] = process.nll_per_event(test)
        metrics["gap_to_exact"] = metrics["nll_per_event"] - metrics["exact_nll_per_event"]
    io.save(model, out / "model")
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    if not args.no_plots:
        _plots(model, history, test, process, out)
    return metrics


def _plots(model: Any, history: Any, test: Any, process: Any, out: Path) -> None:
    from .. import plot
    from ..events import plots, rescaled_residuals

    figures = {
        "training_curves": plot.training_curves(history, title="training curves", ylabel="NLL per event (nats)"),
        "qq": plots.qq_plot(rescaled_residuals(model, test)),
        "intensity": plots.intensity_plot(model, test, process=process),
        "inter_event_times": plots.inter_event_histogram(
            test, samples=model.sample(min(len(test), 64), t_end=max(s.t_end for s in test), seed=0)
        ),
    }
    for name, fig in figures.items():
        fig.savefig(out / f"{name}.png", dpi=100)


def run(args: argparse.Namespace) -> int:
    """Run `flowkit events fit`; returns the exit code."""
    metrics = fit_events_source(args)
    line = f"{metrics['source']}: test NLL {metrics['nll_per_event']:.4f} nats/event"
    if "gap_to_exact" in metrics:
        line += f" (exact {metrics['exact_nll_per_event']:.4f}, gap {metrics['gap_to_exact']:+.4f})"
    line += f", KS {metrics['ks_statistic']:.3f}; {metrics['train_seconds']:.1f} s; wrote {args.out}"
    print(line)
    return 0
