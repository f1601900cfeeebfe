r"""Flow annealed importance sampling bootstrap (FAB): the $\alpha = 2$ divergence, trained by AIS, without data.

FAB (Midgley et al. 2023) trains a flow $q_\theta$ on a target $p \propto e^{-u}$ by minimising the
$\alpha$-divergence with $\alpha = 2$,

$$
D_2(p \,\|\, q_\theta) \propto \int \frac{p(x)^2}{q_\theta(x)}\, dx, \qquad
\nabla_\theta \int \frac{p^2}{q_\theta} = -\int \frac{p^2}{q_\theta} \nabla_\theta \log q_\theta
= -Z_g\, E_{g}[\nabla_\theta \log q_\theta], \quad g = \frac{p^2/q_\theta}{Z_g},
$$

which is mass-covering. FAB estimates the gradient, an expectation under $g \propto p^2/q$, with
[annealed importance sampling][flowkit.sampling.ais] from the flow to $p^2/q$: with AIS samples $x_i$ and their
self-normalised weights $\bar w_i$ (both without gradient),

$$
\mathcal L(\theta) = -\sum_i \bar w_i \log q_\theta(x_i), \qquad
E[\nabla_\theta \mathcal L] \approx -E_g[\nabla_\theta \log q_\theta] = \nabla_\theta \log \int \frac{p^2}{q_\theta}.
$$

The flow's samples seed AIS and the flow is trained on AIS's improvement of them: the *bootstrap*.

**Prioritised replay buffer** (the paper's Algorithm 2, `replay_buffer=`): every `updates_per_ais`
steps one AIS run adds its samples with their log weights $\log w_i$ (towards $p^2/q_{\theta_{old}}$) to
a first-in-first-out buffer; each step draws a batch from the buffer with probability proportional to
$w_i$ and minimises $-\frac1B \sum_b \log q_\theta(x_b)$. At the next step the drawn points' weights are
moved to the updated flow: $\log w \leftarrow \log w - \log q_{\theta_{new}}(x) + \log q_{\theta_{old}}(x)$.

References:
    Midgley, Stimper, Simm, Schölkopf & Hernández-Lobato, *Flow annealed importance sampling bootstrap*,
    ICLR 2023 (arXiv:2208.01893); Neal, *Annealed importance sampling*, Statistics and Computing 11 (2001).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from .._validation import check_number
from ..flows.base import FlowModel, require_exact_weights
from ..sampling.ais import TRANSITIONS, AISResult, ais, check_step_sizes
from ..sampling.importance import check_target
from ..targets import Target
from .objective import Objective, check_state
from .pathgrad import _latent

__all__ = ["FAB", "PrioritisedReplayBuffer"]


class PrioritisedReplayBuffer:
    """FAB's replay buffer: AIS samples with their log weights, drawn in proportion to the weights.

    Arguments:
        capacity: the most points held (the oldest are replaced first); at least a batch.
        updates_per_ais: training steps per AIS run (each AIS run adds one batch of points).
        min_fill: points gathered (by as many AIS runs as needed) before the first draw; default
            `max(capacity // 10, batch)`, at least a batch.

    Attributes:
        x: the points `(size, *event_shape)`.
        log_w: their current log weights (float64, `(size,)`).
    """

    def __init__(self, capacity: int, updates_per_ais: int = 4, min_fill: int | None = None) -> None:
        where = "PrioritisedReplayBuffer"
        self.capacity = check_number(capacity, "capacity", where=where, integer=True, low=2)
        self.updates_per_ais = check_number(updates_per_ais, "updates_per_ais", where=where, integer=True, low=1)
        if min_fill is not None:
            min_fill = check_number(min_fill, "min_fill", where=where, integer=True, low=1, high=self.capacity)
        self.min_fill = min_fill
        self.x: Tensor | None = None
        self.log_w = torch.empty(0, dtype=torch.float64)
        self._next = 0  # the slot the next point goes to, once the buffer is full

    def __len__(self) -> int:
        return self.log_w.numel()

    def check_batch(self, batch: int) -> int:
        """The number of points to gather before the first draw, for batches of `batch` points."""
        if self.capacity < batch:
            raise ValueError(
                f"FAB: the replay buffer holds {self.capacity} points, fewer than a batch of {batch}; "
                "give a capacity of at least the batch size"
            )
        wanted = max(self.capacity // 10, batch) if self.min_fill is None else self.min_fill
        if wanted < batch:
            raise ValueError(f"FAB: the replay buffer's min_fill {wanted} is smaller than a batch of {batch}")
        return wanted

    def add(self, x: Tensor, log_w: Tensor) -> None:
        """Add points with their log weights (those of zero weight are dropped)."""
        keep = torch.isfinite(log_w)
        x, log_w = x[keep].detach(), log_w[keep].detach().double()
        if self.x is None:
            self.x = x.new_empty(0, *x.shape[1:])
        room = self.capacity - len(self)
        if room > 0:
            self.x = torch.cat([self.x, x[:room]])
            self.log_w = torch.cat([self.log_w, log_w[:room].to(self.log_w.device)])
            x, log_w = x[room:], log_w[room:]
        for start in range(0, x.shape[0], self.capacity):  # full: replace the oldest points
            chunk = slice(start, min(start + self.capacity, x.shape[0]))
            slots = (self._next + torch.arange(chunk.stop - chunk.start)) % self.capacity
            self.x[slots.to(self.x.device)] = x[chunk]
            self.log_w[slots] = log_w[chunk].to(self.log_w.device)
            self._next = int(slots[-1] + 1) % self.capacity

    def state_dict(self) -> dict[str, Any]:
        """The points (None before the first), their log weights and the slot the next point goes to."""
        return {"x": self.x, "log_w": self.log_w, "next": self._next}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a [`state_dict`][flowkit.train.fab.PrioritisedReplayBuffer.state_dict] (copied).

        Raises:
            ValueError: if `state` is not a buffer's state of at most `capacity` points.
        """
        where = "PrioritisedReplayBuffer"
        x, log_w, slot = check_state(state, ("x", "log_w", "next"), where)
        if not (isinstance(log_w, Tensor) and log_w.dtype == torch.float64 and log_w.dim() == 1):
            raise ValueError(f"{where}: log_w must be a float64 tensor of shape (size,)")
        if log_w.numel() > self.capacity:
            raise ValueError(f"{where}: the state holds {log_w.numel()} points, more than the capacity {self.capacity}")
        if x is None:
            valid = log_w.numel() == 0
        else:
            valid = isinstance(x, Tensor) and x.is_floating_point() and x.dim() >= 1 and x.shape[0] == log_w.numel()
        if not valid:
            raise ValueError(f"{where}: x must be a floating tensor with one point per log weight")
        self._next = check_number(slot, "next", where=where, integer=True, low=0, below=self.capacity)
        self.x = None if x is None else x.clone()
        self.log_w = log_w.clone().cpu()

    def sample(self, batch: int, generator: torch.Generator | None = None) -> Tensor:
        """Indices of `batch` points drawn with replacement, with probability proportional to their weights."""
        if len(self) == 0:
            raise ValueError("FAB: the replay buffer is empty (every AIS weight was zero)")
        probabilities = torch.softmax(self.log_w, 0)
        return torch.multinomial(probabilities, batch, replacement=True, generator=generator)

    def adjust(self, index: Tensor, log_q_old: Tensor, log_q_new: Tensor, alpha: float = 2.0) -> None:
        r"""Move the weights of the points `index` from $p^\alpha q_{old}^{1-\alpha}$ to $p^\alpha q_{new}^{1-\alpha}$.

        $\log w \leftarrow \log w + (\alpha - 1)(\log q_{old}(x) - \log q_{new}(x))$; a point drawn twice is
        adjusted once.
        """
        delta = ((alpha - 1.0) * (log_q_old - log_q_new)).double().to(self.log_w.device)
        unique, first = _first_occurrences(index)
        updated = self.log_w[unique] + delta[first]
        self.log_w[unique] = torch.where(torch.isnan(updated), torch.full_like(updated, -math.inf), updated)


