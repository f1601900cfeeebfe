r"""Event sequences: flowkit's intensity-free models against EasyTPP and against the exact NLL (issue 41).

For each simulator of `flowkit.events.SIMULATORS` and each seed, about `--events` events are simulated and split
60/20/20 by sequence; every model trains on the same training sequences with the same budget (`--epochs` passes,
`--batch-size` sequences per batch, Adam, no early stopping) and is scored on the same test sequences. Models run
interleaved (simulator by simulator, seed by seed, the order rotating), at `--threads` threads (1 by default).

Models:

- `flowkit-lognormmix`, `flowkit-flow`: [`EventModel`][flowkit.events.EventModel] (GRU history, log-normal mixture
  of 16 components or a spline flow over log tau) through [`fit_events`][flowkit.events.fit_events], float32;
- `easytpp-ifl`: EasyTPP's `IntensityFree` (the same model family, ifl-tpp's port), fed the same sequences directly
  through its model class (EasyTPP's data loaders fetch from a hub; its runner is not used), float32, its log-time
  standardisation set from the training set as in ifl-tpp;
- `easytpp-nhp`, `easytpp-thp`: EasyTPP's neural Hawkes and transformer Hawkes processes (intensity-based: their
  compensator is a Riemann sum of the intensity, `--integral-points` points per interval at evaluation), lr 1e-3
  (EasyTPP's configs; lr 1e-2 diverges).

Two NLLs per event are reported, because EasyTPP's losses leave out the first event of each sequence and the
survival term after the last one:

- `nll`: the exact NLL per event of the whole window (flowkit models and the simulator: the first event and the
  survival term of the open interval included); `gap` = model - exact;
- `conditional_nll`: $-\sum_{i \ge 2} \log p(t_i, m_i \mid \mathcal{H}_{t_i})$ per scored event, EasyTPP's
  convention, for every model and for the simulator (its exact value: the log-likelihood up to the last event minus
  that of the first event alone).

Time per epoch is the training time divided by the epochs (flowkit's through `flowkit.train.fit`, with its
callbacks; EasyTPP's through a plain loop over its `loglike_loss`), after one untimed warm-up run of each model
(one-time costs: compiling flowkit's native spline kernel, first calls).

    python bench/events.py --events 10000 --epochs 20 --seeds 3 --threads 1 --out bench/events.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from typing import Any

import numpy as np
import torch

from flowkit.events import SIMULATORS, EventModel, EventSequences, fit_events, simulate

FLOWKIT_MODELS = {"flowkit-lognormmix": "lognormmix", "flowkit-flow": "flow"}
EASYTPP_MODELS = {"easytpp-ifl": "IntensityFree", "easytpp-nhp": "NHP", "easytpp-thp": "THP"}
MODELS = (*FLOWKIT_MODELS, *EASYTPP_MODELS)


def easytpp_available() -> bool:
    """Whether EasyTPP (the `bench` extra) imports."""
    try:
        import easy_tpp.model  # noqa: F401
    except Exception:  # noqa: BLE001 (an old dependency can fail in many ways)
        return False
    return True


# ---------------------------------------------------------------- exact references


def exact_conditional(process: Any, sequences: EventSequences) -> tuple[float, int]:
    """The exact log-likelihood of events 2..n given their past (EasyTPP's convention) and their count."""
    total, count = 0.0, 0
    for s in sequences:
        if len(s) < 2:
            continue
        up_to_last = EventSequences([{"times": s.times, "marks": s.marks, "t_end": s.times[-1]}], sequences.num_marks)
        first = EventSequences([{"times": s.times[:1], "marks": s.marks[:1], "t_end": s.times[0]}], sequences.num_marks)
        total += process.sequence_log_likelihood(up_to_last[0]) - process.sequence_log_likelihood(first[0])
        count += len(s) - 1
    return total, count


# ---------------------------------------------------------------- flowkit


def run_flowkit(name: str, train: EventSequences, test: EventSequences, args: argparse.Namespace) -> dict[str, Any]:
    """Train a flowkit model; its full and conditional test NLL per event and its time per epoch."""
    model = EventModel(num_marks=train.num_marks, distribution=FLOWKIT_MODELS[name], hidden=args.hidden)
    start = time.perf_counter()
    fit_events(model, train, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, progress=False,
               seed=args.seed_now, threads=args.threads)  # fmt: skip
    seconds = time.perf_counter() - start
    model.eval()
    with torch.no_grad():
        conditional, count = 0.0, 0
        for begin in range(0, len(test), 256):
            batch = model._as_batch(test.batch(range(begin, min(begin + 256, len(test)))))
            log_p, _ = model.event_log_likelihoods(batch)
            conditional += float(log_p[:, 1:].double().sum())
            count += int(batch.mask[:, 1:].sum())
    return {
        "nll": model.nll_per_event(test),
        "conditional_nll": -conditional / count,
        "seconds_per_epoch": seconds / args.epochs,
    }


# ---------------------------------------------------------------- EasyTPP


def easytpp_batch(
    sequences: EventSequences, indices: list[int], pad: int, attention: bool = True
) -> dict[str, torch.Tensor]:
    """EasyTPP's model inputs for some sequences: times, deltas (the first from the window start), types, masks.

    The attention mask (`B x L x L`) is built only when asked (THP reads it; IntensityFree and NHP do not).
    """
    seqs = [sequences[i] for i in indices]
    length = max(len(s) for s in seqs)
    times = np.full((len(seqs), length), float(pad), dtype=np.float32)
    deltas = np.full((len(seqs), length), float(pad), dtype=np.float32)
    types = np.full((len(seqs), length), pad, dtype=np.int64)
    mask = np.zeros((len(seqs), length), dtype=bool)
    for row, s in enumerate(seqs):
        n = len(s)
        times[row, :n], deltas[row, :n], types[row, :n], mask[row, :n] = s.times, s.inter_times, s.marks, True
    pad_keys = types == pad
    if attention:
        mask_3d = np.triu(np.ones((length, length), dtype=bool), k=1)[None] | pad_keys[:, None, :]
    else:
        mask_3d = np.zeros((len(seqs), 0, 0), dtype=bool)
    return {
        "time_seqs": torch.as_tensor(times),
        "time_delta_seqs": torch.as_tensor(deltas),
        "type_seqs": torch.as_tensor(types),
        "seq_non_pad_mask": torch.as_tensor(mask),
        "attention_mask": torch.as_tensor(mask_3d),
    }


def build_easytpp(name: str, train: EventSequences, args: argparse.Namespace) -> Any:
    """An EasyTPP model class built from a ModelConfig (no runner, no hub)."""
    from easy_tpp.config_factory import ModelConfig
    from easy_tpp.model.basemodel import BaseModel

    k = train.num_marks
    config = ModelConfig(
        model_id=EASYTPP_MODELS[name], hidden_size=args.hidden, time_emb_size=16, num_layers=2, num_heads=2,
        loss_integral_num_sample_per_step=20, num_event_types=k, num_event_types_pad=k + 1, event_pad_index=k,
        model_specs={"num_mix_components": 16}, gpu=-1, thinning=None,
    )  # fmt: skip
    logs = np.log(np.concatenate([s.inter_times for s in train]))
    config.mean_log_inter_time, config.std_log_inter_time = float(logs.mean()), float(logs.std())
    return BaseModel.generate_model_from_config(config)


def easytpp_nll(model: Any, sequences: EventSequences, pad: int, batch_size: int, attention: bool) -> float:
    """EasyTPP's loss per scored event (events 2..n of each sequence) over `sequences`."""
    total, count = 0.0, 0
    with torch.no_grad():
        for begin in range(0, len(sequences), batch_size):
            indices = list(range(begin, min(begin + batch_size, len(sequences))))
            batch = easytpp_batch(sequences, indices, pad, attention)
            loss, events = model.loglike_loss(**batch)
            total += float(loss)
            count += int(events)
    return total / count


def run_easytpp(name: str, train: EventSequences, test: EventSequences, args: argparse.Namespace) -> dict[str, Any]:
    """Train an EasyTPP model on the same sequences and budget; its conditional test NLL and time per epoch."""
    torch.manual_seed(args.seed_now)
    model = build_easytpp(name, train, args)
    pad = train.num_marks
    lr = args.lr if name == "easytpp-ifl" else 1e-3
    attention = name == "easytpp-thp"
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    order = np.random.default_rng(args.seed_now)
    start = time.perf_counter()
    model.train()
    for _ in range(args.epochs):
        permutation = order.permutation(len(train)).tolist()
        for begin in range(0, len(train), args.batch_size):
            batch = easytpp_batch(train, permutation[begin : begin + args.batch_size], pad, attention)
            optimizer.zero_grad()
            loss, events = model.loglike_loss(**batch)
            (loss / max(events, 1)).backward()
            optimizer.step()
    seconds = time.perf_counter() - start
    model.eval()
    model.loss_integral_num_sample_per_step = args.integral_points
    nll = easytpp_nll(model, test, pad, 64, attention)
    return {"conditional_nll": nll, "seconds_per_epoch": seconds / args.epochs}


# ---------------------------------------------------------------- the benchmark


def _mean_se(values: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan"))


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per simulator and model: mean and SE over seeds of the NLLs, the gap and the time per epoch."""
    rows = []
    keys = sorted({(r["simulator"], r["model"]) for r in runs}, key=lambda k: (k[0], MODELS.index(k[1])))
    for simulator, model in keys:
        mine = [r for r in runs if r["simulator"] == simulator and r["model"] == model]
        row: dict[str, Any] = {"simulator": simulator, "model": model, "seeds": len(mine)}
        for field in ("nll", "gap", "conditional_nll", "conditional_gap", "seconds_per_epoch"):
            values = [r[field] for r in mine if r.get(field) is not None]
            if values:
                row[field], row[field + "_se"] = _mean_se(values)
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    """The summary as a Markdown table."""

    def cell(row: dict[str, Any], field: str, digits: int = 4) -> str:
        if field not in row:
            return "-"
        se = row.get(field + "_se", float("nan"))
        return f"{row[field]:.{digits}f}" + ("" if math.isnan(se) else f" ± {2 * se:.{digits}f}")

    lines = [
        "| simulator | model | NLL/event | gap to exact | conditional NLL/event | conditional gap | s/epoch |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        fields = ("nll", "gap", "conditional_nll", "conditional_gap")
        lines.append(
            f"| {r['simulator']} | {r['model']} | " + " | ".join(cell(r, f) for f in fields)
            + f" | {cell(r, 'seconds_per_epoch', 2)} |"
        )  # fmt: skip
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--simulators", default=",".join(SIMULATORS), help="comma-separated simulator names (default: all)")
    add("--models", default=",".join(MODELS), help=f"comma-separated: {', '.join(MODELS)}")
    add("--events", type=int, default=10_000, help="events simulated per simulator and seed (default 10000)")
    add("--epochs", type=int, default=20, help="passes over the training sequences (default 20)")
    add("--batch-size", type=int, default=16, help="sequences per batch (default 16)")
    add("--lr", type=float, default=1e-2, help="learning rate of the intensity-free models (default 0.01)")
    add("--hidden", type=int, default=32, help="history size of every model (default 32)")
    add("--seeds", type=int, default=3, help="seeds (default 3)")
    add("--integral-points", type=int, default=100, help="EasyTPP's intensity points per interval at evaluation")
    add("--threads", type=int, default=1, help="torch threads (default 1)")
    add("--out", default=None, help="write the runs and summary as JSON here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    simulators = [s for s in args.simulators.split(",") if s]
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS] + [s for s in simulators if s not in SIMULATORS]
    if unknown:
        raise SystemExit(f"unknown models or simulators: {unknown}")
    if any(m in EASYTPP_MODELS for m in models) and not easytpp_available():
        print("EasyTPP (easy-tpp, the bench extra) is missing: its models are skipped", file=sys.stderr)
        models = [m for m in models if m not in EASYTPP_MODELS]
    runs: list[dict[str, Any]] = []
    warm, _ = simulate(simulators[0], 200, seed=10_000)
    warm_args = argparse.Namespace(**{**vars(args), "epochs": 1, "seed_now": 0})
    for model in models:  # untimed: one-time costs out of the timings
        (run_flowkit if model in FLOWKIT_MODELS else run_easytpp)(model, warm, warm, warm_args)
    for seed in range(args.seeds):
        for s_index, name in enumerate(simulators):
            sequences, process = simulate(name, args.events, seed=seed)
            train, _, test = sequences.split((0.6, 0.2, 0.2), seed=seed)
            exact = process.nll_per_event(test)
            total, count = exact_conditional(process, test)
            exact_conditional_nll = -total / count
            rotation = (seed + s_index) % len(models)
            for model in models[rotation:] + models[:rotation]:  # interleaved: the order rotates
                args.seed_now = seed
                result = (run_flowkit if model in FLOWKIT_MODELS else run_easytpp)(model, train, test, args)
                result.update(simulator=name, model=model, seed=seed, train_events=train.num_events,
                              test_events=test.num_events, exact_nll=exact,
                              exact_conditional_nll=exact_conditional_nll)  # fmt: skip
                if "nll" in result:
                    result["gap"] = result["nll"] - exact
                result["conditional_gap"] = result["conditional_nll"] - exact_conditional_nll
                runs.append(result)
                print(
                    f"{name} seed {seed} {model}: conditional NLL {result['conditional_nll']:.4f} "
                    f"(exact {exact_conditional_nll:.4f}), {result['seconds_per_epoch']:.2f} s/epoch",
                    file=sys.stderr,
                )
    rows = summarise(runs)
    print(markdown(rows))
    if args.out:
        settings = {k: v for k, v in vars(args).items() if k != "seed_now"}
        with open(args.out, "w") as f:
            json.dump({"settings": settings, "threads": args.threads, "runs": runs, "summary": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
