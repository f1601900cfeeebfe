"""Outputs of every registry case in float64, to check that a refactoring changes no bit.

`save OUT` builds every case of `tests/cases.py` (bijectors with their input batch and a random context where
they take one, base distributions) and every preset of `flowkit.flows.PRESETS`, each under seed 0, and saves
the forward and inverse outputs with their log-determinants, the parameters, the samples and log densities.
`compare A B` prints every entry that differs (bit for bit) or exists in one file only.

    python bench/registry_snapshot.py save /tmp/before.pt   # on the old tree
    python bench/registry_snapshot.py save /tmp/after.pt    # on the new tree
    python bench/registry_snapshot.py compare /tmp/before.pt /tmp/after.pt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def _store(out: dict[str, object], value: object, key: str) -> None:
    if isinstance(value, Tensor):
        out[key] = value.detach().clone()
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            _store(out, item, f"{key}.{i}")


def snapshot() -> dict[str, object]:
    """Every case's outputs (an error's text where a case fails, so that a new failure shows as a difference)."""
    from cases import BIJECTORS, DISTRIBUTIONS

    from flowkit.flows import PRESETS, build_flow

    out: dict[str, object] = {}
    for name, build in BIJECTORS.items():
        torch.manual_seed(0)
        try:
            built = build()
            bijector, x = built[0].double(), built[1].double()
            features = getattr(bijector, "context_features", 0)
            kw = {"context": torch.randn(x.shape[0], features, dtype=torch.float64)} if features else {}
            y = bijector.forward(x, **kw)
            _store(out, y, f"bijector.{name}.forward")
            _store(out, bijector.inverse(y[0] if isinstance(y, tuple) else y, **kw), f"bijector.{name}.inverse")
            params = [p.detach().flatten() for p in bijector.parameters()]
            out[f"bijector.{name}.parameters"] = torch.cat(params) if params else torch.zeros(0)
        except Exception as error:  # noqa: BLE001 (the error's text is the snapshot)
            out[f"bijector.{name}.error"] = repr(error)
    for name, build in DISTRIBUTIONS.items():
        torch.manual_seed(0)
        try:
            distribution = build()
            samples = distribution.sample((5,))
            _store(out, (samples, distribution.log_prob(samples)), f"distribution.{name}")
        except Exception as error:  # noqa: BLE001
            out[f"distribution.{name}.error"] = repr(error)
    for name in PRESETS:
        torch.manual_seed(0)
        features = 16 if name == "lattice" else 4
        try:
            flow = build_flow(name, features).double()
            x = torch.randn(7, features, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
            _store(out, flow.log_prob(x), f"preset.{name}.log_prob")
        except Exception as error:  # noqa: BLE001
            out[f"preset.{name}.error"] = repr(error)
    return out


def compare(a: dict[str, object], b: dict[str, object]) -> list[str]:
    """The keys whose values differ bit for bit, or that only one snapshot has."""
    differ = []
    for key in sorted(set(a) | set(b)):
        if key not in a or key not in b:
            differ.append(f"{key}: only in {'the first' if key in a else 'the second'}")
        elif isinstance(a[key], Tensor):
            same = isinstance(b[key], Tensor) and a[key].shape == b[key].shape and torch.equal(a[key], b[key])
            differ += [] if same else [key]
        elif a[key] != b[key]:
            differ.append(f"{key}: {a[key]} != {b[key]}")
    return differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("save").add_argument("out")
    pair = commands.add_parser("compare")
    pair.add_argument("first")
    pair.add_argument("second")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.command == "save":
        out = snapshot()
        torch.save(out, args.out)
        print(f"{len(out)} entries, {sum(k.endswith('.error') for k in out)} errors")
    else:
        # Snapshots hold tensors and strings only; weights_only refuses anything else.
        first, second = torch.load(args.first, weights_only=True), torch.load(args.second, weights_only=True)
        differ = compare(first, second)
        print("\n".join(differ + [f"{len(differ)} differences of {len(first)}"]))


if __name__ == "__main__":
    main()