def _first_occurrences(index: Tensor) -> tuple[Tensor, Tensor]:
    """The distinct values of `index` and the position of the first occurrence of each."""
    unique, inverse = torch.unique(index, return_inverse=True)
    positions = torch.arange(index.numel(), device=index.device)
    first = torch.full((unique.numel(),), index.numel(), dtype=torch.long, device=index.device)
    first = first.scatter_reduce(0, inverse, positions, reduce="amin")
    return unique, first


class FAB(Objective):
    r"""Flow annealed importance sampling bootstrap: the $\alpha$-divergence ($\alpha = 2$) by AIS towards $p^2/q$.

    `loss(flow, z)` takes the latent batch `z` the fit loop draws: AIS starts at the flow's images of `z` (see
    the module for the loss). The kernels' step sizes, one per intermediate distribution, adapt across steps.

    Arguments:
        target: the [`Target`][flowkit.targets.Target].
        ais_steps: the number of AIS intermediate distributions.
        transition: `"hmc"` or `"metropolis"` (random walk; the one for targets on manifolds, with `domain`).
        replay_buffer: None (AIS at every step), a capacity (an int: a
            [`PrioritisedReplayBuffer`][flowkit.train.fab.PrioritisedReplayBuffer] with its defaults) or a buffer.
        alpha: the divergence's $\alpha$: AIS targets $p^\alpha q^{1-\alpha}$ (2: FAB; 1: AIS towards $p$, a
            self-normalised forward KL).
        step_size: the kernels' initial step size (one number or one per intermediate distribution).
        n_leapfrog: leapfrog steps per HMC trajectory.
        mcmc_steps: kernel applications per intermediate distribution.
        adapt: adapt the step sizes towards the kernel's target acceptance (see [`ais`][flowkit.sampling.ais]).
        domain: the random-walk proposals' [`Domain`][flowkit.domains.Domain] (default the real line).

    Attributes:
        target_evaluations: configurations at which the target's energy (and force) has been evaluated so far.
        step_sizes: the current step sizes, float64 `(ais_steps,)`.
        default_clip: 10, the gradient-norm clip [`fit`][flowkit.train.fit] uses unless given another.

    Its [state][flowkit.train.fab.FAB.state_dict] is saved in the checkpoints of [`fit`][flowkit.train.fit]: a
    resumed run repeats the uninterrupted one bit for bit. `metrics` gives the last AIS run's ESS, acceptance
    and mean step size, the target evaluations and the buffer's size.

    Examples:
        >>> import flowkit
        >>> target = flowkit.targets.DoubleWell()
        >>> flow = flowkit.flows.RealNVP(2, transforms=2)
        >>> objective = flowkit.train.FAB(target, ais_steps=2)
        >>> objective.loss(flow, flow.base.sample((64,))).backward()
        >>> objective.target_evaluations  # 64 samples, 1 + 2 x 5 leapfrog steps each
        704

    """

    needs_data = False
    default_clip = 10.0

    def __init__(
        self,
        target: Target,
        ais_steps: int = 8,
        transition: str = "hmc",
        replay_buffer: int | PrioritisedReplayBuffer | None = None,
        alpha: float = 2.0,
        step_size: float | Tensor = 0.1,
        n_leapfrog: int = 5,
        mcmc_steps: int = 1,
        adapt: bool = True,
        domain: Any = None,
    ) -> None:
        where = "FAB"
        if not isinstance(target, Target):
            raise ValueError(f"FAB: target must be a flowkit.targets.Target, got {type(target).__name__}")
        if transition not in TRANSITIONS:
            raise ValueError(f"FAB: unknown transition {transition!r}; choose one of {TRANSITIONS}")
        self.target = target
        self.ais_steps = check_number(ais_steps, "ais_steps", where=where, integer=True, low=1)
        self.transition = transition
        self.alpha = check_number(alpha, "alpha", where=where, positive=True)
        self.n_leapfrog = check_number(n_leapfrog, "n_leapfrog", where=where, integer=True, low=1)
        self.mcmc_steps = check_number(mcmc_steps, "mcmc_steps", where=where, integer=True, low=1)
        self.adapt = bool(adapt)
        self.domain = domain
        try:
            self.step_sizes = check_step_sizes(step_size, self.ais_steps)
        except ValueError as error:
            raise ValueError(f"FAB: {error}".replace("ais: ", "")) from None
        if isinstance(replay_buffer, bool) or not (
            replay_buffer is None or isinstance(replay_buffer, (int, PrioritisedReplayBuffer))
        ):
            raise ValueError(
                "FAB: replay_buffer must be None, a capacity (int) or a PrioritisedReplayBuffer, "
                f"got {type(replay_buffer).__name__}"
            )
        self.buffer = PrioritisedReplayBuffer(replay_buffer) if isinstance(replay_buffer, int) else replay_buffer
        self.target_evaluations = 0
        self._calls = 0
        self._pending: tuple[Tensor, Tensor] | None = None
        self._ais_metrics: dict[str, float] = {}  # of the last AIS run

    def _ais(self, flow: FlowModel, z: Tensor) -> AISResult:
        result = ais(
            flow,
            self.target,
            self.ais_steps,
            z=z,
            alpha=self.alpha,
            transition=self.transition,
            step_size=self.step_sizes,
            n_leapfrog=self.n_leapfrog,
            mcmc_steps=self.mcmc_steps,
            adapt=self.adapt,
            domain=self.domain,
        )
        self.step_sizes = result.step_sizes
        self.target_evaluations += result.target_evaluations
        enough = int(torch.isfinite(result.log_w).sum()) >= 2
        self._ais_metrics = {
            "ais_ess": result.ess if enough else 0.0,
            "ais_acceptance": float(result.acceptance.mean()),
            "step_size": float(self.step_sizes.mean()),
        }
        return result

    def loss(self, flow: FlowModel, batch: Tensor | int) -> Tensor:
        check_target(flow, self.target, "FAB")
        require_exact_weights(flow, "FAB", density=True)  # AIS starts at flow.latent_to_data(z)
        z = _latent(flow, batch, "FAB")
        if self.buffer is None:
            result = self._ais(flow, z)
            keep = torch.isfinite(result.log_w)
            w = torch.softmax(result.log_w[keep], 0).to(z.dtype)
            return -(w * flow.log_prob(result.samples[keep])).sum()
        return self._buffer_loss(flow, z)

    def _buffer_loss(self, flow: FlowModel, z: Tensor) -> Tensor:
        buffer = self.buffer
        assert buffer is not None
        batch = z.shape[0]
        wanted = buffer.check_batch(batch)
        if buffer.x is not None and buffer.x.device != z.device:  # restored from a checkpoint, on the CPU
            buffer.x = buffer.x.to(z.device)
            if self._pending is not None:
                self._pending = (self._pending[0], self._pending[1].to(z.device))
        if self._pending is not None:  # the flow has been updated since these points were drawn
            index, log_q_old = self._pending
            assert buffer.x is not None
            with torch.no_grad():
                buffer.adjust(index, log_q_old, flow.log_prob(buffer.x[index]), self.alpha)
            self._pending = None
        if self._calls % buffer.updates_per_ais == 0:
            buffer.add(*self._sample(flow, z))
        while len(buffer) < wanted:  # the first step fills the buffer
            with torch.no_grad():
                fresh = flow.base.sample((batch,))
            added = len(buffer)
            buffer.add(*self._sample(flow, fresh))
            if len(buffer) == added:
                raise ValueError("FAB: an AIS run added no point of non-zero weight to the replay buffer")
        self._calls += 1
        index = buffer.sample(batch)
        assert buffer.x is not None
        log_q = flow.log_prob(buffer.x[index])
        self._pending = (index, log_q.detach())
        return -log_q.mean()

    def _sample(self, flow: FlowModel, z: Tensor) -> tuple[Tensor, Tensor]:
        result = self._ais(flow, z)
        return result.samples, result.log_w

    def validation_loss(self, flow: FlowModel, batch: Any) -> Tensor:
        """The held-out negative log-likelihood of target samples (`fit(..., val_data=samples)`), e.g. MD frames."""
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        with torch.no_grad():
            return -flow.log_prob(x).mean()

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {"target_evaluations": float(self.target_evaluations), **self._ais_metrics}
        if self.buffer is not None:
            out["buffer_size"] = float(len(self.buffer))
        return out

    def state_dict(self) -> dict[str, Any]:
        """The step sizes, the target evaluations, the steps taken, the last AIS run's metrics and the buffer.

        `"pending"`: the buffer's points drawn at the last step and their log-densities then (or None).
        """
        pending = None if self._pending is None else {"index": self._pending[0], "log_q": self._pending[1]}
        return {
            "step_sizes": self.step_sizes,
            "target_evaluations": self.target_evaluations,
            "calls": self._calls,
            "ais_metrics": dict(self._ais_metrics),
            "buffer": None if self.buffer is None else self.buffer.state_dict(),
            "pending": pending,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a [`state_dict`][flowkit.train.fab.FAB.state_dict] (copied).

        Raises:
            ValueError: if `state` is not the state of a FAB like this one (its number of AIS steps, with or
                without a buffer of at most its capacity).
        """
        where = "FAB"
        keys = ("step_sizes", "target_evaluations", "calls", "ais_metrics", "buffer", "pending")
        step_sizes, evaluations, calls, metrics, buffer, pending = check_state(state, keys, where)
        if (buffer is None) != (self.buffer is None):
            raise ValueError(f"{where}: the state was written {'without' if self.buffer else 'with'} a replay buffer")
        try:
            step_sizes = check_step_sizes(step_sizes, self.ais_steps).clone()
        except (TypeError, ValueError, RuntimeError) as error:
            raise ValueError(f"{where}: {error}".replace("ais: ", "")) from None
        evaluations = check_number(evaluations, "target_evaluations", where=where, integer=True, low=0)
        calls = check_number(calls, "calls", where=where, integer=True, low=0)
        if not (isinstance(metrics, dict) and all(isinstance(v, float) for v in metrics.values())):
            raise ValueError(f"{where}: ais_metrics must map names to numbers")
        if self.buffer is not None:
            self.buffer.load_state_dict(buffer)
        if pending is not None:
            index, log_q = check_state(pending, ("index", "log_q"), f"{where} (pending)")
            if not (
                self.buffer is not None
                and isinstance(index, Tensor)
                and isinstance(log_q, Tensor)
                and index.dtype == torch.int64
                and index.dim() == 1
                and index.shape == log_q.shape
                and log_q.is_floating_point()
                and (index.numel() == 0 or 0 <= int(index.min()) <= int(index.max()) < len(self.buffer))
            ):
                raise ValueError(f"{where}: pending must hold buffer indices and one log-density per index")
            pending = (index.clone(), log_q.clone())
        self.step_sizes, self.target_evaluations, self._calls = step_sizes, evaluations, calls
        self._ais_metrics, self._pending = dict(metrics), pending
