r"""Neural posterior estimation (NPE): a conditional flow trained on simulations as an amortised posterior.

Given pairs $(\theta_i, x_i)$ with $\theta_i \sim p(\theta)$ and $x_i \sim p(x \mid \theta_i)$, a conditional flow
$q_\phi(\theta \mid x)$ trained by maximum likelihood,

$$
\min_\phi\; -\frac1N \sum_{i=1}^N \log q_\phi(\theta_i \mid x_i),
$$

minimises $E_{p(x)}\,\mathrm{KL}\big(p(\theta \mid x) \,\|\, q_\phi(\theta \mid x)\big)$ up to a constant, so that
$q_\phi(\cdot \mid x)$ approaches the posterior for every $x$ at once (Papamakarios & Murray 2016; Greenberg,
Nonnenmacher & Macke 2019). Both sides are z-scored with the training set's moments: the flow sees
$\tilde\theta = (\theta - m_\theta) / s_\theta$ and $\tilde x = (x - m_x) / s_x$, and

$$
\log q(\theta \mid x) = \log q_\phi(\tilde\theta \mid \tilde x) - \sum_j \log s_{\theta, j}.
$$

[`fit_posterior`][flowkit.inference.fit_posterior] trains with flowkit's fit loop and its
[`MaximumLikelihood`][flowkit.train.MaximumLikelihood] objective on the pairs; the result is a
[`NeuralPosterior`][flowkit.inference.NeuralPosterior] with `sample(n, x)`, `log_prob(theta, x)`, `map(x)` and
credible intervals. Under a box prior the posterior's samples are restricted to the box by rejection (as sbi
does); its `log_prob` is $-\infty$ outside and is not renormalised inside.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .._config import Configurable
from .._validation import check_number
from ..bijectors import Bijector, Chain, RegressionWhitening, Standardization
from ..flows import PRESETS, Flow, FlowModel, parse_hidden
from ..train import History, MaximumLikelihood, fit
from .tasks import drop_invalid_simulations

__all__ = ["NeuralPosterior", "fit_posterior", "posterior_flow"]


def posterior_flow(
    theta_dim: int,
    x_dim: int,
    name: str = "nsf",
    *,
    transforms: int | None = 5,
    hidden: Sequence[int] | str | None = (64, 64),
    bins: int | None = 10,
) -> FlowModel:
    """A conditional flow preset on parameters `(theta_dim,)` given data `(x_dim,)` (the context).

    Arguments:
        theta_dim: the number of parameters.
        x_dim: the number of context features (the data).
        name: a vector preset of `flowkit.flows.PRESETS` that takes a context (`"nsf"`, `"maf"`,
            `"realnvp"`, `"nsf-coupling"`, ...).
        transforms: layers (None: the preset's default).
        hidden: conditioner hidden sizes (None: the preset's).
        bins: spline bins, for the presets with splines (None: the preset's).

    Raises:
        ValueError: for an unknown preset, or one that takes no context.

    Examples:
        >>> from flowkit.inference import posterior_flow
        >>> posterior_flow(2, 3, transforms=2, hidden=(16,)).context_features
        3
    """
    key = name.lower()
    if key not in PRESETS:
        raise ValueError(f"posterior_flow: unknown flow {name!r}; choose one of {', '.join(PRESETS)}")
    preset = PRESETS[key]
    sizes = {"transforms": transforms, "hidden": hidden, "bins": bins}
    given = {k: v for k, v in sizes.items() if v is not None and k in preset.arguments}
    if "hidden" in given:
        given["hidden"] = parse_hidden(given["hidden"])
    try:
        flow = preset.build(theta_dim, **{**preset.arguments, **given, "context": x_dim})
    except TypeError as error:
        raise ValueError(f"posterior_flow: the {key} preset takes no context ({error})") from None
    return flow


def _as_list(value: Tensor | Sequence[float] | None) -> list[float] | None:
    if value is None:
        return None
    return [float(v) for v in (value.tolist() if isinstance(value, Tensor) else value)]


class NeuralPosterior(Configurable, nn.Module):
    r"""An amortised posterior $q(\theta \mid x)$: a conditional flow behind fixed z-scorings of $\theta$ and $x$.

    Built by [`fit_posterior`][flowkit.inference.fit_posterior]; saved and loaded with [`flowkit.io`][flowkit.io].
    Observations `x` are one vector `(x_dim,)` or a batch `(B, x_dim)`; they are cast to the flow's dtype.

    Arguments:
        flow: a conditional flow on `(theta_dim,)` with `x_dim` context features.
        theta_loc: the location $m_\theta$ of the parameters' z-scoring (`theta_dim` numbers).
        theta_scale: its scale $s_\theta > 0$.
        x_loc: the location $m_x$ of the data's z-scoring (`x_dim` numbers).
        x_scale: its scale $s_x > 0$.
        lower: the prior's lower bounds (`theta_dim` numbers), or None for an unbounded prior.
        upper: the prior's upper bounds, or None.

    Examples:
        >>> import torch
        >>> from flowkit.inference import NeuralPosterior, posterior_flow
        >>> flow = posterior_flow(2, 3, transforms=1, hidden=(8,))
        >>> posterior = NeuralPosterior(flow, [0, 0], [1, 1], [0] * 3, [1] * 3)
        >>> posterior.sample(5, torch.zeros(3)).shape
        torch.Size([5, 2])
    """

    def __init__(
        self,
        flow: FlowModel,
        theta_loc: Sequence[float],
        theta_scale: Sequence[float],
        x_loc: Sequence[float],
        x_scale: Sequence[float],
        lower: Sequence[float] | None = None,
        upper: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(flow, nn.Module) or not hasattr(flow, "log_prob") or not hasattr(flow, "sample"):
            raise ValueError(f"NeuralPosterior: flow must be a flowkit flow, got {type(flow).__name__}")
        shape = tuple(getattr(flow, "event_shape", ()))
        if len(shape) != 1:
            raise ValueError(f"NeuralPosterior: the flow's events must be vectors (theta_dim,), got {shape}")
        theta_dim, x_dim = shape[0], len(x_loc)
        context = int(getattr(flow, "context_features", 0) or 0)
        if context != x_dim:
            raise ValueError(
                f"NeuralPosterior: the flow takes {context} context features but the data have {x_dim}; "
                f"build it with context={x_dim}"
            )
        if len(theta_loc) != theta_dim or len(theta_scale) != theta_dim or len(x_scale) != x_dim:
            raise ValueError("NeuralPosterior: theta_loc and theta_scale need theta_dim numbers, x_scale x_dim")
        if (lower is None) != (upper is None):
            raise ValueError("NeuralPosterior: give both lower and upper bounds, or neither")
        if lower is not None and (len(lower) != theta_dim or len(upper) != theta_dim):
            raise ValueError(f"NeuralPosterior: lower and upper need {theta_dim} numbers each")
        self.flow = flow
        self.theta_standardization = Standardization(list(theta_loc), list(theta_scale))
        self.x_standardization = Standardization(list(x_loc), list(x_scale))
        dtype = next((p.dtype for p in flow.parameters() if p.is_floating_point()), torch.get_default_dtype())
        self.theta_standardization.to(dtype)
        self.x_standardization.to(dtype)
        self.bounded = lower is not None
        if lower is not None and upper is not None:
            low, high = torch.tensor(_as_list(lower), dtype=dtype), torch.tensor(_as_list(upper), dtype=dtype)
            if not bool((low < high).all()):
                raise ValueError("NeuralPosterior: every lower bound must be below its upper bound")
            self.register_buffer("lower", low)
            self.register_buffer("upper", high)
        self.theta_dim, self.x_dim = theta_dim, x_dim

    @property
    def event_shape(self) -> torch.Size:
        """The parameters' shape `(theta_dim,)`."""
        return torch.Size((self.theta_dim,))

    @property
    def dtype(self) -> torch.dtype:
        return self.theta_standardization.loc.dtype

    # ------------------------------------------------------------- inputs
    def _x(self, x: object, where: str) -> tuple[Tensor, bool]:
        """`x` as `(B, x_dim)` in the flow's dtype, and whether one observation `(x_dim,)` was given."""
        if not isinstance(x, Tensor) or not (x.is_floating_point() or x.dtype in (torch.int32, torch.int64)):
            raise ValueError(f"{where}: x must be a real torch.Tensor, got {type(x).__name__}")
        single = x.dim() == 1
        x = x.to(self.dtype).reshape(1, -1) if single else x.to(self.dtype)
        if x.dim() != 2 or x.shape[-1] != self.x_dim:
            raise ValueError(f"{where}: x must have shape ({self.x_dim},) or (B, {self.x_dim}), got {tuple(x.shape)}")
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{where}: x contains non-finite values (NaN or inf)")
        return x, single

    def _context(self, x: Tensor) -> Tensor:
        return self.x_standardization(x)[0]

    def in_support(self, theta: Tensor) -> Tensor:
        """A boolean per parameter vector: inside the prior's bounds (always True without bounds)."""
        if not self.bounded:
            return torch.ones(theta.shape[:-1], dtype=torch.bool, device=theta.device)
        return ((theta >= self.lower) & (theta <= self.upper)).all(-1)

    # ------------------------------------------------------------- density
    def path_log_likelihood(self, theta: Tensor, x: Tensor) -> Tensor:
        r"""$\log q(\theta_i \mid x_i)$ of training pairs, without the prior's bounds (what NPE maximises)."""
        z, ladj = self.theta_standardization(theta)
        return self.flow.log_prob(z, self._context(x)) + ladj

    def log_prob(self, theta: Tensor, x: Tensor) -> Tensor:
        r"""$\log q(\theta \mid x)$, $-\infty$ outside the prior's bounds (not renormalised inside).

        Arguments:
            theta: parameters `(..., theta_dim)`; for a batch `x` of `B` observations, `(..., B, theta_dim)`.
            x: one observation `(x_dim,)` or `B` of them `(B, x_dim)`.

        Returns:
            The log densities, `theta`'s batch shape.

        Raises:
            ValueError: for shapes that do not fit, or non-finite values.
        """
        where = "NeuralPosterior.log_prob"
        x, single = self._x(x, where)
        if not isinstance(theta, Tensor) or theta.shape[-1:] != (self.theta_dim,):
            shape = tuple(theta.shape) if isinstance(theta, Tensor) else type(theta).__name__
            raise ValueError(f"{where}: theta must have shape (..., {self.theta_dim}), got {shape}")
        theta = theta.to(self.dtype)
        if not bool(torch.isfinite(theta).all()):
            raise ValueError(f"{where}: theta contains non-finite values (NaN or inf)")
        context = x[0] if single else x
        try:
            context = context.expand(*theta.shape[:-1], self.x_dim)
        except RuntimeError:
            raise ValueError(
                f"{where}: theta's batch shape {tuple(theta.shape[:-1])} does not end with the {x.shape[0]} "
                "observations of x"
            ) from None
        value = self.path_log_likelihood(theta, context)
        return torch.where(self.in_support(theta), value, torch.full_like(value, -math.inf))

    # ------------------------------------------------------------- samples
    @torch.no_grad()
    def _draw(self, n: int, context: Tensor) -> Tensor:
        z = self.flow.sample((n,), context)  # (n, B, theta_dim)
        return self.theta_standardization.inverse(z)[0]

    @torch.no_grad()
    def sample(self, n: int, x: Tensor, *, max_rounds: int = 100) -> Tensor:
        """`n` posterior samples given each observation.

        Under a box prior, samples outside it are rejected and drawn again (at most `max_rounds` rounds).

        Arguments:
            n: samples per observation.
            x: one observation `(x_dim,)` or `B` of them `(B, x_dim)`.
            max_rounds: rounds of rejection before giving up.

        Returns:
            `(n, theta_dim)` for one observation, `(n, B, theta_dim)` for `B`.

        Raises:
            ValueError: for bad `x`, or when fewer than `n` samples fall inside the prior in `max_rounds` rounds
                (the posterior has leaked out of the prior's support).
        """
        where = "NeuralPosterior.sample"
        n = int(check_number(n, "n", where=where, integer=True, low=1))
        x, single = self._x(x, where)
        context = self._context(x)
        theta = self._draw(n, context)
        if self.bounded:
            theta = self._rejected(theta, context, n, max_rounds, where)
        return theta[:, 0] if single else theta

    def _rejected(self, theta: Tensor, context: Tensor, n: int, max_rounds: int, where: str) -> Tensor:
        """Fill each observation's column of `theta` `(n, B, D)` with samples inside the prior's box."""
        columns = []
        for b in range(theta.shape[1]):
            kept = [theta[:, b][self.in_support(theta[:, b])]]
            count, rounds, drawn = kept[0].shape[0], 1, n
            while count < n:
                if rounds >= max_rounds:
                    raise ValueError(
                        f"{where}: only {count} of {drawn} samples fell inside the prior's bounds for observation {b} "
                        f"(acceptance {count / drawn:.2g}); the posterior estimate leaks out of the prior"
                    )
                batch = max(n, int(2 * (n - count) * drawn / max(count, 1)))
                more = self._draw(min(batch, 100 * n), context[b : b + 1])[:, 0]
                kept.append(more[self.in_support(more)])
                count, rounds, drawn = count + kept[-1].shape[0], rounds + 1, drawn + more.shape[0]
            columns.append(torch.cat(kept)[:n])
        return torch.stack(columns, 1)

    def map(self, x: Tensor, *, samples: int = 1000, steps: int = 200, lr: float = 0.01) -> Tensor:
        r"""The maximum a posteriori estimate $\arg\max_\theta q(\theta \mid x)$ for each observation.

        The best of `samples` posterior samples is refined by `steps` Adam steps on $\log q$ in the z-scored
        coordinates (kept inside the prior's box).

        Returns:
            `(theta_dim,)` for one observation, `(B, theta_dim)` for `B`.
        """
        where = "NeuralPosterior.map"
        x, single = self._x(x, where)
        samples = int(check_number(samples, "samples", where=where, integer=True, low=1))
        steps = int(check_number(steps, "steps", where=where, integer=True, low=0))
        context = self._context(x)
        with torch.no_grad():
            theta = self.sample(samples, x, max_rounds=100)
            theta = theta if theta.dim() == 3 else theta[:, None]
            best = self.log_prob(theta, x).argmax(0)
            start = theta[best, torch.arange(x.shape[0])]
        z = self.theta_standardization(start)[0].detach().requires_grad_(True)
        optimizer = torch.optim.Adam([z], lr=lr)
        for _ in range(steps):  # gradients of z alone: the flow's parameters keep theirs
            (z.grad,) = torch.autograd.grad(-self.flow.log_prob(z, context).sum(), z)
            optimizer.step()
            if self.bounded:
                with torch.no_grad():
                    low = self.theta_standardization(self.lower)[0]
                    high = self.theta_standardization(self.upper)[0]
                    z.copy_(torch.maximum(torch.minimum(z, high), low))
        theta = self.theta_standardization.inverse(z.detach())[0]
        return theta[0] if single else theta

    def credible_interval(self, x: Tensor, level: float = 0.95, *, samples: int = 10_000) -> tuple[Tensor, Tensor]:
        """The equal-tailed credible interval of each parameter: the `(1 - level) / 2` and `(1 + level) / 2` quantiles.

        Returns:
            `(lower, upper)`, each `(theta_dim,)` for one observation or `(B, theta_dim)` for `B`.
        """
        level = check_number(level, "level", where="NeuralPosterior.credible_interval", positive=True, below=1)
        theta = self.sample(samples, x)
        q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=theta.dtype)
        low, high = torch.quantile(theta, q, dim=0)
        return low, high


def _fused_adam(params: Any, lr: float) -> torch.optim.Optimizer:
    """Adam with torch's fused update (one kernel per step for all parameters), or its default where fused is refused.

    On one CPU thread the fused step of a 67k-parameter NSF took a third of the multi-tensor one's time (2.0 against
    6.2 ms); its numbers agree with the per-tensor update to float rounding, not bit for bit.
    """
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, ValueError):  # a device or dtype without the fused kernel
        return torch.optim.Adam(params, lr=lr)


def _with_regression(flow: FlowModel, theta: Tensor, x: Tensor, where: str) -> FlowModel:
    """`flow` behind a [`RegressionWhitening`][flowkit.bijectors.RegressionWhitening] fitted to z-scored pairs."""
    bijector, base = getattr(flow, "bijector", None), getattr(flow, "base", None)
    if not getattr(flow, "bijective", False) or not isinstance(bijector, Bijector) or base is None:
        kind = type(flow).__name__
        raise ValueError(f"{where}: regression=True needs a flowkit Flow (a bijector over a base), got {kind}")
    dtype = next((p.dtype for p in flow.parameters() if p.is_floating_point()), torch.get_default_dtype())
    layer = RegressionWhitening.from_data(theta, x).to(dtype)
    return Flow(Chain(layer, bijector), base)


def fit_posterior(
    flow: FlowModel,
    theta: Tensor,
    x: Tensor,
    *,
    lower: Tensor | Sequence[float] | None = None,
    upper: Tensor | Sequence[float] | None = None,
    epochs: int = 100,
    batch_size: int = 200,
    lr: float = 5e-4,
    validation_fraction: float = 0.1,
    patience: int | None = 20,
    nonfinite: str = "drop",
    regression: bool = False,
    seed: int | None = None,
    progress: bool = False,
    **fit_options: Any,
) -> tuple[NeuralPosterior, History]:
    r"""Neural posterior estimation: train `flow` as $q(\theta \mid x)$ on simulations with [`fit`][flowkit.train.fit].

    The z-scorings come from the training pairs; a fraction `validation_fraction` is held out for early stopping
    (`patience` epochs without improvement; the best weights are restored), as sbi does by default.

    Arguments:
        flow: a conditional flow on `(theta_dim,)` with `x_dim` context features (see
            [`posterior_flow`][flowkit.inference.posterior_flow]); trained in place.
        theta: parameters `(N, theta_dim)` drawn from the prior.
        x: their simulations `(N, x_dim)`.
        lower: the prior's lower bounds (`theta_dim` numbers), for the posterior's support; or None.
        upper: the prior's upper bounds, or None.
        epochs: the most passes over the training pairs.
        batch_size: pairs per step.
        lr: Adam's learning rate, constant over the run as sbi's (give `schedule="cosine"` to decay it; at a
            fixed, unconverged number of epochs the decay cost C2ST 0.02 to 0.05 against sbi: see `bench/sbi.py`).
        validation_fraction: the share of pairs held out (0: none, no early stopping).
        patience: epochs without improvement of the validation loss before stopping (None: never).
        nonfinite: `"drop"` simulations with NaN or inf (warned, with their count) or `"raise"` a ValueError.
        regression: put a [`RegressionWhitening`][flowkit.bijectors.RegressionWhitening] of the z-scored
            parameters on the z-scored data, fitted to the training pairs, in front of `flow` (a
            [`Flow`][flowkit.flows.Flow]): the flow then models the whitened residual of the linear regression of
            $\theta$ on $x$, which is exact for a linear-Gaussian model and a preconditioning otherwise. It needs
            many more simulations than data features (its error is about $\sqrt{(x_{dim} + 1) / N}$ posterior
            standard deviations), and under a box prior it makes the box's faces oblique: not a default.
        seed: seed of the split, the initial data order and the fit loop.
        progress: show the fit loop's progress bar.
        **fit_options: further arguments of [`fit`][flowkit.train.fit] (`checkpoint_dir`, `callbacks`,
            `schedule`, `clip`, ...); without `optimizer`, Adam with torch's fused update (one kernel per step,
            about 3x faster than the multi-tensor update for these small flows); without `schedule`, a constant
            learning rate.

    Returns:
        `(posterior, history)`: the [`NeuralPosterior`][flowkit.inference.NeuralPosterior] and the fit's
        [`History`][flowkit.train.History].

    Raises:
        ValueError: for mismatched shapes, non-finite parameters, non-finite simulations under
            `nonfinite="raise"`, or bad options.

    Examples:
        >>> import torch
        >>> from flowkit.inference import GaussianLinear, fit_posterior, posterior_flow
        >>> task = GaussianLinear(dim=2)
        >>> theta, x = task.simulations(500, torch.Generator().manual_seed(0))
        >>> posterior, history = fit_posterior(posterior_flow(2, 2, transforms=1, hidden=(16,)), theta, x, epochs=2)
        >>> posterior.sample(10, x[0]).shape
        torch.Size([10, 2])
    """
    where = "fit_posterior"
    if nonfinite not in ("drop", "raise"):
        raise ValueError(f"{where}: nonfinite must be 'drop' or 'raise', got {nonfinite!r}")
    if nonfinite == "raise" and isinstance(x, Tensor) and not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x).all(-1)).sum()) if x.dim() == 2 else -1
        raise ValueError(f"{where}: {bad} simulation(s) contain non-finite values (NaN or inf)")
    theta, x = drop_invalid_simulations(theta, x, where)
    validation_fraction = check_number(validation_fraction, "validation_fraction", where=where, low=0, below=1)
    generator = torch.Generator().manual_seed(seed if seed is not None else int(torch.randint(2**62, ())))
    order = torch.randperm(theta.shape[0], generator=generator)
    n_val = int(round(validation_fraction * theta.shape[0]))
    if theta.shape[0] - n_val < 2:
        raise ValueError(f"{where}: need at least 2 training simulations, got {theta.shape[0] - n_val}")
    train, val = order[n_val:], order[:n_val]
    theta_loc, theta_scale = Standardization.statistics(theta[train])
    x_loc, x_scale = Standardization.statistics(x[train])
    if regression:
        flow = _with_regression(flow, (theta[train] - theta_loc) / theta_scale, (x[train] - x_loc) / x_scale, where)
    posterior = NeuralPosterior(
        flow,
        theta_loc.tolist(),
        theta_scale.tolist(),
        x_loc.tolist(),
        x_scale.tolist(),
        _as_list(lower),
        _as_list(upper),
    )
    steps_per_epoch = math.ceil(len(train) / batch_size)
    options: dict[str, Any] = dict(
        epochs=epochs, batch_size=batch_size, lr=lr, seed=seed, progress=progress, optimizer=_fused_adam, schedule=None
    )
    if n_val > 0:
        options.update(val_data=(theta[val], x[val]), val_every=steps_per_epoch, patience=patience)
    options.update(fit_options)
    history = fit(posterior, MaximumLikelihood(), (theta[train], x[train]), **options)
    posterior.eval()
    return posterior, history
