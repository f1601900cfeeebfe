r"""Point processes with exact likelihoods, to simulate sequences and measure a model against the truth.

Each simulator draws sequences on $(0, T]$ exactly and evaluates the exact log-likelihood of any sequence,
$\log p = \sum_i \log\lambda_{m_i}(t_i) - \int_0^T \sum_k \lambda_k(t)\,dt$ for an intensity model (or the product of
interval densities and the final survival term for a renewal process), so the *exact NLL per event* of its own
samples, the floor a model can reach, is known.

- [`Hawkes`][flowkit.events.Hawkes]: $\lambda_k(t) = \mu_k + \sum_{t_i < t} \alpha_{k m_i}\beta_{k m_i}
  e^{-\beta_{k m_i}(t - t_i)}$ (uni- or multivariate), by Ogata's thinning, with the compensator in closed form
  $\Lambda_k(T) = \mu_k T + \sum_i \alpha_{k m_i}(1 - e^{-\beta_{k m_i}(T - t_i)})$.
- [`SelfCorrecting`][flowkit.events.SelfCorrecting]: $\lambda(t) = \exp(\mu t - \alpha N(t^-))$, exactly by
  inverting the compensator between events.
- [`Renewal`][flowkit.events.Renewal]: i.i.d. gamma or log-normal inter-event times.
- [`MarkovModulatedPoisson`][flowkit.events.MarkovModulatedPoisson]: a Poisson rate $\lambda_{s(t)}$ switched by a
  hidden Markov chain with generator $Q$; likelihood by the forward recursion
  $p = \pi^\top \big[\prod_i e^{(Q - \Lambda)\tau_i}\Lambda\big] e^{(Q - \Lambda)(T - t_n)} \mathbf{1}$.

References:
    Ogata, *On Lewis' simulation method for point processes*, IEEE Trans. Inf. Theory 1981;
    Omi, Ueda & Aihara, *Fully neural network based model for general temporal point processes*, NeurIPS 2019
    (the synthetic benchmarks); Fischer & Meier-Hellstern, *The Markov-modulated Poisson process cookbook*, 1993.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy import linalg, stats

from .data import EventSequence, EventSequences

__all__ = [
    "PointProcess",
    "Hawkes",
    "SelfCorrecting",
    "Renewal",
    "MarkovModulatedPoisson",
    "SIMULATORS",
    "simulator",
    "simulate",
]


class PointProcess:
    """The interface of a simulator with an exact likelihood.

    Attributes:
        num_marks: the number of marks.
        t_end: the default window end of [`simulate`][flowkit.events.simulate].
        mean_rate: the stationary (or long-run) number of events per unit time, for sizing a data set.
    """

    num_marks: int = 1
    t_end: float = 100.0
    mean_rate: float = 1.0

    def _sample_one(self, t_end: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def sequence_log_likelihood(self, sequence: EventSequence) -> float:
        """The exact log-likelihood of one sequence (times and marks, on its window)."""
        raise NotImplementedError

    def intensity(self, sequence: EventSequence, grid: np.ndarray) -> np.ndarray:
        """The ground intensity (summed over marks) given the sequence's past, on a time `grid`."""
        raise NotImplementedError

    def sample(self, num_sequences: int, t_end: float | None = None, seed: int | None = None) -> EventSequences:
        """Draw `num_sequences` sequences on `(0, t_end]` (empty ones are drawn again).

        Raises:
            ValueError: for a non-positive count or window.
        """
        t_end = self.t_end if t_end is None else float(t_end)
        if num_sequences < 1 or not t_end > 0:
            raise ValueError(f"{type(self).__name__}.sample: needs num_sequences >= 1 and t_end > 0")
        rng = np.random.default_rng(seed)
        out = []
        while len(out) < num_sequences:
            times, marks = self._sample_one(t_end, rng)
            if len(times):
                out.append({"times": times, "marks": marks, "t_end": t_end, "name": len(out)})
        return EventSequences(out, self.num_marks)

    def log_likelihood(self, sequences: EventSequences) -> np.ndarray:
        """The exact log-likelihood of each sequence `(N,)`."""
        return np.array([self.sequence_log_likelihood(s) for s in sequences])

    def nll_per_event(self, sequences: EventSequences) -> float:
        """The exact negative log-likelihood per event of `sequences`."""
        return -float(self.log_likelihood(sequences).sum()) / sequences.num_events


