"""Benchmarks as importable code; ``bench/*.py`` and ``flowkit bench`` are thin wrappers around them."""

__all__ = ["likelihood", "models"]
