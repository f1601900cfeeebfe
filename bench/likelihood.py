"""Likelihood benchmark: flowkit's presets against zuko and nflows flows of matched size.

This is `flowkit bench likelihood` (`flowkit.cli.bench`: the same options,
table and JSON) with the peer models of `peers.py` (`zuko-nsf`, `zuko-maf`,
`zuko-realnvp`, `nflows-nsf`, `nflows-maf`) added to flowkit's `flowkit-NAME`
models; by default it runs flowkit's autoregressive NSF and its two peers:

    python bench/likelihood.py --datasets 2d,digits --steps 1000 --seeds 3

`--datasets small` adds small tabular sets that ship inside scikit-learn and
statsmodels (`diabetes`, `wine`, `breast_cancer`, `star98`, `macrodata`): a few
hundred points of 10 to 30 features, split 60/20/20 by a fixed seed; columns with
fewer than 20 distinct values are dequantised by uniform noise of one spacing.
`flowkit-nsf` and `flowkit-nsf-coupling` are the presets at their defaults. The variants name
their start and permutations explicitly, so that they keep their meaning when the defaults
change: `flowkit-nsf-near` is the autoregressive NSF started near the identity
(`near_identity=True`, the default since issue 38) and `flowkit-nsf-exact` at it
(`near_identity=False`, the default before); `flowkit-nsf-coupling-random` is the coupling NSF
with seeded random permutations and the exact start (the default before issue 38),
`flowkit-nsf-coupling-random-near` the same started near the identity (the default above
`D = 2` since issue 38), `flowkit-nsf-coupling-alternate` the coupling NSF with
`permutations="alternate"` and the exact start and `flowkit-nsf-coupling-near` that one started
near the identity (the default at `D = 2` since issue 38). `flowkit-nsf-random-start` starts
flowkit's autoregressive NSF where zuko's starts (random last weights and bias offsets at
`nn.Linear`'s scale, from the exact start), `flowkit-nsf-coupling-random-start` and
`flowkit-nsf-coupling-alternate-random-start` do the same for the coupling NSF with each kind of
permutation, and `zuko-nsf-zero-start` starts zuko's NSF at flowkit's exact identity (every
conditioner's last layer zero). `--first-seed N` runs seeds `N, N + 1, ...`, to add seeds to an
earlier run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from functools import partial

import numpy as np
import peers
import torch

from flowkit.cli import bench
from flowkit.data import Splits, split_array, standardize
from flowkit.flows import NSF


def _nsf_variant(
    options: dict,
    features: int,
    *,
    transforms: int | None = None,
    hidden: Sequence[int] | None = None,
    bins: int = 8,
    standardize_with: torch.Tensor | None = None,
) -> torch.nn.Module:
    """The NSF of flowkit with other `options` (keyword arguments of `NSF`) at the preset's sizes."""
    flow = NSF(features, transforms=transforms or 5, bins=bins, hidden=tuple(hidden or (128, 128)), **options)
    return flow if standardize_with is None else standardize(flow, standardize_with)


def _random_start(flow: torch.nn.Module) -> torch.nn.Module:
    """Start each conditioner's last layer of `flow` where zuko's start.

    That is `nn.Linear`'s random weights and bias offsets (`U(-1/sqrt(n), 1/sqrt(n))`), the offsets around the
    layer's own identity bias.
    """
    with torch.no_grad():
        for module in flow.modules():
            last = getattr(module, "last", None)
            if isinstance(last, torch.nn.Linear):
                bound = 1.0 / last.in_features**0.5
                last.weight.uniform_(-bound, bound)
                last.bias.add_(torch.empty_like(last.bias).uniform_(-bound, bound))
    return flow


def _random_start_nsf(features: int, options: dict | None = None, **sizes) -> torch.nn.Module:
    """The NSF of flowkit (with `options`) at zuko's random start (`_random_start`), standardised as the others."""
    standardize_with = sizes.pop("standardize_with", None)
    flow = _random_start(_nsf_variant(options or {}, features, **sizes))
    return flow if standardize_with is None else standardize(flow, standardize_with)


def _zero_start_zuko(features: int, **sizes) -> torch.nn.Module:
    """The NSF of zuko (autoregressive), every conditioner's last layer zeroed: flowkit's exact identity start."""
    from zuko.flows.autoregressive import MaskedAutoregressiveTransform

    flow = peers.build_peer("zuko-nsf", features, **sizes)
    with torch.no_grad():
        for transform in flow.modules():
            if isinstance(transform, MaskedAutoregressiveTransform):
                last = [m for m in transform.hyper.modules() if isinstance(m, torch.nn.Linear)][-1]
                last.weight.zero_()
                last.bias.zero_()
    return flow


