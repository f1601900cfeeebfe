"""Likelihood benchmark: flowkit vs zuko/nflows flows of matched size (see flowkit.bench.likelihood).

    python bench/likelihood.py --datasets 2d,digits --steps 1000 --seeds 3
"""

import sys

from flowkit.bench.likelihood import main

if __name__ == "__main__":
    sys.exit(main())
