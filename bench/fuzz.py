"""Fuzz flowkit's bijectors, transformers and presets: count non-finite values, gradients and round-trip failures.

    python bench/fuzz.py --minutes 3 --seed 0     # writes bench/results/fuzz.json
    python bench/fuzz.py --precision              # the float32 round-trip table quoted in README.md

Each configuration draws a random model, a dtype (float32 or float64) and a batch of
inputs, then runs forward and inverse with gradients (of the outputs and the ladj, in
the inputs and the weights). Models: every case of the `BIJECTORS` table in
`tests/cases.py` (weights perturbed by `flowkit.testing.randomize` at a random scale),
the transformers `RationalQuadraticSpline`, `CircularSpline` and `Affine` (random bins,
bounds and parameters at scales 0.1 to 5 and extreme logits ~1e7, inputs on the knots
+-2 ulp) and the presets RealNVP, MAF and NSF (coupling and autoregressive; random
features, layers, bins, bounds and hidden sizes, randomised weights). Inputs: normal at
scales 0.1 to 10, some entries replaced by +-1e6 or +-1e30 ("far"); angles and
intervals are drawn in their domain, with their end points.

Counts, each failure with an explanation class:

- non-finite values (forward or inverse outputs, ladj): `overflow` when the float64 copy
  of the model is finite there but some value it computes on the way, forward or backward
  (an activation of 1e30 times a weight gradient of 1e30, say), is beyond the float32
  range, or within a factor of the longest sum (the widest matrix product, whose float32
  partial sums can overflow when the result does not); otherwise `unexplained`;
- non-finite gradients, classified likewise (in the input: per sample; in the weights,
  which sum over the batch: once per configuration and direction), plus `unresolved
  parameters` when the float64 copy feeds a transformer parameters beyond `1 / eps` of
  float32 (about 8e6: only reached from inputs of 1e6 or more): float32 cannot resolve
  such logits (their rounding exceeds 1, so softmax bin widths and knot derivatives
  differ from the float64 copy's), the float32 model is a different function there, and
  its gradients can overflow where the float64 copy's do not (the values stay finite;
  they are counted above);
- round-trip failures, `|inverse(forward(x)) - x| > TOL[dtype] * max(1, |x|)` per sample:
  `ill-conditioned` when the error is within `SLACK` times the rounding bound
  `eps * sum_k max(1, m_k) ||J_k||` (`m_k` the largest value layer `k` computes, its
  conditioner's activations included, `J_k` the inverse of the Jacobian of the first `k`
  layers at `x`, in float64: the rounding in every layer, amplified by the inverse), or
  when the inverse is backward stable (the map sends the returned point where it sends
  `x`, up to `SLACK` times the rounding at the scale of the intermediates: a stretch too
  flat to resolve), or when it is a composition of backward-stable layer inverses (each
  layer's inverse maps back onto the point it was given, to working precision, so the error
  is the earlier layers amplifying roundings); `overflow` when float32's inverse is not finite
  but its float64 copy is, and computes a value beyond the float32 range; otherwise
  `unexplained` (with the float64 copy's error, which tells a float32 problem from a wrong
  inverse).

The target is zero `unexplained` of each kind.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from cases import BIJECTORS  # noqa: E402

from flowkit.bijectors import Bijector, Chain  # noqa: E402
from flowkit.domains import Circle, Interval  # noqa: E402
from flowkit.flows import MAF, NSF, RealNVP  # noqa: E402
from flowkit.testing import randomize  # noqa: E402
from flowkit.transformers import Affine, CircularSpline, RationalQuadraticSpline, Transformer  # noqa: E402

#: Round-trip tolerance, relative to `max(1, |x|)` per sample.
TOL = {torch.float32: 1e-4, torch.float64: 1e-9}
#: A round-trip error within SLACK times the rounding bound counts as explained by conditioning.
SLACK = 50.0
FAR = (1e6, 1e30)
#: Transformer parameters beyond this are not resolved by float32 (their rounding exceeds 1).
UNRESOLVED = 1 / torch.finfo(torch.float32).eps


class _TransformerBijector(Bijector):
    """An elementwise transformer with fixed parameters, as a bijector of a 1-D event."""

    _flowkit_register = False

    def __init__(self, transformer, params):
        super().__init__()
        self.transformer = transformer
        self.params = torch.nn.Parameter(params)
        self.event_shape = self.latent_shape = (params.shape[0],)
        self.domain = transformer.domain

    def forward(self, x, context=None):
        y, ladj = self.transformer(x, self.params.expand(*x.shape, -1))
        return y, ladj.sum(-1)

    def inverse(self, z, context=None):
        x, ladj = self.transformer.inverse(z, self.params.expand(*z.shape, -1))
        return x, ladj.sum(-1)


def _transformer_case(rng: random.Random) -> tuple[str, Bijector, torch.Tensor | None]:
    kind = rng.choice(["RationalQuadraticSpline", "CircularSpline", "Affine"])
    scale = rng.choice([0.1, 1.0, 2.0, 5.0, 1e7])
    if kind == "Affine":
        t = Affine(clamp=rng.choice([1.0, 5.0, 20.0]))
        knots = None
    elif kind == "CircularSpline":
        t = CircularSpline(rng.randint(1, 10))
    else:
        t = RationalQuadraticSpline(rng.randint(1, 10), rng.choice([0.5, 1.0, 3.0, 5.0, 100.0]))
    n = 6
    params = scale * torch.randn(n, t.params_per_element, dtype=torch.float64)
    knots = None
    if kind != "Affine":
        knots = t.knots(params)[0]
    return f"transformer {kind}(scale={scale:g})", _TransformerBijector(t, params), knots


def _preset(rng: random.Random) -> tuple[str, Bijector]:
    kind = rng.choice(["RealNVP", "MAF", "NSF coupling", "NSF autoregressive"])
    features = rng.randint(2, 8)
    default = rng.random() < 0.3
    hidden = () if default else tuple([rng.choice([8, 16, 32])] * rng.randint(1, 2))
    sizes = {} if default else {"transforms": rng.randint(1, 5), "hidden": hidden}
    extra: dict = {}
    if kind == "RealNVP":
        flow = RealNVP(features, **sizes)
    elif kind == "MAF":
        flow = MAF(features, **sizes)
    else:
        extra = {} if default else {"bins": rng.randint(2, 10), "bound": rng.choice([1.0, 3.0, 5.0, 10.0])}
        flow = NSF(features, coupling=kind == "NSF coupling", **sizes, **extra)
    scale = rng.choice([0.1, 0.3, 1.0])
    randomize(flow, scale=scale, seed=rng.randrange(2**31))
    described = "default sizes" if default else ", ".join(f"{k}={v}" for k, v in {**sizes, **extra}.items())
    return f"preset {kind}(D={features}, {described}, randomize {scale:g})", flow.bijector


def _case(rng: random.Random) -> tuple[str, Bijector, torch.Tensor, torch.Tensor | None]:
    """A random configuration: (description, bijector in float64, a template input, spline knots or None)."""
    draw = rng.random()
    knots = None
    if draw < 0.45:
        name = rng.choice(sorted(BIJECTORS))
        with torch.random.fork_rng():
            torch.manual_seed(rng.randrange(2**31))
            b, x = BIJECTORS[name]()
        scale = rng.choice([0.0, 0.1, 0.3, 1.0, 3.0])
        if scale:
            randomize(b, scale=scale, seed=rng.randrange(2**31))
        return f"case {name} (randomize {scale:g})", b.double(), x.double(), None
    if draw < 0.7:
        name, b, knots = _transformer_case(rng)
        return name, b.double(), torch.zeros(6, b.event_shape[0], dtype=torch.float64), knots
    name, b = _preset(rng)
    return name, b.double(), torch.zeros(8, b.event_shape[0], dtype=torch.float64), None


def _inputs(
    rng: random.Random, b: Bijector, template: torch.Tensor, dtype: torch.dtype, knots: torch.Tensor | None
) -> torch.Tensor:
    shape = template.shape
    domain = b.domain
    if domain.is_manifold:  # points on the manifold (spheres, products with circles and intervals)
        return domain.sample(tuple(shape), dtype=torch.float64).to(dtype)
    if isinstance(domain, Interval):
        x = domain.sample(tuple(shape), dtype=torch.float64)
        ends = torch.tensor([domain.low, domain.high], dtype=torch.float64)
        if isinstance(domain, Circle):
            ends = torch.tensor([-math.pi, math.pi - 1e-7, math.pi], dtype=torch.float64)
        else:
            ends = ends + torch.tensor([1e-6, -1e-6], dtype=torch.float64) * (domain.high - domain.low)
        mask = torch.rand(shape, dtype=torch.float64) < 0.2
        x = torch.where(mask, ends[torch.randint(len(ends), shape)], x).to(dtype)
        if isinstance(domain, Circle):
            x = x.clamp(-math.pi, math.pi)
        return x
    x = rng.choice([0.1, 1.0, 3.0, 10.0]) * torch.randn(shape, dtype=torch.float64)
    if knots is not None and rng.random() < 0.7:
        # On the knots of either axis, +-2 ulp (the inverse is run from these points too).
        table = knots.to(dtype)[:, rng.randrange(2)]  # (n, K + 1)
        pick = table.gather(-1, torch.randint(table.shape[-1], (table.shape[0], shape[-1])))
        for _ in range(rng.randint(0, 2)):
            pick = torch.nextafter(pick, torch.tensor(rng.choice([-math.inf, math.inf]), dtype=dtype))
        x = pick.double()
    if rng.random() < 0.4:
        far = torch.tensor(rng.choice(FAR), dtype=torch.float64) * torch.sign(torch.randn(shape, dtype=torch.float64))
        x = torch.where(torch.rand(shape, dtype=torch.float64) < 0.25, far, x)
    return x.to(dtype)


def _as64(x: torch.Tensor, domain) -> torch.Tensor:
    """`x` in float64, inside `domain` (a float32 pi is above the float64 pi)."""
    x = x.double()
    return x.clamp(domain.low, domain.high) if isinstance(domain, Interval) else x


def _leaves(b: Bijector) -> list[Bijector]:
    if isinstance(b, Chain):
        return [leaf for layer in b.layers for leaf in _leaves(layer)]
    return [b]


def _rounding_bound(b64: Bijector, x: torch.Tensor, context: torch.Tensor | None, eps: float) -> float:
    """`eps * sum_k max(1, m_k) ||J_k||_inf` for one sample, in float64 (see the module docstring).

    `J_k` is the inverse of the forward Jacobian `dh_k/dx` at `x` (the inverse's own
    Jacobian would be taken where the inaccurate inverse lands).
    """
    layers = _leaves(b64)
    c = None if context is None else context.unsqueeze(0)
    bound = eps * max(1.0, x.abs().max().item())
    h = x.unsqueeze(0)
    for k in range(len(layers)):

        def forward(v, prefix=layers[: k + 1]):
            v = v.reshape(1, *x.shape)
            for layer in prefix:
                v = layer(v, c if layer.context_features else None)[0]
            return v.reshape(-1)

        layer = layers[k]
        with torch.no_grad(), _Largest() as largest:  # the largest value layer k computes (activations too)
            h = layer(h, c if layer.context_features else None)[0]
        jac = torch.autograd.functional.jacobian(forward, x.reshape(-1))
        if jac.shape[0] != jac.shape[1] or not torch.isfinite(jac).all():
            return math.inf
        try:
            inverse = torch.linalg.inv(jac)
        except RuntimeError:  # singular to float64 precision: unbounded
            return math.inf
        if not torch.isfinite(inverse).all():
            return math.inf
        bound += eps * max(1.0, largest.value) * inverse.abs().sum(-1).max().item()
    return bound


def _backward_stable(
    b64: Bijector, x: torch.Tensor, back: torch.Tensor, context: torch.Tensor | None, eps: float
) -> bool:
    """Whether the map sends `back` where it sends `x`, up to rounding at the scale of its intermediates.

    `|f(back) - f(x)| <= SLACK * eps * L * max(1, m)` in float64, for `L` layers, `m` the
    largest value computed on the way (activations included): the inverse returned a
    point that is as good as `x` at working precision (in a stretch so flat that `f`
    does not resolve it, say), not a wrong one.
    """
    layers = _leaves(b64)
    c = None if context is None else context.unsqueeze(0)
    if not torch.isfinite(back).all():
        return False
    ends = []
    try:
        for start in (x, back):
            h = start.unsqueeze(0)
            with torch.no_grad(), _Largest() as largest:
                for layer in layers:
                    h = layer(h, c if layer.context_features else None)[0]
            ends.append((h, max(largest.value, start.abs().max().item())))
    except ValueError:
        return False
    (fx, scale), (fb, _) = ends
    gap = _wrapped(fb - fx, b64.domain).abs().max().item() if fx.shape == fb.shape else math.inf
    return gap <= SLACK * eps * len(layers) * max(1.0, scale)


def _stepwise_backward_stable(
    b: Bijector, b64: Bijector, z: torch.Tensor, context: torch.Tensor | None, eps: float
) -> bool:
    """Whether the inverse of `z` is a composition of backward-stable layer inverses.

    The inverse pass is rerun layer by layer in the working dtype, from the last layer:
    each layer's inverse `h_{k-1}` must map back, by that layer's float64 forward, to the
    point `h_k` it was given, up to `SLACK * eps * max(1, m_k)` with `m_k` the largest value
    the layer computes. Each step is then as good as working precision allows, and a large
    round-trip error is the earlier layers amplifying those roundings (an autoregressive
    inverse of a strongly scaling flow, say), not a wrong inverse.
    """
    c = None if context is None else context.unsqueeze(0)
    c64 = None if c is None else c.double()
    h = z.unsqueeze(0)
    try:
        for layer, layer64 in zip(reversed(_leaves(b)), reversed(_leaves(b64)), strict=True):
            with torch.no_grad():
                prev = layer.inverse(h, c if layer.context_features else None)[0]
                if not torch.isfinite(prev).all():
                    return False
                with _Largest() as largest:
                    again = layer64(_as64(prev, layer64.domain), c64 if layer64.context_features else None)[0]
            gap = _wrapped(again - h.double(), layer64.domain).abs().max().item()
            if gap > SLACK * eps * max(1.0, largest.value, h.abs().max().item()):
                return False
            h = prev
    except ValueError:
        return False
    return True


def _wrapped(diff: torch.Tensor, domain) -> torch.Tensor:
    return torch.remainder(diff + math.pi, 2 * math.pi) - math.pi if isinstance(domain, Circle) else diff


def _per_sample(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], -1)


def _run(b: Bijector, x: torch.Tensor, context: torch.Tensor | None, inverse: bool):
    """One direction with gradients (in the input and the weights): outputs, per-sample finiteness, largest value."""
    x = x.clone().requires_grad_(True)
    out, ladj = (b.inverse if inverse else b.forward)(x, context)
    weights = [p for p in b.parameters() if p.requires_grad]
    # The same cotangent for every sample and dtype, so that a sample re-run alone in float64 (to
    # classify a float32 failure) sees the gradient the batch run saw.
    per_sample = out[0].numel()
    pattern = torch.cos(1.7 * torch.arange(per_sample, dtype=torch.float64) + 0.3).reshape(out.shape[1:])
    cotangent = pattern.to(out.dtype).expand_as(out)
    grads = torch.autograd.grad((out * cotangent).sum() + ladj.sum(), [x, *weights], allow_unused=True)
    grad_x = grads[0] if grads[0] is not None else torch.zeros_like(x)
    weight_ok = all(g is None or torch.isfinite(g).all() for g in grads[1:])
    finite_out = torch.isfinite(_per_sample(out)).all(-1) & torch.isfinite(ladj.reshape(-1))
    finite_grad = torch.isfinite(_per_sample(grad_x)).all(-1)
    values = [out.abs().max(), ladj.abs().max(), grad_x.abs().max()] + [
        g.abs().max() for g in grads[1:] if g is not None
    ]
    return out.detach(), ladj.detach(), finite_out, finite_grad, weight_ok, max(v.item() for v in values)


class _Largest(TorchDispatchMode):
    """Records the largest finite magnitude of every floating-point tensor computed under it."""

    def __init__(self) -> None:
        super().__init__()
        self.value = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
                finite = t.detach().abs()
                finite = finite[torch.isfinite(finite)]
                if finite.numel():
                    self.value = max(self.value, finite.max().item())
        return out


def _reduction_length(b: Bijector) -> int:
    """The longest sum a layer of `b` computes: a matrix product over its widest input (1 without one)."""
    return max([m.in_features for m in b.modules() if isinstance(m, torch.nn.Linear)] + [1])


def _unresolved(b64: Bijector, x: torch.Tensor, context: torch.Tensor | None, inverse: bool) -> bool:
    """Whether the float64 copy feeds some transformer parameters beyond `UNRESOLVED` at `x`."""
    largest = [0.0]

    def record(module, args):
        largest[0] = max(largest[0], args[1].detach().abs().max().item())

    hooks = [m.register_forward_pre_hook(record) for m in b64.modules() if isinstance(m, Transformer)]
    try:
        with torch.no_grad():
            c64 = None if context is None else context.double()
            (b64.inverse if inverse else b64.forward)(_as64(x, b64.domain), c64)
    except ValueError:
        return False
    finally:
        for hook in hooks:
            hook.remove()
    return largest[0] > UNRESOLVED


def _nonfinite_class(
    b64: Bijector, x: torch.Tensor, context: torch.Tensor | None, inverse: bool, dtype: torch.dtype, gradients: bool
) -> str:
    """Why a float32 value (or, with `gradients`, gradient) is not finite at `x`: its class, or `unexplained`."""
    if dtype != torch.float32:
        return "unexplained"
    if _overflows(b64, x, context, inverse, torch.finfo(dtype).max):
        return "overflow"
    if gradients and _unresolved(b64, x, context, inverse):
        return "unresolved parameters"
    return "unexplained"


def _overflows(b64: Bijector, x: torch.Tensor, context: torch.Tensor | None, inverse: bool, limit: float) -> bool:
    """Whether the float64 copy is finite at `x` and computes, forward or backward, a value beyond `limit`.

    A float32 matrix product (forward, or a weight gradient in the backward pass) overflows
    when its partial sums do, and a sum of `n` terms can reach `n` times the largest value
    the float64 copy records; so the test is `largest * n > limit`, with `n` the longest sum.
    """
    try:
        with _Largest() as largest:
            _, _, finite, finite_grad, weight_ok, _ = _run(
                b64, _as64(x, b64.domain), None if context is None else context.double(), inverse
            )
    except ValueError:
        return False
    finite_all = bool(finite.all() and finite_grad.all() and weight_ok)
    return finite_all and largest.value * _reduction_length(b64) > limit


def fuzz(minutes: float, seed: int, replay: int | None = None, configurations: int | None = None) -> dict:
    """Fuzz for `minutes` (or until `configurations` were run, when given: the same ones for a seed on any machine).

    With `replay`, return that configuration (its index in the examples) unrun.
    """
    rng = random.Random(seed)
    torch.manual_seed(seed)
    stop = time.monotonic() + 60 * minutes
    counts = Counter()
    classes = {k: Counter() for k in ("nonfinite values", "nonfinite gradients", "round trip", "exceptions")}
    examples: list[dict] = []
    worst: dict[str, float] = {}
    by_family = Counter()
    while time.monotonic() < stop and (configurations is None or counts["configurations"] < configurations):
        name, b64, template, knots = _case(rng)
        dtype = rng.choice([torch.float32, torch.float64])
        b = b64.to(dtype) if dtype == torch.float64 else _copy(b64).to(dtype)
        x = _inputs(rng, b, template, dtype, knots)
        context = torch.randn(x.shape[0], b.context_features, dtype=dtype) if b.context_features else None
        counts["configurations"] += 1
        if replay is not None and counts["configurations"] == replay:
            return {"name": name, "bijector": b, "float64": b64, "x": x, "context": context}
        counts["samples"] += x.shape[0]
        limit = torch.finfo(dtype).max
        forward_out = forward_ok = None

        def record(kind, label, why, count=None, *, name=name, dtype=dtype, **details) -> None:
            """Count one failure of `kind` in class `why`, and keep it as an example (labelled `label`)."""
            classes[kind][why] += 1
            by_family[f"{kind}: {name.split('(')[0]} ({str(dtype)[6:]}), {why}"] += 1
            counts[count or kind] += 1
            if _keep(examples, name, label, why):
                example = {"config": name, "index": counts["configurations"], "dtype": str(dtype), "kind": label}
                examples.append({**example, "class": why, **details})

        try:
            for inverse in (False, True):
                # The inverse runs from the same points (as latent points) and, below, from the forward's outputs.
                source = x
                if inverse:
                    if torch.Size(b.latent_shape).numel() == torch.Size(x.shape[1:]).numel():
                        source = x.reshape(x.shape[0], *b.latent_shape)
                    elif forward_out is None:  # another dimension, and the forward refused the input
                        continue
                    else:  # another dimension (internal coordinates): from the forward's finite outputs
                        source = torch.where(forward_ok.reshape(-1, *[1] * len(b.latent_shape)), forward_out, 0.0)
                try:
                    out, ladj, finite, finite_grad, weight_ok, _ = _run(b, source, context, inverse)
                except ValueError as error:  # refused input (a bounded domain): not a failure
                    counts["refused inputs"] += 1
                    examples.append({"config": name, "dtype": str(dtype), "refused": str(error)[:200]})
                    continue
                direction = "inverse" if inverse else "forward"
                if not inverse:
                    forward_out, forward_ok = torch.nan_to_num(out), finite
                for kind, ok in (("nonfinite values", finite), ("nonfinite gradients", finite_grad)):
                    for i in (~ok).nonzero().flatten().tolist():
                        c_i = None if context is None else context[i : i + 1]
                        gradients = kind == "nonfinite gradients"
                        why = _nonfinite_class(b64, source[i : i + 1], c_i, inverse, dtype, gradients)
                        record(kind, kind, why, direction=direction, input=source[i].reshape(-1).tolist()[:8])
                if not weight_ok:  # the weights' gradients sum over the batch: one count per direction
                    why = _nonfinite_class(b64, source, context, inverse, dtype, True)
                    record("nonfinite gradients", "nonfinite weight gradients", why, direction=direction)
                if inverse:
                    continue
                # Round trip from the forward's finite outputs.
                keep = finite.nonzero().flatten()
                if not len(keep):
                    continue
                try:
                    back, _ = b.inverse(out[keep], None if context is None else context[keep])
                except ValueError:
                    counts["refused inputs"] += 1
                    continue
                x_k = x[keep]
                err = _per_sample(_wrapped(back - x_k, b.domain)).abs().amax(-1)
                err = torch.where(torch.isfinite(err), err, torch.full_like(err, math.inf))
                rel = err / _per_sample(x_k).abs().amax(-1).clamp_min(1)
                key = f"{name.split('(')[0]} {str(dtype)[6:]}"
                far = _per_sample(x_k).abs().amax(-1) >= FAR[0]
                near = rel[~far]
                if len(near):
                    worst[key] = max(worst.get(key, 0.0), near.max().item())
                for j in (rel > TOL[dtype]).nonzero().flatten().tolist()[:8]:
                    i = keep[j].item()
                    c_i = None if context is None else context[i]
                    c64 = None if c_i is None else c_i.double()
                    bound = _rounding_bound(b64, _as64(x[i], b.domain), c64, torch.finfo(dtype).eps)
                    eps = torch.finfo(dtype).eps
                    if (
                        err[j].item() <= SLACK * bound
                        or _backward_stable(b64, _as64(x[i], b.domain), _as64(back[j], b.domain), c64, eps)
                        or _stepwise_backward_stable(b, b64, out[i], c_i, eps)
                    ):
                        why = "ill-conditioned"
                    elif (
                        math.isinf(err[j].item())
                        and dtype == torch.float32
                        and _overflows(b64, out[i : i + 1], c_i, True, limit)
                    ):
                        why = "overflow"  # the inverse's float64 copy is finite but leaves the float32 range
                    else:
                        x64, c64 = _as64(x[i : i + 1], b.domain), None if c_i is None else c64[None]
                        b_back, _ = b64.inverse(b64(x64, c64)[0], c64)
                        e64 = _wrapped(b_back - x64, b.domain).abs().max().item()
                        why = "unexplained"
                    record(
                        "round trip",
                        "round trip",
                        why,
                        count="round trip failures",
                        error=err[j].item(),
                        **{"rounding bound": bound, "float64 error": e64 if why == "unexplained" else None},
                        input=x[i].reshape(-1).tolist()[:8],
                    )
        except Exception as error:  # noqa: BLE001 - a crash is a finding, recorded with its configuration
            counts["exceptions"] += 1
            classes["exceptions"][type(error).__name__] += 1
            examples.append(
                {
                    "config": name,
                    "dtype": str(dtype),
                    "kind": "exception",
                    "class": "unexplained",
                    "error": f"{type(error).__name__}: {error}"[:300],
                }
            )
    return {
        "seed": seed,
        "minutes": minutes,
        "tolerance": {"round trip, relative to max(1, |x|)": {str(k): v for k, v in TOL.items()}, "slack": SLACK},
        "counts": dict(counts),
        "classes": {k: dict(v) for k, v in classes.items()},
        "failures by family": dict(sorted(by_family.items())),
        "worst round trip (inputs not far), relative": dict(sorted(worst.items())),
        "examples": examples,
    }


def _keep(examples: list[dict], name: str, kind: str, why: str) -> bool:
    """Keep the unexplained failures (2000 examples in all) and 3 of each configuration, kind and class."""
    same = sum(e["config"] == name and e.get("kind") == kind and e.get("class") == why for e in examples)
    return len(examples) < 2000 if why == "unexplained" else len(examples) < 400 and same < 3


def _copy(b: Bijector) -> Bijector:
    import copy

    return copy.deepcopy(b)


def precision(seed: int = 0, n: int = 4096) -> dict:
    """Float32 round-trip errors `max |inverse(forward(x)) - x|` with `x ~ N(0, 1)`, per layer and per flow.

    Layers (D = 4): coupling and autoregressive layers with weights `randomize`d at
    scales 0.1, 0.3 and 1, and a single spline with parameters at scales 1, 2 and 5.
    Flows: the presets at their default sizes (D = 8), randomised likewise.
    Each entry gives the maximum and the 99.9% quantile of the per-sample error.
    """
    from flowkit.bijectors import AffineCoupling, MaskedAffineAutoregressive, MaskedSplineAutoregressive, SplineCoupling

    torch.manual_seed(seed)
    rows: dict[str, dict[str, float]] = {}

    def record(name: str, b: Bijector, x: torch.Tensor) -> None:
        b = b.float()
        with torch.no_grad():
            z, _ = b(x)
            back, _ = b.inverse(z)
        err = (back - x).abs().amax(-1)
        rows[name] = {"max": err.max().item(), "q999": err.quantile(0.999).item()}

    x4 = torch.randn(n, 4)
    for scale in (1.0, 2.0, 5.0):
        params = scale * torch.randn(n, 4, 23, dtype=torch.float64)
        b = _TransformerBijector(RationalQuadraticSpline(8, 5.0), params[0, 0])
        spline = RationalQuadraticSpline(8, 5.0)
        with torch.no_grad():
            y, _ = spline(x4, params.float())
            back, _ = spline.inverse(y, params.float())
        err = (back - x4).abs().amax(-1)
        rows[f"RationalQuadraticSpline(8, 5), parameters at scale {scale:g}"] = {
            "max": err.max().item(),
            "q999": err.quantile(0.999).item(),
        }
        del b
    layers = {
        "AffineCoupling": lambda: AffineCoupling(4),
        "SplineCoupling": lambda: SplineCoupling(4),
        "MaskedAffineAutoregressive": lambda: MaskedAffineAutoregressive(4),
        "MaskedSplineAutoregressive": lambda: MaskedSplineAutoregressive(4),
    }
    flows = {
        "RealNVP(8)": lambda: RealNVP(8),
        "MAF(8)": lambda: MAF(8),
        "NSF(8)": lambda: NSF(8),
        "NSF(8, coupling=True)": lambda: NSF(8, coupling=True),
    }
    x8 = torch.randn(n, 8)
    for scale in (0.1, 0.3, 1.0):
        for name, build in layers.items():
            record(f"{name}(4), randomize {scale:g}", randomize(build(), scale=scale, seed=seed), x4)
        for name, build in flows.items():
            record(f"{name}, randomize {scale:g}", randomize(build(), scale=scale, seed=seed).bijector, x8)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=1.0, help="how long to fuzz (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "fuzz.json"))
    parser.add_argument("--precision", action="store_true", help="print the float32 round-trip table instead")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.precision:
        for name, row in precision(args.seed).items():
            print(f"{name:52s} max {row['max']:.1e}   99.9% {row['q999']:.1e}")
        return
    result = fuzz(args.minutes, args.seed)
    counts, classes = result["counts"], result["classes"]
    print(f"configurations tried: {counts.get('configurations', 0)} ({counts.get('samples', 0)} samples)")
    for kind in ("nonfinite values", "nonfinite gradients", "round trip"):
        total = sum(classes[kind].values())
        detail = ", ".join(f"{k}: {v}" for k, v in sorted(classes[kind].items())) or "-"
        print(f"{kind + (' failures' if kind == 'round trip' else '')}: {total} ({detail})")
    print(f"refused inputs: {counts.get('refused inputs', 0)}")
    exceptions = ", ".join(f"{k}: {v}" for k, v in sorted(classes["exceptions"].items())) or "-"
    print(f"exceptions: {counts.get('exceptions', 0)} ({exceptions})")
    for family, count in result["failures by family"].items():
        if family.endswith("unexplained"):
            print(f"  {family}: {count}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
