r"""Simulators with reference posteriors: the tasks of simulation-based inference benchmarks.

A [`Task`][flowkit.inference.Task] bundles a prior $p(\theta)$ (with its box bounds where it has them), a
simulator $x \sim p(x \mid \theta)$, observations $x_o$ simulated from known parameters, and a sampler of the
reference posterior $p(\theta \mid x_o)$ against which an amortised posterior is scored:

| task | $\theta$ | $x$ | prior | reference posterior |
|---|---|---|---|---|
| [`GaussianLinear`][flowkit.inference.GaussianLinear] | 10 | 10 | $N(0, 0.1 I)$ | analytic (conjugate Gaussian) |
| [`TwoMoons`][flowkit.inference.TwoMoons] | 2 | 2 | $U(-1, 1)^2$ | analytic sampler (inverting the simulator) |
| [`SLCP`][flowkit.inference.SLCP] | 5 | 8 | $U(-3, 3)^5$ | flowkit's random-walk Metropolis (MCMC), sign-symmetrised |
| [`TransitSpectrum`][flowkit.inference.TransitSpectrum] | 7 | 52 | box | flowkit's random-walk Metropolis (MCMC) |
| [`LinearTransitSpectrum`][flowkit.inference.LinearTransitSpectrum] | 7 | 52 | Gaussian | analytic (linearised) |

The first three follow the definitions of sbibm (Lueckmann et al. 2021); their observations here are
simulated from seeds of flowkit's own (not sbibm's files). Everything is float64.

**Transit spectrum.** A toy of the transmission spectrum of a hot Jupiter in the 52 channels of Ariel
(0.55-7.8 µm), for the seven parameters of the Ariel Data Challenge 2023: the planet's radius $R_p$ (Jupiter
radii), the temperature $T$ (K) and the log10 volume mixing ratios of H$_2$O, CO$_2$, CH$_4$, CO and NH$_3$.
The isothermal atmosphere has the scale height $H = k_B T / (\mu m_u g)$ with $g = G M_p / R_p^2$
($M_p$ one Jupiter mass, $\mu = 2.3$). The opacity is H$_2$ Rayleigh scattering plus each absorber's bands
(Gaussian and Lorentzian profiles in wavelength), $\kappa(\lambda) = \sigma_R (\lambda / 0.55\,\mu m)^{-4} +
\sum_i X_i \sigma_i(\lambda)$, and the planet appears larger by a number of scale heights that grows with
the log of the opacity (Lecavelier des Etangs et al. 2008), so the transit depth is

$$
D(\lambda) = \left(\frac{R_p + H \log(1 + \kappa(\lambda) / \kappa_0)}{R_\star}\right)^2,
$$

in ppm around a Sun-like star, observed with Gaussian noise of 30 ppm per channel. Its linear-Gaussian
variant replaces $D$ by its first-order expansion at the prior's centre and the box prior by a Gaussian, so that
its posterior is Gaussian and known exactly.

References:
    Lueckmann, Boelts, Greenberg, Gonçalves & Macke, *Benchmarking simulation-based inference*, AISTATS 2021;
    Lecavelier des Etangs, Pont, Vidal-Madjar & Sing, *Rayleigh scattering in the transit spectrum of
    HD 189733b*, A&A 481 (2008); Aubin et al., *Simulation-based inference for exoplanet atmospheric
    retrieval: insights from winning the Ariel Data Challenge 2023*, arXiv:2309.09337.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch
from torch import Tensor

from .._validation import check_number
from ..transitions import metropolis_transition

__all__ = [
    "Task",
    "GaussianLinear",
    "TwoMoons",
    "SLCP",
    "TransitSpectrum",
    "LinearTransitSpectrum",
    "TASKS",
    "get_task",
    "drop_invalid_simulations",
]

DTYPE = torch.float64

#: Seeds of the observations: observation `i` is simulated with the generator seeded `OBSERVATION_SEED + i`.
OBSERVATION_SEED = 1_000_000


def _generator(generator: torch.Generator | None) -> torch.Generator:
    return generator if generator is not None else torch.Generator().manual_seed(int(torch.randint(2**62, ())))


def drop_invalid_simulations(theta: Tensor, x: Tensor, where: str = "simulations") -> tuple[Tensor, Tensor]:
    """The pairs `(theta, x)` whose simulation is finite; the others are dropped with a warning that counts them.

    Raises:
        ValueError: if `theta` and `x` are not 2-D tensors with as many rows, or if no simulation is finite.
    """
    for name, t in (("theta", theta), ("x", x)):
        if not isinstance(t, Tensor) or not t.is_floating_point() or t.dim() != 2:
            shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{where}: {name} must be a floating tensor (N, D), got {shape}")
    if theta.shape[0] != x.shape[0]:
        raise ValueError(f"{where}: theta has {theta.shape[0]} rows but x has {x.shape[0]}; give one x per theta")
    if not bool(torch.isfinite(theta).all()):
        raise ValueError(f"{where}: theta contains non-finite values")
    finite = torch.isfinite(x).all(1)
    dropped = int((~finite).sum())
    if dropped == x.shape[0]:
        raise ValueError(f"{where}: all {dropped} simulations are non-finite (NaN or inf); nothing to train on")
    if dropped:
        warnings.warn(
            f"{where}: dropped {dropped} of {x.shape[0]} simulations with non-finite values (NaN or inf)",
            RuntimeWarning,
            stacklevel=3,
        )
        return theta[finite], x[finite]
    return theta, x


class Task:
    """A simulator with a prior, observations and a reference posterior sampler.

    Subclasses set `name`, `parameter_names`, `x_dim`, `reference` (`"analytic"` or `"mcmc"`), the prior's
    `lower` and `upper` bounds (None for an unbounded prior) and implement `sample_prior`, `prior_log_prob`,
    `_simulate` and `_reference_posterior`.

    Attributes:
        name: the task's name in [`TASKS`][flowkit.inference.TASKS] and on the command line.
        parameter_names: one name per parameter (`theta_dim` of them).
        x_dim: the number of numbers in one simulation.
        reference: how the reference posterior is sampled: `"analytic"` (exactly) or `"mcmc"`.
        lower: the prior's lower bounds `(theta_dim,)`, or None.
        upper: the prior's upper bounds `(theta_dim,)`, or None.
    """

    name: str = ""
    parameter_names: tuple[str, ...] = ()
    x_dim: int = 0
    reference: str = "analytic"
    lower: Tensor | None = None
    upper: Tensor | None = None

    @property
    def theta_dim(self) -> int:
        """The number of parameters."""
        return len(self.parameter_names)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(theta_dim={self.theta_dim}, x_dim={self.x_dim})"

    # ------------------------------------------------------------- checks
    def check_theta(self, theta: object, where: str = "") -> Tensor:
        """`theta` as a float64 tensor `(N, theta_dim)` (one row `(theta_dim,)` becomes `(1, theta_dim)`).

        Raises:
            ValueError: for a non-tensor, a wrong width, or non-finite values.
        """
        return self._check(theta, self.theta_dim, "theta", where or f"{self.name}")

    def check_x(self, x: object, where: str = "") -> Tensor:
        """`x` as a float64 tensor `(N, x_dim)`, finite and inside the simulator's support.

        Raises:
            ValueError: for a non-tensor, a wrong width, non-finite values, or a point outside the support.
        """
        where = where or self.name
        x = self._check(x, self.x_dim, "x", where)
        outside = self._outside_support(x)
        if bool(outside.any()):
            raise ValueError(
                f"{where}: {int(outside.sum())} observation(s) lie outside the support of the {self.name} simulator "
                f"(no parameter of the prior can produce them): {self._support_rule()}"
            )
        return x

    def _check(self, t: object, width: int, name: str, where: str) -> Tensor:
        if not isinstance(t, Tensor) or not (t.is_floating_point() or t.dtype in (torch.int32, torch.int64)):
            raise ValueError(f"{where}: {name} must be a real torch.Tensor, got {type(t).__name__}")
        t = t.to(DTYPE)
        if t.dim() == 1:
            t = t.unsqueeze(0)
        if t.dim() != 2 or t.shape[1] != width:
            raise ValueError(f"{where}: {name} must have shape (N, {width}) or ({width},), got {tuple(t.shape)}")
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{where}: {name} contains non-finite values (NaN or inf)")
        return t

    def _outside_support(self, x: Tensor) -> Tensor:
        """A boolean per row of `x`: True where no parameter of the prior can produce it (none by default)."""
        return torch.zeros(x.shape[0], dtype=torch.bool)

    def _support_rule(self) -> str:
        return ""

    def in_prior_support(self, theta: Tensor) -> Tensor:
        """A boolean per row of `theta`: inside the prior's bounds (all True for an unbounded prior)."""
        if self.lower is None or self.upper is None:
            return torch.ones(theta.shape[:-1], dtype=torch.bool)
        return ((theta >= self.lower) & (theta <= self.upper)).all(-1)

    # ------------------------------------------------------------- the generative model
    def sample_prior(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """`n` parameters drawn from the prior, `(n, theta_dim)`."""
        raise NotImplementedError

    def prior_log_prob(self, theta: Tensor) -> Tensor:
        """The prior's log density of rows of `theta` (`-inf` outside its bounds)."""
        raise NotImplementedError

    def simulate(self, theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """One simulation `(N, x_dim)` per row of `theta` `(N, theta_dim)`.

        Raises:
            ValueError: for `theta` of the wrong shape or with non-finite values.
        """
        return self._simulate(self.check_theta(theta, f"{self.name}.simulate"), _generator(generator))

    def _simulate(self, theta: Tensor, generator: torch.Generator) -> Tensor:
        raise NotImplementedError

    def simulations(self, n: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """`n` pairs `(theta, x)` with `theta` from the prior; non-finite simulations dropped with a warning."""
        n = int(check_number(n, "n", where=f"{self.name}.simulations", integer=True, low=1))
        generator = _generator(generator)
        theta = self.sample_prior(n, generator)
        return drop_invalid_simulations(theta, self._simulate(theta, generator), f"{self.name}.simulations")

    def observation(self, index: int = 0) -> tuple[Tensor, Tensor]:
        """The observation number `index`: `(theta_true, x_o)`, simulated from a fixed seed, shapes `(D,)`."""
        index = int(check_number(index, "index", where=f"{self.name}.observation", integer=True, low=0))
        generator = torch.Generator().manual_seed(OBSERVATION_SEED + index)
        theta = self.sample_prior(1, generator)
        return theta[0], self._simulate(theta, generator)[0]

    # ------------------------------------------------------------- the reference
    def reference_posterior(self, x: Tensor, n: int, generator: torch.Generator | None = None) -> Tensor:
        r"""`n` samples `(n, theta_dim)` of the reference posterior $p(\theta \mid x)$ of one observation `x`.

        Raises:
            ValueError: for `x` of the wrong shape, non-finite, or outside the simulator's support.
        """
        where = f"{self.name}.reference_posterior"
        x = self.check_x(x, where)
        if x.shape[0] != 1:
            raise ValueError(f"{where}: give one observation (x_dim,), got {x.shape[0]}")
        n = int(check_number(n, "n", where=where, integer=True, low=1))
        return self._reference_posterior(x[0], n, _generator(generator))

    def _reference_posterior(self, x: Tensor, n: int, generator: torch.Generator) -> Tensor:
        raise NotImplementedError

    def log_likelihood(self, theta: Tensor, x: Tensor) -> Tensor:
        r"""$\log p(x \mid \theta)$ for rows of `theta` and one observation `x`, where the task knows it."""
        raise ValueError(f"{self.name}: the likelihood is not available in closed form")


class _BoxPrior(Task):
    """A task with a uniform prior on the box `[lower, upper]`."""

    def sample_prior(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        u = torch.rand(n, self.theta_dim, dtype=DTYPE, generator=_generator(generator))
        return self.lower + (self.upper - self.lower) * u

    def prior_log_prob(self, theta: Tensor) -> Tensor:
        inside = self.in_prior_support(theta)
        value = -torch.log(self.upper - self.lower).sum()
        return torch.where(inside, value, torch.full_like(value, -math.inf).expand(inside.shape))


# ----------------------------------------------------------------------------- Gaussian linear


class _LinearGaussian(Task):
    r"""A linear-Gaussian model, whose posterior is Gaussian.

    $\theta \sim N(m_0, S_0)$, $x \mid \theta \sim N(A\theta + b, \Sigma)$; the posterior is $N(m, S)$ with

    $$
    S = (S_0^{-1} + A^\top \Sigma^{-1} A)^{-1}, \qquad m = S\,(S_0^{-1} m_0 + A^\top \Sigma^{-1} (x - b)).
    $$
    """

    prior_loc: Tensor
    prior_cov: Tensor
    matrix: Tensor
    offset: Tensor
    noise_cov: Tensor

    def _factor(self) -> None:
        self._prior_chol = torch.linalg.cholesky(self.prior_cov)
        self._noise_chol = torch.linalg.cholesky(self.noise_cov)
        noise_precision = torch.cholesky_inverse(self._noise_chol)
        precision = torch.cholesky_inverse(self._prior_chol) + self.matrix.T @ noise_precision @ self.matrix
        self._posterior_cov = torch.linalg.inv(precision)
        self._posterior_cov = (self._posterior_cov + self._posterior_cov.T) / 2
        self._gain = self._posterior_cov @ self.matrix.T @ noise_precision

    def sample_prior(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        eps = torch.randn(n, self.theta_dim, dtype=DTYPE, generator=_generator(generator))
        return self.prior_loc + eps @ self._prior_chol.T

    def prior_log_prob(self, theta: Tensor) -> Tensor:
        return torch.distributions.MultivariateNormal(self.prior_loc, scale_tril=self._prior_chol).log_prob(theta)

    def mean(self, theta: Tensor) -> Tensor:
        r"""The simulator's noise-free output $A\theta + b$."""
        return theta @ self.matrix.T + self.offset

    def _simulate(self, theta: Tensor, generator: torch.Generator) -> Tensor:
        eps = torch.randn(theta.shape[0], self.x_dim, dtype=DTYPE, generator=generator)
        return self.mean(theta) + eps @ self._noise_chol.T

    def log_likelihood(self, theta: Tensor, x: Tensor) -> Tensor:
        zero = torch.zeros(self.x_dim, dtype=DTYPE)
        return torch.distributions.MultivariateNormal(zero, scale_tril=self._noise_chol).log_prob(x - self.mean(theta))

    def posterior(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The analytic posterior's mean `(theta_dim,)` and covariance `(theta_dim, theta_dim)` given one `x`."""
        x = self.check_x(x, f"{self.name}.posterior")[0]
        prior_part = self._posterior_cov @ torch.cholesky_solve(self.prior_loc[:, None], self._prior_chol)[:, 0]
        return prior_part + self._gain @ (x - self.offset), self._posterior_cov

    def _reference_posterior(self, x: Tensor, n: int, generator: torch.Generator) -> Tensor:
        mean, cov = self.posterior(x)
        eps = torch.randn(n, self.theta_dim, dtype=DTYPE, generator=generator)
        return mean + eps @ torch.linalg.cholesky(cov).T


class GaussianLinear(_LinearGaussian):
    r"""sbibm's Gaussian linear task: $\theta \sim N(0, 0.1\,I_D)$, $x \mid \theta \sim N(\theta, 0.1\,I_D)$.

    The posterior is $N(x / 2, 0.05\,I_D)$ (its `posterior(x)` gives the mean and covariance).

    Arguments:
        dim: the number of parameters `D` (and of data).
        prior_variance: the prior's variance per parameter.
        noise_variance: the simulator's noise variance.

    Examples:
        >>> import torch
        >>> from flowkit.inference import GaussianLinear
        >>> task = GaussianLinear(dim=3)
        >>> mean, cov = task.posterior(torch.ones(3))
        >>> [round(v, 12) for v in mean.tolist()], [round(v, 12) for v in cov.diagonal().tolist()]
        ([0.5, 0.5, 0.5], [0.05, 0.05, 0.05])
    """

    name = "gaussian_linear"
    reference = "analytic"

    def __init__(self, dim: int = 10, prior_variance: float = 0.1, noise_variance: float = 0.1) -> None:
        dim = int(check_number(dim, "dim", where="GaussianLinear", integer=True, low=1))
        prior_variance = check_number(prior_variance, "prior_variance", where="GaussianLinear", positive=True)
        noise_variance = check_number(noise_variance, "noise_variance", where="GaussianLinear", positive=True)
        self.parameter_names = tuple(f"theta_{i + 1}" for i in range(dim))
        self.x_dim = dim
        eye = torch.eye(dim, dtype=DTYPE)
        self.prior_loc, self.prior_cov = torch.zeros(dim, dtype=DTYPE), prior_variance * eye
        self.matrix, self.offset, self.noise_cov = eye, torch.zeros(dim, dtype=DTYPE), noise_variance * eye
        self._factor()


# ----------------------------------------------------------------------------- two moons


class TwoMoons(_BoxPrior):
    r"""sbibm's two moons: a crescent-shaped, bimodal posterior with an exact sampler.

    $\theta \sim U(-1, 1)^2$; $a \sim U(-\pi/2, \pi/2)$, $r \sim N(0.1, 0.01^2)$,
    $p = (r\cos a + 0.25,\ r \sin a)$ and

    $$
    x = p + \big(-|\theta_1 + \theta_2| / \sqrt2,\ (\theta_2 - \theta_1) / \sqrt2\big).
    $$

    The map from $\theta$ to the offset is two-to-one with unit Jacobian, so the posterior is sampled exactly by
    drawing $p$ from the simulator, solving for $\theta$ on a branch chosen with probability 1/2 and keeping
    the solutions inside the prior (sbibm's reference sampler, here vectorised).

    Examples:
        >>> from flowkit.inference import TwoMoons
        >>> task = TwoMoons()
        >>> theta, x = task.observation(0)
        >>> task.reference_posterior(x, 100).shape
        torch.Size([100, 2])
    """

    name = "two_moons"
    parameter_names = ("theta_1", "theta_2")
    x_dim = 2
    reference = "analytic"

    def __init__(self) -> None:
        self.lower = -torch.ones(2, dtype=DTYPE)
        self.upper = torch.ones(2, dtype=DTYPE)

    @staticmethod
    def _moon(n: int, generator: torch.Generator) -> Tensor:
        a = (torch.rand(n, dtype=DTYPE, generator=generator) - 0.5) * math.pi
        r = 0.1 + 0.01 * torch.randn(n, dtype=DTYPE, generator=generator)
        return torch.stack((r * torch.cos(a) + 0.25, r * torch.sin(a)), -1)

    def _simulate(self, theta: Tensor, generator: torch.Generator) -> Tensor:
        offset = torch.stack(
            (-(theta[:, 0] + theta[:, 1]).abs() / math.sqrt(2), (theta[:, 1] - theta[:, 0]) / math.sqrt(2)), -1
        )
        return self._moon(theta.shape[0], generator) + offset

    def _outside_support(self, x: Tensor) -> Tensor:
        # |theta_1 + theta_2| <= 2 and |theta_2 - theta_1| <= 2, r within 10 standard deviations of 0.1
        return (x[:, 0] > 0.25 + 0.2) | (x[:, 0] < 0.25 - math.sqrt(2) - 0.2) | (x[:, 1].abs() > math.sqrt(2) + 0.2)

    def _support_rule(self) -> str:
        return "x_1 in [-1.36, 0.45] and |x_2| <= 1.61"

    def _reference_posterior(self, x: Tensor, n: int, generator: torch.Generator) -> Tensor:
        kept: list[Tensor] = []
        total, rounds = 0, 0
        while total < n:
            rounds += 1
            if rounds > 200:
                raise ValueError(
                    f"{self.name}.reference_posterior: after {200 * 4 * n} draws no parameter of the prior "
                    f"explains x = {x.tolist()}: it lies outside the simulator's support"
                )
            p = self._moon(4 * n, generator)
            sign = torch.where(torch.rand(4 * n, dtype=DTYPE, generator=generator) < 0.5, -1.0, 1.0)
            total_sum = sign * math.sqrt(2) * (p[:, 0] - x[0])  # |theta_1 + theta_2| = sqrt(2) (p_1 - x_1) >= 0
            difference = math.sqrt(2) * (x[1] - p[:, 1])  # theta_2 - theta_1
            theta = torch.stack(((total_sum - difference) / 2, (total_sum + difference) / 2), -1)
            good = self.in_prior_support(theta) & (p[:, 0] >= x[0])
            kept.append(theta[good])
            total += int(good.sum())
        return torch.cat(kept)[:n]


# ----------------------------------------------------------------------------- SLCP


class SLCP(_BoxPrior):
    r"""sbibm's simple likelihood, complex posterior: four 2-D Gaussian draws whose moments are nonlinear in $\theta$.

    $\theta \sim U(-3, 3)^5$; $m = (\theta_1, \theta_2)$, $s_1 = \theta_3^2$, $s_2 = \theta_4^2$,
    $\rho = \tanh\theta_5$ and $x = (x_1, \dots, x_4)$, $x_j \sim N\big(m, \begin{pmatrix} s_1^2 & \rho s_1 s_2
    \\ \rho s_1 s_2 & s_2^2\end{pmatrix} + 10^{-6} I\big)$. The posterior has four modes (the signs of $\theta_3$
    and $\theta_4$).

    Its reference posterior is sampled by flowkit's own MCMC: random-walk Metropolis
    ([`metropolis_transition`][flowkit.transitions.metropolis_transition]) on many chains started by
    importance resampling from the prior, with the proposal's covariance adapted to the chains during warm-up
    and then fixed; the exact symmetry $\theta_3 \to -\theta_3$, $\theta_4 \to -\theta_4$ of the likelihood and
    the prior is applied to the kept states at random, so that the four modes are equally weighted (not exact
    samples: an MCMC estimate, as sbibm's is).
    """

    name = "slcp"
    parameter_names = ("theta_1", "theta_2", "theta_3", "theta_4", "theta_5")
    x_dim = 8
    reference = "mcmc"

    def __init__(self) -> None:
        self.lower = -3 * torch.ones(5, dtype=DTYPE)
        self.upper = 3 * torch.ones(5, dtype=DTYPE)

    @staticmethod
    def _moments(theta: Tensor) -> tuple[Tensor, Tensor]:
        s1, s2, rho = theta[..., 2] ** 2, theta[..., 3] ** 2, torch.tanh(theta[..., 4])
        cov = torch.stack(
            (torch.stack((s1**2 + 1e-6, rho * s1 * s2), -1), torch.stack((rho * s1 * s2, s2**2 + 1e-6), -1)), -2
        )
        return theta[..., :2], cov

    def _simulate(self, theta: Tensor, generator: torch.Generator) -> Tensor:
        mean, cov = self._moments(theta)
        chol = torch.linalg.cholesky(cov)
        eps = torch.randn(theta.shape[0], 4, 2, dtype=DTYPE, generator=generator)
        return (mean[:, None, :] + (chol[:, None] @ eps[..., None])[..., 0]).reshape(-1, 8)

    def log_likelihood(self, theta: Tensor, x: Tensor) -> Tensor:
        mean, cov = self._moments(theta)
        a, b, d = cov[..., 0, 0, None], cov[..., 0, 1, None], cov[..., 1, 1, None]
        det = a * d - b * b
        r = x.reshape(4, 2) - mean[..., None, :]  # (..., 4, 2)
        quad = (d * r[..., 0] ** 2 - 2 * b * r[..., 0] * r[..., 1] + a * r[..., 1] ** 2) / det
        return -0.5 * (quad + torch.log(det) + 2 * math.log(2 * math.pi)).sum(-1)

    def _reference_posterior(self, x: Tensor, n: int, generator: torch.Generator) -> Tensor:
        theta = mcmc_posterior(self, x, n, generator)
        flips = torch.where(torch.rand(n, 2, dtype=DTYPE, generator=generator) < 0.5, -1.0, 1.0)
        theta[:, 2:4] = theta[:, 2:4] * flips
        return theta


# ----------------------------------------------------------------------------- reference by MCMC


def mcmc_posterior(
    task: Task,
    x: Tensor,
    n: int,
    generator: torch.Generator,
    *,
    chains: int = 500,
    warmup: int = 1500,
    thin: int = 10,
    proposals: int = 50_000,
) -> Tensor:
    r"""`n` states of random-walk Metropolis chains on $p(\theta \mid x) \propto p(x \mid \theta) p(\theta)$.

    The chains start from `chains` draws of `proposals` prior samples resampled by their likelihood; during
    `warmup` steps the proposal $\theta' = \theta + 2.38/\sqrt{D}\, L \xi$ takes $L L^\top$ from the chains'
    covariance every 100 steps (then fixed, so the kept chain is a Markov chain with a fixed kernel); every
    `thin`-th state is kept. The kernel is [`metropolis_transition`][flowkit.transitions.metropolis_transition]
    in the whitened coordinates $\xi$.
    """
    dim = task.theta_dim

    def energy_of(theta: Tensor) -> Tensor:
        value = -(task.log_likelihood(theta, x) + task.prior_log_prob(theta))
        return torch.where(torch.isnan(value), torch.full_like(value, math.inf), value)

    candidates = task.sample_prior(proposals, generator)
    log_w = -energy_of(candidates) - task.prior_log_prob(candidates)
    log_w = torch.nan_to_num(log_w, nan=-math.inf)
    index = torch.multinomial(torch.softmax(log_w, 0), chains, replacement=True, generator=generator)
    theta = candidates[index]
    step = 2.38 / math.sqrt(dim)

    def whitening(states: Tensor) -> tuple[Tensor, Tensor]:
        centre = states.mean(0)
        cov = torch.cov(states.T).reshape(dim, dim) + 1e-10 * torch.eye(dim, dtype=DTYPE)
        return centre, torch.linalg.cholesky(cov)

    def run(theta: Tensor, steps: int, keep: bool) -> tuple[Tensor, list[Tensor]]:
        centre, chol = whitening(theta)
        y = torch.linalg.solve_triangular(chol, (theta - centre).T, upper=False).T

        def energy(y: Tensor) -> Tensor:
            return energy_of(centre + y @ chol.T)

        u = energy(y)
        kept = []
        for t in range(steps):
            y, u, _ = metropolis_transition(energy, y, u, step, generator=generator)
            if keep and (t + 1) % thin == 0:
                kept.append(centre + y @ chol.T)
        return centre + y @ chol.T, kept

    for _ in range(max(1, warmup // 100)):
        theta, _ = run(theta, 100, keep=False)
    per_chain = math.ceil(n / chains)
    _, kept = run(theta, per_chain * thin, keep=True)
    states = torch.stack(kept, 1).reshape(-1, dim)  # chain-major
    order = torch.randperm(states.shape[0], generator=generator)[:n]
    return states[order]


# ----------------------------------------------------------------------------- transit spectrum

#: Physical constants (SI) and the fixed planet and star of the transit toy.
_K_B, _M_U, _G = 1.380649e-23, 1.66053907e-27, 6.674e-11
_R_JUP, _M_JUP, _R_SUN = 7.1492e7, 1.898e27, 6.957e8
_MU = 2.3  # mean molecular weight of a H2/He atmosphere

#: Absorption bands (centre in µm, width in µm, strength, profile) of each absorber: the main vibrational bands of
#: H2O, CO2, CH4, CO and NH3 in 0.5-8 µm, with round strengths (a toy, not line lists).
_BANDS: dict[str, tuple[tuple[float, float, float, str], ...]] = {
    "H2O": ((0.94, 0.04, 0.05, "gauss"), (1.15, 0.06, 0.15, "gauss"), (1.4, 0.1, 0.6, "gauss"),
            (1.9, 0.12, 0.8, "gauss"), (2.7, 0.2, 1.0, "gauss"), (6.3, 0.6, 0.9, "lorentz")),
    "CO2": ((1.6, 0.04, 0.02, "gauss"), (2.0, 0.06, 0.1, "gauss"), (2.7, 0.1, 0.5, "gauss"),
            (4.3, 0.12, 3.0, "lorentz")),
    "CH4": ((1.15, 0.05, 0.05, "gauss"), (1.7, 0.08, 0.2, "gauss"), (2.3, 0.1, 0.4, "gauss"),
            (3.3, 0.15, 1.5, "lorentz"), (7.7, 0.4, 1.0, "lorentz")),
    "CO": ((1.57, 0.03, 0.01, "gauss"), (2.35, 0.06, 0.08, "gauss"), (4.6, 0.15, 1.0, "lorentz")),
    "NH3": ((1.5, 0.06, 0.1, "gauss"), (2.0, 0.08, 0.15, "gauss"), (3.0, 0.15, 0.8, "gauss"),
            (6.1, 0.3, 0.6, "lorentz")),
}  # fmt: skip


def _cross_section(wavelength: Tensor, bands: tuple[tuple[float, float, float, str], ...]) -> Tensor:
    sigma = torch.zeros_like(wavelength)
    for centre, width, strength, profile in bands:
        d = (wavelength - centre) / width
        sigma = sigma + strength * (torch.exp(-0.5 * d**2) if profile == "gauss" else 1 / (1 + d**2))
    return sigma


class TransitSpectrum(_BoxPrior):
    r"""A toy transmission spectrum of a hot Jupiter: seven atmospheric parameters, 52 Ariel channels.

    The parameters are $R_p$ (Jupiter radii, in $[0.6, 1.6]$), $T$ (K, in $[500, 2500]$) and the log10 mixing
    ratios of H$_2$O, CO$_2$, CH$_4$, CO, NH$_3$ (each in $[-9, -3]$); the model is the module's (transit depth in
    ppm, Gaussian noise of `noise` ppm). Its reference posterior is sampled by MCMC
    ([`SLCP`][flowkit.inference.SLCP]'s sampler, without the symmetrisation).

    Arguments:
        noise: the noise's standard deviation per channel, in ppm.

    Examples:
        >>> from flowkit.inference import TransitSpectrum
        >>> task = TransitSpectrum()
        >>> theta, x = task.observation(0)
        >>> x.shape, task.parameter_names[:2]
        (torch.Size([52]), ('R_p', 'T'))
    """

    name = "transit"
    parameter_names = ("R_p", "T", "log_H2O", "log_CO2", "log_CH4", "log_CO", "log_NH3")
    x_dim = 52
    reference = "mcmc"

    def __init__(self, noise: float = 30.0) -> None:
        self.noise = check_number(noise, "noise", where=type(self).__name__, positive=True)
        self.lower = torch.tensor([0.6, 500.0, -9, -9, -9, -9, -9], dtype=DTYPE)
        self.upper = torch.tensor([1.6, 2500.0, -3, -3, -3, -3, -3], dtype=DTYPE)
        #: The channels' central wavelengths in µm, log-spaced over Ariel's 0.55-7.8 µm.
        self.wavelength = torch.logspace(math.log10(0.55), math.log10(7.8), self.x_dim, dtype=DTYPE)
        self._sigma = torch.stack([_cross_section(self.wavelength, _BANDS[m]) for m in _BANDS])  # (5, 52)
        self._rayleigh = 1e-9 * (self.wavelength / 0.55) ** -4  # H2 scattering in the units of kappa

    def depth(self, theta: Tensor) -> Tensor:
        """The noise-free transit depth in ppm, `(N, 52)`, of rows of `theta` (differentiable)."""
        radius = theta[..., :1] * _R_JUP
        gravity = _G * _M_JUP / radius**2
        height = _K_B * theta[..., 1:2] / (_MU * _M_U * gravity)
        kappa = self._rayleigh + (10 ** theta[..., 2:]) @ self._sigma
        effective = radius + height * torch.log1p(kappa / 1e-10)
        return 1e6 * (effective / _R_SUN) ** 2

    def _simulate(self, theta: Tensor, generator: torch.Generator) -> Tensor:
        noise = torch.randn(theta.shape[0], self.x_dim, dtype=DTYPE, generator=generator)
        return self.depth(theta) + self.noise * noise

    def log_likelihood(self, theta: Tensor, x: Tensor) -> Tensor:
        r = (x - self.depth(theta)) / self.noise
        return -0.5 * (r**2).sum(-1) - self.x_dim * math.log(self.noise * math.sqrt(2 * math.pi))

    def _outside_support(self, x: Tensor) -> Tensor:
        # depths of planets between 0.6 and 1.6 Jupiter radii plus atmospheres, with 10 sigma of noise
        low, high = 1e6 * (0.6 * _R_JUP / _R_SUN) ** 2, 1e6 * (2.5 * _R_JUP / _R_SUN) ** 2
        return ((x < low - 10 * self.noise) | (x > high + 10 * self.noise)).any(1)

    def _support_rule(self) -> str:
        low, high = 1e6 * (0.6 * _R_JUP / _R_SUN) ** 2, 1e6 * (2.5 * _R_JUP / _R_SUN) ** 2
        return f"transit depths in [{low - 10 * self.noise:.0f}, {high + 10 * self.noise:.0f}] ppm"

    def _reference_posterior(self, x: Tensor, n: int, generator: torch.Generator) -> Tensor:
        return mcmc_posterior(self, x, n, generator)


class LinearTransitSpectrum(_LinearGaussian):
    r"""The transit toy linearised at the centre of its prior, with a Gaussian prior: an analytic posterior.

    $x \mid \theta \sim N\big(D(\theta_0) + J (\theta - \theta_0), \sigma^2 I\big)$, with $D$ the depth of
    [`TransitSpectrum`][flowkit.inference.TransitSpectrum], $\theta_0$ the centre of its box, $J$ the Jacobian
    of $D$ at $\theta_0$ (autograd), and $\theta \sim N(\theta_0, \mathrm{diag}(w / 6)^2)$ for the box widths $w$
    (the box is $\pm 3$ prior standard deviations).

    Arguments:
        noise: the noise's standard deviation per channel, in ppm.

    Examples:
        >>> from flowkit.inference import LinearTransitSpectrum
        >>> task = LinearTransitSpectrum()
        >>> theta, x = task.observation(0)
        >>> mean, cov = task.posterior(x)
        >>> bool((cov.diagonal() < task.prior_cov.diagonal()).all())
        True
    """

    name = "transit_linear"
    parameter_names = TransitSpectrum.parameter_names
    x_dim = 52
    reference = "analytic"

    def __init__(self, noise: float = 30.0) -> None:
        nonlinear = TransitSpectrum(noise)
        self.noise = nonlinear.noise
        self.wavelength = nonlinear.wavelength
        centre = (nonlinear.lower + nonlinear.upper) / 2
        jacobian = torch.autograd.functional.jacobian(lambda t: nonlinear.depth(t[None])[0], centre)
        self.prior_loc = centre
        self.prior_cov = torch.diag(((nonlinear.upper - nonlinear.lower) / 6) ** 2)
        self.matrix = jacobian
        self.offset = nonlinear.depth(centre[None])[0] - jacobian @ centre
        self.noise_cov = self.noise**2 * torch.eye(self.x_dim, dtype=DTYPE)
        self._factor()


#: The built-in tasks by name.
TASKS: dict[str, Callable[[], Task]] = {
    "gaussian_linear": GaussianLinear,
    "two_moons": TwoMoons,
    "slcp": SLCP,
    "transit": TransitSpectrum,
    "transit_linear": LinearTransitSpectrum,
}


def get_task(name: str) -> Task:
    """The built-in task `name` (one of [`TASKS`][flowkit.inference.TASKS]).

    Raises:
        ValueError: for an unknown name.
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
    return TASKS[name]()