def _dequantise(x: np.ndarray, seed: int = 0) -> np.ndarray:
    """Columns with fewer than 20 distinct values get uniform noise of one spacing (else their density is unbounded)."""
    rng = np.random.default_rng(seed)
    x = np.array(x, dtype=np.float64)
    for j in range(x.shape[1]):
        values = np.unique(x[:, j])
        if len(values) < 20:
            spacing = np.diff(values).min() if len(values) > 1 else 1.0
            x[:, j] += spacing * (rng.random(len(x)) - 0.5)
    return x


def _sklearn(name: str) -> np.ndarray:
    import sklearn.datasets

    return getattr(sklearn.datasets, f"load_{name}")().data


def _statsmodels(name: str) -> np.ndarray:
    import statsmodels.api as sm

    frame = getattr(sm.datasets, name).load_pandas().data.select_dtypes("number")
    if name == "macrodata":  # the calendar columns are an index, not data
        frame = frame.drop(columns=["year", "quarter"])
    return frame.to_numpy()


def small_set(name: str) -> Splits:
    """A small tabular set shipped inside scikit-learn or statsmodels, dequantised and split 60/20/20 (seed 0)."""
    x = _sklearn(name) if name in ("diabetes", "wine", "breast_cancer") else _statsmodels(name)
    splits = split_array(_dequantise(x), name, val=0.2, test=0.2, seed=0)
    splits.info["source"] = "scikit-learn" if name in ("diabetes", "wine", "breast_cancer") else "statsmodels"
    return splits


#: Small tabular sets inside installed packages, for `--datasets small`.
SMALL_SETS = ("diabetes", "wine", "breast_cancer", "star98", "macrodata")

#: flowkit's models, two variants of its NSF, and the peers, by name.
MODELS = {
    **bench.MODELS,
    "flowkit-nsf-near": partial(_nsf_variant, {"near_identity": True}),
    "flowkit-nsf-exact": partial(_nsf_variant, {"near_identity": False}),
    "flowkit-nsf-coupling-random": partial(
        _nsf_variant, {"coupling": True, "permutations": "random", "near_identity": False}
    ),
    "flowkit-nsf-coupling-alternate": partial(
        _nsf_variant, {"coupling": True, "permutations": "alternate", "near_identity": False}
    ),
    "flowkit-nsf-coupling-near": partial(
        _nsf_variant, {"coupling": True, "permutations": "alternate", "near_identity": True}
    ),
    "flowkit-nsf-random-start": partial(_random_start_nsf, options={"near_identity": False}),
    "flowkit-nsf-coupling-random-start": partial(
        _random_start_nsf, options={"coupling": True, "permutations": "random", "near_identity": False}
    ),
    "flowkit-nsf-coupling-alternate-random-start": partial(
        _random_start_nsf, options={"coupling": True, "permutations": "alternate", "near_identity": False}
    ),
    "flowkit-nsf-coupling-random-near": partial(
        _nsf_variant, {"coupling": True, "permutations": "random", "near_identity": True}
    ),
    **{name: partial(peers.build_peer, name) for name in peers.PEERS},
    "zuko-nsf-zero-start": _zero_start_zuko,
}
#: Models run by default: flowkit's autoregressive NSF and its two peers.
DEFAULT_MODELS = ("flowkit-nsf", "zuko-nsf", "nflows-nsf")


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: the command line) and run the benchmark with the peers."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench.add_arguments(parser, MODELS, DEFAULT_MODELS)
    parser.add_argument(
        "--first-seed", type=int, default=0, help="the first seed: runs seeds first, ..., first + seeds - 1 (default 0)"
    )
    args = parser.parse_args(argv)
    loaders = {name: partial(small_set, name) for name in SMALL_SETS}
    if args.first_seed:  # more seeds on top of an earlier run: its seeds are not trained again
        train = bench.train_and_evaluate
        bench.train_and_evaluate = lambda model, data, a, seed, *rest: train(model, data, a, seed + a.first_seed, *rest)
    return bench.run(args, MODELS, loaders, {"small": SMALL_SETS})


if __name__ == "__main__":
    sys.exit(main())