def _matrix(value: Any, k: int, name: str) -> np.ndarray:
    array = np.broadcast_to(np.asarray(value, dtype=np.float64), (k, k)).copy()
    if not np.isfinite(array).all():
        raise ValueError(f"Hawkes: {name} must be finite")
    return array


class Hawkes(PointProcess):
    r"""Hawkes process with exponential kernels, $\phi_{kj}(s) = \alpha_{kj}\beta_{kj}e^{-\beta_{kj}s}$.

    $\alpha_{kj}$ is the expected number of events of mark $k$ that one event of mark $j$ triggers; the process is
    stationary when the spectral radius of $\alpha$ is below 1, with mean rates $(I - \alpha)^{-1}\mu$.

    Arguments:
        mu: background rates $\mu_k$ (a number for the univariate process, or `(K,)`).
        alpha: branching ratios $\alpha_{kj}$ (a number or `(K, K)`).
        beta: decay rates $\beta_{kj} > 0$ (a number or `(K, K)`).
        t_end: default window end.

    Examples:
        >>> h = Hawkes(mu=0.5, alpha=0.5, beta=2.0)
        >>> seqs = h.sample(3, t_end=50.0, seed=0)
        >>> h.log_likelihood(seqs).shape
        (3,)
    """

    def __init__(self, mu: Any = 0.2, alpha: Any = 0.8, beta: Any = 1.0, t_end: float = 100.0) -> None:
        self.mu = np.atleast_1d(np.asarray(mu, dtype=np.float64))
        k = self.num_marks = len(self.mu)
        self.alpha, self.beta = _matrix(alpha, k, "alpha"), _matrix(beta, k, "beta")
        if (self.mu <= 0).any() or (self.alpha < 0).any() or (self.beta <= 0).any():
            raise ValueError("Hawkes: needs mu > 0, alpha >= 0 and beta > 0")
        radius = float(np.abs(np.linalg.eigvals(self.alpha)).max())
        if radius >= 1:
            raise ValueError(f"Hawkes: the spectral radius of alpha is {radius:.3g} >= 1 (an explosive process)")
        self.t_end = float(t_end)
        self.mean_rate = float(np.linalg.solve(np.eye(k) - self.alpha, self.mu).sum())

    def _sample_one(self, t_end: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        k, ab = self.num_marks, self.alpha * self.beta
        decay = np.zeros((k, k))  # decay[k, j] = sum over past events of mark j of exp(-beta_kj (t - t_i))
        t, times, marks = 0.0, [], []
        while True:
            bound = float((self.mu + (ab * decay).sum(1)).sum())  # the intensity only decays until the next event
            wait = rng.exponential(1 / bound)
            if t + wait > t_end:
                break
            t += wait
            decay *= np.exp(-self.beta * wait)
            rates = self.mu + (ab * decay).sum(1)
            u = rng.uniform() * bound
            if u < rates.sum():
                mark = int(np.searchsorted(np.cumsum(rates), u, side="right"))
                mark = min(mark, k - 1)
                times.append(t)
                marks.append(mark)
                decay[:, mark] += 1.0
        return np.array(times), np.array(marks, dtype=np.int64)

    def _rates_before_events(self, sequence: EventSequence) -> np.ndarray:
        r"""$\lambda_k(t_i^-)$ for every event, `(n, K)`."""
        k, ab = self.num_marks, self.alpha * self.beta
        decay, previous = np.zeros((k, k)), sequence.t_start
        out = np.empty((len(sequence), k))
        for i, (t, m) in enumerate(zip(sequence.times, sequence.marks, strict=True)):
            decay *= np.exp(-self.beta * (t - previous))
            out[i] = self.mu + (ab * decay).sum(1)
            decay[:, m] += 1.0
            previous = t
        return out

    def compensator(self, sequence: EventSequence, t: float) -> np.ndarray:
        r"""$\Lambda_k(t) = \int_{t_\mathrm{start}}^t \lambda_k$, per mark `(K,)`, in closed form."""
        past = sequence.times < t
        ti, mi = sequence.times[past], sequence.marks[past]
        jumps = self.alpha[:, mi] * (1 - np.exp(-self.beta[:, mi] * (t - ti)))
        return self.mu * (t - sequence.t_start) + jumps.sum(1)

    def sequence_log_likelihood(self, sequence: EventSequence) -> float:
        rates = self._rates_before_events(sequence)
        log_rates = np.log(rates[np.arange(len(sequence)), sequence.marks]).sum()
        return float(log_rates - self.compensator(sequence, sequence.t_end).sum())

    def intensity(self, sequence: EventSequence, grid: np.ndarray) -> np.ndarray:
        grid = np.asarray(grid, dtype=np.float64)
        out = np.empty(len(grid))
        for g, t in enumerate(grid):
            past = sequence.times < t
            ti, mi = sequence.times[past], sequence.marks[past]
            ab = self.alpha[:, mi] * self.beta[:, mi] * np.exp(-self.beta[:, mi] * (t - ti))
            out[g] = float((self.mu + ab.sum(1)).sum())
        return out


class SelfCorrecting(PointProcess):
    r"""Self-correcting process, $\lambda(t) = \exp(\mu t - \alpha N(t^-))$: each event lowers the rate.

    Arguments:
        mu: growth rate $\mu > 0$.
        alpha: the drop $\alpha > 0$ of the log-rate at each event.
        t_end: default window end.

    Examples:
        >>> sc = SelfCorrecting()
        >>> float(sc.nll_per_event(sc.sample(2, t_end=20.0, seed=1))) > 0
        True
    """

    def __init__(self, mu: float = 1.0, alpha: float = 1.0, t_end: float = 100.0) -> None:
        if not (mu > 0 and alpha > 0):
            raise ValueError(f"SelfCorrecting: needs mu > 0 and alpha > 0, got {mu}, {alpha}")
        self.mu, self.alpha, self.t_end = float(mu), float(alpha), float(t_end)
        self.mean_rate = self.mu / self.alpha

    def _sample_one(self, t_end: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        t, n, times = 0.0, 0, []
        while True:  # invert the compensator: exp(mu t') = exp(mu t) + mu E exp(alpha n)
            e = rng.exponential()
            t = float(np.logaddexp(self.mu * t, math.log(self.mu * e) + self.alpha * n)) / self.mu
            if t > t_end:
                break
            times.append(t)
            n += 1
        return np.array(times), np.zeros(len(times), dtype=np.int64)

    def _integral(self, a: np.ndarray, b: np.ndarray, n: np.ndarray) -> np.ndarray:
        r"""$\int_a^b e^{\mu s - \alpha n} ds$, without overflow."""
        mu = self.mu
        return np.exp(mu * b - self.alpha * n) * -np.expm1(-mu * (b - a)) / mu

    def sequence_log_likelihood(self, sequence: EventSequence) -> float:
        t, n = sequence.times, np.arange(len(sequence))
        starts = np.concatenate([[sequence.t_start], t])
        ends = np.concatenate([t, [sequence.t_end]])
        counts = np.arange(len(sequence) + 1)
        log_rates = (self.mu * (t - sequence.t_start) - self.alpha * n).sum()
        integral = self._integral(starts - sequence.t_start, ends - sequence.t_start, counts)  # clock from t_start
        return float(log_rates - integral.sum())

    def intensity(self, sequence: EventSequence, grid: np.ndarray) -> np.ndarray:
        grid = np.asarray(grid, dtype=np.float64)
        n = np.searchsorted(sequence.times, grid, side="left")
        return np.exp(self.mu * (grid - sequence.t_start) - self.alpha * n)


class Renewal(PointProcess):
    r"""Renewal process: i.i.d. inter-event times, gamma or log-normal.

    Arguments:
        distribution: `"gamma"` (shape $k$, scale $\theta$) or `"lognormal"` ($\log\tau \sim \mathcal{N}(\mu,
            \sigma^2)$).
        shape: $k$ (gamma) or $\sigma$ (log-normal).
        scale: $\theta$ (gamma) or $e^\mu$ (log-normal).
        t_end: default window end.

    Examples:
        >>> r = Renewal("gamma", shape=0.5, scale=2.0)
        >>> r.sample(2, t_end=30.0, seed=0).num_marks
        1
    """

    def __init__(
        self, distribution: str = "gamma", shape: float = 0.5, scale: float = 2.0, t_end: float = 100.0
    ) -> None:
        if distribution == "gamma":
            self.law = stats.gamma(a=shape, scale=scale)
        elif distribution == "lognormal":
            self.law = stats.lognorm(s=shape, scale=scale)
        else:
            raise ValueError(f"Renewal: distribution must be 'gamma' or 'lognormal', got {distribution!r}")
        if not (shape > 0 and scale > 0):
            raise ValueError(f"Renewal: needs shape > 0 and scale > 0, got {shape}, {scale}")
        self.distribution, self.t_end = distribution, float(t_end)
        self.mean_rate = 1 / float(self.law.mean())

    def _sample_one(self, t_end: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        chunk = max(16, int(2 * t_end * self.mean_rate))
        times = np.cumsum(self.law.rvs(size=chunk, random_state=rng))
        while times[-1] <= t_end:
            times = np.concatenate([times, times[-1] + np.cumsum(self.law.rvs(size=chunk, random_state=rng))])
        times = times[times <= t_end]
        return times, np.zeros(len(times), dtype=np.int64)

    def sequence_log_likelihood(self, sequence: EventSequence) -> float:
        tau = sequence.inter_times
        return float(self.law.logpdf(tau).sum() + self.law.logsf(sequence.t_end - sequence.times[-1]))

    def intensity(self, sequence: EventSequence, grid: np.ndarray) -> np.ndarray:
        grid = np.asarray(grid, dtype=np.float64)
        previous = np.searchsorted(sequence.times, grid, side="left")
        last = np.concatenate([[sequence.t_start], sequence.times])[previous]
        age = np.maximum(grid - last, 1e-12)
        return np.exp(self.law.logpdf(age) - self.law.logsf(age))


class MarkovModulatedPoisson(PointProcess):
    r"""Markov-modulated Poisson process: rate $\lambda_s$ in hidden state $s$, switched with generator $Q$.

    The chain starts from its stationary distribution $\pi$ ($\pi^\top Q = 0$).

    Arguments:
        rates: the Poisson rate of each hidden state `(S,)`.
        switching: the off-diagonal switching rates `(S, S)` (the diagonal is ignored and set so rows sum to 0).
        t_end: default window end.

    Examples:
        >>> m = MarkovModulatedPoisson([0.2, 3.0], [[0.0, 0.1], [0.2, 0.0]])
        >>> m.sample(2, t_end=50.0, seed=0).num_events > 0
        True
    """

    def __init__(self, rates: Sequence[float] = (0.2, 3.0), switching: Any = ((0.0, 0.1), (0.2, 0.0)),
                 t_end: float = 100.0) -> None:  # fmt: skip
        self.rates = np.asarray(rates, dtype=np.float64)
        s = len(self.rates)
        q = np.array(switching, dtype=np.float64).reshape(s, s)
        np.fill_diagonal(q, 0.0)
        if (self.rates < 0).any() or (q < 0).any() or not (self.rates > 0).any():
            raise ValueError("MarkovModulatedPoisson: rates and switching rates must be non-negative")
        np.fill_diagonal(q, -q.sum(1))
        self.generator = q
        null = linalg.null_space(q.T)[:, 0]
        self.initial = np.abs(null) / np.abs(null).sum()
        self.t_end = float(t_end)
        self.mean_rate = float(self.initial @ self.rates)
        self._m = q - np.diag(self.rates)
        self._eigen: tuple | None = None

    def _sample_one(self, t_end: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        state = int(rng.choice(len(self.rates), p=self.initial))
        t, times = 0.0, []
        while True:
            leave = -self.generator[state, state]
            total = self.rates[state] + leave
            t += rng.exponential(1 / total)
            if t > t_end:
                break
            if rng.uniform() * total < self.rates[state]:
                times.append(t)
            else:
                p = np.clip(self.generator[state], 0, None)
                state = int(rng.choice(len(self.rates), p=p / p.sum()))
        return np.array(times), np.zeros(len(times), dtype=np.int64)

    def _propagator(self, tau: float) -> np.ndarray:
        r"""$e^{(Q - \Lambda)\tau}$ from the eigendecomposition of $Q - \Lambda$ (made once)."""
        if self._eigen is None:
            d, v = np.linalg.eig(self._m)
            ok = np.isreal(d).all() and np.linalg.cond(v) < 1e8
            self._eigen = (d.real, v.real, np.linalg.inv(v.real)) if ok else ()
        if not self._eigen:
            return linalg.expm(self._m * tau)
        d, v, v_inv = self._eigen
        return (v * np.exp(d * tau)) @ v_inv

    def _forward(self, sequence: EventSequence, stop: Callable[[int, np.ndarray, float], None] | None = None) -> float:
        """The log-likelihood by the normalised forward recursion (`stop` sees each filtered vector)."""
        vector, log_norm, previous = self.initial.copy(), 0.0, sequence.t_start
        for i, t in enumerate(sequence.times):
            if stop is not None:
                stop(i, vector, previous)
            vector = vector @ self._propagator(t - previous) * self.rates
            total = vector.sum()
            log_norm += math.log(total)
            vector /= total
            previous = t
        if stop is not None:
            stop(len(sequence), vector, previous)
        tail = (vector @ self._propagator(sequence.t_end - previous)).sum()
        return log_norm + math.log(tail)

    def sequence_log_likelihood(self, sequence: EventSequence) -> float:
        return self._forward(sequence)

    def intensity(self, sequence: EventSequence, grid: np.ndarray) -> np.ndarray:
        grid = np.asarray(grid, dtype=np.float64)
        out = np.empty(len(grid))
        index = np.searchsorted(sequence.times, grid, side="left")

        def fill(i: int, vector: np.ndarray, previous: float) -> None:
            for g in np.flatnonzero(index == i):
                state = vector @ self._propagator(grid[g] - previous)
                out[g] = float(state @ self.rates / state.sum())

        self._forward(sequence, fill)
        return out


#: The built-in simulators by name, each with its default parameters (about one event per unit time).
SIMULATORS: dict[str, Callable[[], PointProcess]] = {
    "poisson": lambda: Hawkes(mu=1.0, alpha=0.0, beta=1.0),
    "hawkes": lambda: Hawkes(mu=0.2, alpha=0.8, beta=1.0),
    "hawkes-multi": lambda: Hawkes(mu=[0.1, 0.2], alpha=[[0.2, 0.4], [0.3, 0.2]], beta=[[1.0, 2.0], [1.5, 1.0]]),
    "self-correcting": lambda: SelfCorrecting(mu=1.0, alpha=1.0),
    "renewal-gamma": lambda: Renewal("gamma", shape=0.5, scale=2.0),
    "renewal-lognormal": lambda: Renewal("lognormal", shape=1.0, scale=math.exp(-0.5)),
    "mmpp": lambda: MarkovModulatedPoisson(rates=[0.2, 3.0], switching=[[0.0, 0.1], [0.2, 0.0]]),
}


def simulator(name: str) -> PointProcess:
    """The built-in simulator `name` (a key of `SIMULATORS`).

    Raises:
        ValueError: for an unknown name.
    """
    if name not in SIMULATORS:
        raise ValueError(f"unknown simulator {name!r}; choose one of {sorted(SIMULATORS)}")
    return SIMULATORS[name]()


def simulate(
    name: str | PointProcess, num_events: int, seed: int = 0, t_end: float | None = None
) -> tuple[EventSequences, PointProcess]:
    """About `num_events` events from a simulator (by name or instance), in sequences on `(0, t_end]`.

    Returns:
        The sequences and the simulator (for its exact likelihood).

    Examples:
        >>> seqs, process = simulate("hawkes", 500, seed=0)
        >>> seqs.num_events > 0, process.nll_per_event(seqs) > 0
        (True, True)
    """
    process = simulator(name) if isinstance(name, str) else name
    t_end = process.t_end if t_end is None else float(t_end)
    count = max(1, math.ceil(num_events / (process.mean_rate * t_end)))
    return process.sample(count, t_end, seed=seed), process
