"""flowkit: normalizing flows in PyTorch, with the checks that make them trustworthy."""

from . import bijectors, data, distributions, flows, io, testing, transformers
from . import sampling, targets, train
from ._validation import set_validation
from .flows import Flow

__version__ = "0.1.0"

__all__ = ["sampling", "targets", "train", "bijectors", "data", "distributions", "flows", "io", "testing", "transformers", "Flow", "set_validation"]
