"""Rewrite model configs saved by older flowkit versions into today's format.

[`flowkit.io.load`][flowkit.io.load] passes every config through `migrate` before building it. Each `Rule`
maps one node `{"class": name, "args": {...}}` to a node in today's format; the weights are untouched, so a
rule must lead to a model with the same state-dict keys (or one that renames them as it loads).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .bijectors.coupling import coupling_mask
from .transformers import CircularSpline

__all__ = ["Rule", "RULES", "migrate"]

Config = dict[str, Any]


@dataclass(frozen=True)
class Rule:
    """One rewrite of saved configs.

    Attributes:
        name: what it rewrites, for humans (e.g. `"AffineCoupling -> Coupling(Affine)"`).
        cls: the class name of the nodes it applies to.
        rewrite: maps such a node (its arguments already migrated) to a node in today's format.
    """

    name: str
    cls: str
    rewrite: Callable[[Config], Config]


def _node(cls: str, **args: Any) -> Config:
    return {"class": cls, "args": args}


def _pop(args: dict[str, Any], **defaults: Any) -> list[Any]:
    """Remove the named arguments from `args`, giving the old constructor's default for a missing one."""
    return [args.pop(name, default) for name, default in defaults.items()]


def _with_transformer(cls: str, transformer: Callable[[dict[str, Any]], Config]) -> Callable[[Config], Config]:
    """An old thin subclass's config as `cls` (`Coupling` or `MaskedAutoregressive`) with that transformer."""

    def rewrite(config: Config) -> Config:
        args = dict(config["args"])
        return _node(cls, transformer=transformer(args), **args)

    return rewrite


def _affine(args: dict[str, Any]) -> Config:
    (clamp,) = _pop(args, clamp=5.0)
    return _node("Affine", clamp=clamp)


def _spline(args: dict[str, Any]) -> Config:
    bins, bound = _pop(args, bins=8, bound=5.0)
    return _node("RationalQuadraticSpline", bins=bins, bound=bound)


def _circular_coupling(config: Config) -> Config:
    """`CircularSplineCoupling` as a `Coupling` with a `CircularSpline` and a periodic `MLP` conditioner."""
    args = dict(config["args"])
    (bins,) = _pop(args, bins=8)
    features, mask, parity = args.get("features"), args.get("mask"), args.get("parity", 0)
    hidden, context, activation = args.get("hidden", [64, 64]), args.get("context", 0), args.get("activation", "relu")
    try:
        n_transformed = int(coupling_mask(features, mask, parity).sum())
        params = CircularSpline(bins).params_per_element
    except (TypeError, ValueError):
        return _node("Coupling", transformer=_node("CircularSpline", bins=bins), **args)  # Coupling names the problem
    conditioner = _node(
        "MLP",
        in_features=features - n_transformed,
        out_features=n_transformed * params,
        hidden=hidden,
        activation=activation,
        context=context,
        periodic=True,
    )
    return _node("Coupling", transformer=_node("CircularSpline", bins=bins), **args, conditioner=conditioner)


_STOCHASTIC_BLOCKS = ("MetropolisBlock", "LangevinBlock")


def _stochastic_flow(config: Config) -> Config:
    """A `Flow` over a `Chain` of stochastic blocks (before 2026-12) as a `StochasticFlow` (which renames keys)."""
    bijector = config["args"].get("bijector")
    layers = bijector["args"].get("*bijectors") if _is_node(bijector) and bijector["class"] == "Chain" else None
    if not isinstance(layers, list) or not any(_is_node(v) and v["class"] in _STOCHASTIC_BLOCKS for v in layers):
        return config
    return _node("StochasticFlow", layers=layers, base=config["args"].get("base"))


#: The rewrites, applied to every node of a config (children first).
RULES: list[Rule] = [
    Rule("AffineCoupling -> Coupling(Affine)", "AffineCoupling", _with_transformer("Coupling", _affine)),
    Rule(
        "SplineCoupling -> Coupling(RationalQuadraticSpline)", "SplineCoupling", _with_transformer("Coupling", _spline)
    ),
    Rule(
        "CircularSplineCoupling -> Coupling(CircularSpline, periodic MLP)", "CircularSplineCoupling", _circular_coupling
    ),
    Rule(
        "MaskedAffineAutoregressive -> MaskedAutoregressive(Affine)",
        "MaskedAffineAutoregressive",
        _with_transformer("MaskedAutoregressive", _affine),
    ),
    Rule(
        "MaskedSplineAutoregressive -> MaskedAutoregressive(RationalQuadraticSpline)",
        "MaskedSplineAutoregressive",
        _with_transformer("MaskedAutoregressive", _spline),
    ),
    Rule("Flow(Chain with stochastic blocks) -> StochasticFlow", "Flow", _stochastic_flow),
]


def _is_node(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"class", "args"} and isinstance(value["args"], dict)


def migrate(config: Any) -> Any:
    """Return `config` (a saved model config, as JSON) with every rule of `RULES` applied; the input is not changed.

    Values that are not configs are walked into or passed through as they are, so that
    [`from_config`][flowkit.io.from_config] reports any problem.
    """
    if isinstance(config, list):
        return [migrate(v) for v in config]
    if isinstance(config, dict) and set(config) == {"__dict__"} and isinstance(config["__dict__"], dict):
        return {"__dict__": {k: migrate(v) for k, v in config["__dict__"].items()}}
    if not _is_node(config):
        return config
    node = {"class": config["class"], "args": {k: migrate(v) for k, v in config["args"].items()}}
    for rule in RULES:
        if node["class"] == rule.cls:
            node = rule.rewrite(node)
    return node
