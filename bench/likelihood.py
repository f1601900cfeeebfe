"""Likelihood benchmark: flowkit's presets against zuko and nflows flows of matched size.

This is `flowkit bench likelihood` (`flowkit.cli.bench`: the same options,
table and JSON) with the peer models of `peers.py` (`zuko-nsf`, `zuko-maf`,
`zuko-realnvp`, `nflows-nsf`, `nflows-maf`) added to flowkit's `flowkit-NAME`
models; by default it runs flowkit's autoregressive NSF and its two peers:

    python bench/likelihood.py --datasets 2d,digits --steps 1000 --seeds 3
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

import peers

from flowkit.cli import bench

#: flowkit's models and the peers, by name.
MODELS = {**bench.MODELS, **{name: partial(peers.build_peer, name) for name in peers.PEERS}}
#: Models run by default: flowkit's autoregressive NSF and its two peers.
DEFAULT_MODELS = ("flowkit-nsf", "zuko-nsf", "nflows-nsf")


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: the command line) and run the benchmark with the peers."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench.add_arguments(parser, MODELS, DEFAULT_MODELS)
    return bench.run(parser.parse_args(argv), MODELS)


if __name__ == "__main__":
    sys.exit(main())
