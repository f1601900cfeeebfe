r"""The event model: a history encoder, an inter-event distribution and a mark head, with the exact likelihood.

For a sequence $(t_i, m_i)_{i=1}^n$ observed on $(t_\mathrm{start}, t_\mathrm{end}]$, with
$\tau_i = t_i - t_{i-1}$ and history vectors $h_i$ from the encoder,

$$
\log p = \sum_{i=1}^n \big[\log p(\tau_i \mid h_i) + \log p(m_i \mid h_i)\big]
       + \log S(t_\mathrm{end} - t_n \mid h_{n+1}),
$$

the last term being the probability that no event falls in the open interval after the last one (zero when the
window ends at the last event). Marks are conditionally independent of the time given the history (Shchur et al.
2020), or, with `marks_on_time=True`, read the time too: $p(m_i \mid h_i, \tau_i)$.

References:
    Shchur, Biloš & Günnemann, *Intensity-free learning of temporal point processes*, ICLR 2020
    (arXiv:1909.12127).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from .._config import Configurable
from .._validation import check_number
from ..nn import MLP
from .data import EventBatch, EventSequences
from .distributions import (
    Exponential,
    FlowInterEvent,
    Gamma,
    InterEventDistribution,
    LogNormalMixture,
    Weibull,
)
from .encoders import ConstantEncoder, GRUEncoder, HistoryEncoder, TransformerEncoder

__all__ = ["EventModel", "DISTRIBUTIONS", "ENCODERS"]

#: The inter-event distributions by name.
DISTRIBUTIONS = {
    "lognormmix": LogNormalMixture,
    "flow": FlowInterEvent,
    "exponential": Exponential,
    "weibull": Weibull,
    "gamma": Gamma,
}
#: The history encoders by name (`"none"`: a constant history, a renewal process).
ENCODERS = ("gru", "transformer", "none")
#: The smallest inter-event time `sample` draws (smaller draws would make tied times in float64).
_MIN_TAU = 1e-9


class EventModel(Configurable, nn.Module):
    r"""A marked temporal point process: encoder, inter-event distribution and mark head.

    The likelihood is given on the [Event sequences](../api/events.md#the-likelihood) page.

    Arguments:
        num_marks: the number of marks $K$.
        distribution: `"lognormmix"`, `"flow"`, `"exponential"`, `"weibull"` or `"gamma"`.
        encoder: `"gru"`, `"transformer"` or `"none"` (no history: a renewal process).
        hidden: the size of the encoder's history vector.
        mark_embedding: the size of the mark embedding.
        context_features: sequence-level context features, concatenated to every history vector.
        marks_on_time: condition the mark on the inter-event time too.
        components: mixture components (`"lognormmix"`).
        transforms: spline (or sigmoidal) layers (`"flow"`).
        transformer: `"spline"` or `"sigmoidal"` (`"flow"`).
        bins: spline bins (`"flow"`).
        heads: attention heads (`"transformer"`).
        layers: transformer layers (`"transformer"`).

    Examples:
        >>> from flowkit.events import EventModel, EventSequences
        >>> seqs = EventSequences([{"times": [0.5, 1.0, 2.5], "marks": [0, 1, 1], "t_end": 3.0}])
        >>> model = EventModel(num_marks=2, hidden=8).double()
        >>> model.log_prob(seqs).shape
        torch.Size([1])
    """

    def __init__(
        self,
        num_marks: int = 1,
        distribution: str = "lognormmix",
        encoder: str = "gru",
        hidden: int = 32,
        mark_embedding: int = 16,
        context_features: int = 0,
        marks_on_time: bool = False,
        components: int = 16,
        transforms: int = 2,
        transformer: str = "spline",
        bins: int = 8,
        heads: int = 2,
        layers: int = 2,
    ) -> None:
        super().__init__()
        self.num_marks = check_number(num_marks, "num_marks", where="EventModel", integer=True, low=1)
        self.context_features = check_number(
            context_features, "context_features", where="EventModel", integer=True, low=0
        )
        if distribution not in DISTRIBUTIONS:
            raise ValueError(f"EventModel: distribution must be one of {sorted(DISTRIBUTIONS)}, got {distribution!r}")
        if encoder not in ENCODERS:
            raise ValueError(f"EventModel: encoder must be one of {list(ENCODERS)}, got {encoder!r}")
        self.distribution_name, self.encoder_name = distribution, encoder
        if encoder == "gru":
            self.encoder: HistoryEncoder = GRUEncoder(self.num_marks, hidden, mark_embedding)
        elif encoder == "transformer":
            self.encoder = TransformerEncoder(self.num_marks, hidden, mark_embedding, heads, layers)
        else:
            self.encoder = ConstantEncoder(hidden)
        features = self.encoder.features + self.context_features
        options = {
            "lognormmix": {"components": components},
            "flow": {"transforms": transforms, "transformer": transformer, "bins": bins},
        }.get(distribution, {})
        self.distribution: InterEventDistribution = DISTRIBUTIONS[distribution](features, **options)
        self.marks_on_time = bool(marks_on_time)
        self.mark_head = MLP(int(self.marks_on_time), self.num_marks, hidden=(), context=features)

    # ------------------------------------------------------------------ pieces

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the model's parameters."""
        return next(self.parameters()).dtype

    def standardize_(self, sequences: EventSequences) -> EventModel:
        r"""Set the standardisation $a, b$ of $\log\tau$ to the mean and standard deviation over `sequences`."""
        mean, std = sequences.log_inter_time_stats()
        self.distribution.log_tau_mean.fill_(mean)
        self.distribution.log_tau_std.fill_(std)
        return self

    def _inputs(self, tau: Tensor) -> tuple[Tensor, Tensor]:
        d = self.distribution
        return d.standardized(tau), tau * torch.exp(-d.log_tau_mean)

    def _with_context(self, h: Tensor, context: Tensor | None) -> Tensor:
        if self.context_features == 0:
            return h
        if context is None or context.shape[-1] != self.context_features:
            got = None if context is None else context.shape[-1]
            raise ValueError(f"EventModel: expected {self.context_features} context features per sequence, got {got}")
        shape = (*h.shape[:-1], self.context_features)
        c = context.to(h.dtype).reshape(context.shape[0], *([1] * (h.dim() - 2)), -1).expand(shape)
        return torch.cat([h, c], dim=-1)

    def histories(self, batch: EventBatch) -> Tensor:
        """The history vectors `(B, L + 1, H)` of a batch (context appended)."""
        y, scaled = self._inputs(batch.tau)
        return self._with_context(self.encoder(y, batch.marks, scaled), batch.context)

    def mark_log_probs(self, h: Tensor, tau: Tensor | None = None) -> Tensor:
        """Log-probabilities `(..., K)` of the marks given history vectors (and the time, with `marks_on_time`)."""
        x = h.new_zeros(*h.shape[:-1], 0)
        if self.marks_on_time:
            if tau is None:
                tau = self.distribution.mean(h)
            x = self.distribution.standardized(tau)[..., None]
        return torch.log_softmax(self.mark_head(x, h), dim=-1)

    def _as_batch(self, data: EventSequences | EventBatch) -> EventBatch:
        if isinstance(data, EventSequences):
            if data.num_marks > self.num_marks:
                raise ValueError(f"EventModel: the data have {data.num_marks} marks, the model {self.num_marks}")
            data = data.batch(dtype=self.dtype)
        return data.to(self.dtype, next(self.parameters()).device)

    # ------------------------------------------------------------------ likelihood

    def event_log_likelihoods(self, batch: EventBatch) -> tuple[Tensor, Tensor]:
        """The terms of the log-likelihood: per event and per sequence.

        Per event `(B, L)` (zero at padding): the log-density of the time plus the mark's log-probability;
        per sequence `(B,)`: the log-survival of the open last interval.
        """
        tau, mask = batch.tau, batch.mask
        h = self.histories(batch)
        h_events = h[:, : tau.shape[1]]
        log_p = self.distribution.log_prob(tau, h_events)
        if self.num_marks > 1:
            log_m = self.mark_log_probs(h_events, tau).gather(-1, batch.marks[..., None])[..., 0]
            log_p = log_p + log_m
        log_p = torch.where(mask, log_p, torch.zeros_like(log_p))
        last = batch.lengths.reshape(-1, 1, 1).expand(-1, 1, h.shape[-1])
        h_last = h.gather(1, last)[:, 0]
        open_interval = batch.survival
        positive = open_interval > 0
        safe = torch.where(positive, open_interval, torch.ones_like(open_interval))
        log_s = self.distribution.log_survival(safe, h_last)
        return log_p, torch.where(positive, log_s, torch.zeros_like(log_s))

    def log_likelihood(self, batch: EventBatch) -> Tensor:
        """The exact log-likelihood of each sequence of a batch `(B,)`, survival term included."""
        log_p, log_s = self.event_log_likelihoods(batch)
        return log_p.sum(-1) + log_s

    def log_prob(self, data: EventSequences | EventBatch) -> Tensor:
        """The exact log-likelihood of each sequence `(N,)` of sequences or a batch."""
        return self.log_likelihood(self._as_batch(data))

    @torch.no_grad()
    def nll_per_event(self, data: EventSequences, batch_size: int = 256) -> float:
        """The negative log-likelihood per event over `data` (all sequences, survival terms included), in nats."""
        total = 0.0
        for start in range(0, len(data), batch_size):
            total += float(self.log_prob(data.batch(range(start, min(start + batch_size, len(data))))).sum())
        return -total / data.num_events

    # ------------------------------------------------------------------ prediction and sampling

    @torch.no_grad()
    def predict(self, data: EventSequences | EventBatch) -> tuple[Tensor, Tensor]:
        """Next-event prediction at every event from the history before it.

        Returns:
            The expected inter-event time and the most likely mark, `(B, L)` each (padding included).
        """
        batch = self._as_batch(data)
        h = self.histories(batch)[:, : batch.tau.shape[1]]
        mean = self.distribution.mean(h)
        marks = self.mark_log_probs(h, mean).argmax(-1)
        return mean, marks

    @torch.no_grad()
    def sample(
        self,
        num_sequences: int,
        t_end: float,
        *,
        context: Tensor | None = None,
        max_events: int = 100_000,
        seed: int | None = None,
    ) -> EventSequences:
        """Draw `num_sequences` sequences on `(0, t_end]` by ancestral sampling, all sequences at once.

        Arguments:
            num_sequences: how many sequences.
            t_end: the window end.
            context: sequence-level context `(num_sequences, C)` when the model has one.
            max_events: stop (with a `ValueError`) if a sequence would exceed this many events.
            seed: seed of torch's generator for the draw.

        Draws below $10^{-9}$ are raised to it, so that times stay strictly increasing in float64.

        Raises:
            ValueError: for a bad `t_end` or when `max_events` is reached (an explosive model).
        """
        check_number(t_end, "t_end", where="EventModel.sample", positive=True)
        n = check_number(num_sequences, "num_sequences", where="EventModel.sample", integer=True, low=1)
        if seed is not None:
            torch.manual_seed(seed)
        param = next(self.parameters())
        like = param.new_zeros(n)
        state = self.encoder.initial_state(n, like)
        times, alive = torch.zeros_like(like), torch.ones(n, dtype=torch.bool, device=param.device)
        events: list[tuple[Tensor, Tensor, Tensor]] = []
        while True:
            h = self._with_context(self.encoder.history(state), context)
            tau = self.distribution.sample(h).clamp(min=_MIN_TAU)  # no ties from draws that underflow
            marks = (
                torch.distributions.Categorical(logits=self.mark_log_probs(h, tau)).sample()
                if self.num_marks > 1
                else torch.zeros(n, dtype=torch.long, device=param.device)
            )
            times = times + tau
            alive = alive & (times <= t_end)
            if not bool(alive.any()):
                break
            if len(events) >= max_events:
                raise ValueError(f"EventModel.sample: more than max_events={max_events} events before t_end={t_end}")
            events.append((times.clone(), marks, alive.clone()))
            y, scaled = self._inputs(torch.where(alive, tau, torch.ones_like(tau)))  # finished rows stay finite
            state, _ = self.encoder.advance(state, y, marks, scaled)
        if not events:
            raise ValueError(f"EventModel.sample: no sequence has an event before t_end={t_end}")
        t_all = torch.stack([e[0] for e in events], 1).cpu().double().numpy()
        m_all = torch.stack([e[1] for e in events], 1).cpu().numpy()
        keep = torch.stack([e[2] for e in events], 1).cpu().numpy()
        sequences = [
            {"times": t_all[i][keep[i]], "marks": m_all[i][keep[i]], "t_end": float(t_end), "name": i}
            for i in range(n)
            if keep[i].any()
        ]
        if not sequences:
            raise ValueError(f"EventModel.sample: no sequence has an event before t_end={t_end}")
        return EventSequences(sequences, self.num_marks)

    @torch.no_grad()
    def intensity(self, sequence: EventSequences, grid: Sequence[float] | np.ndarray, index: int = 0) -> np.ndarray:
        r"""The model's ground intensity on a time `grid` for sequence `index`.

        $\lambda^*(t) = p(t - t_{i} \mid h_{i+1}) / S(t - t_{i} \mid h_{i+1})$, with $t_i$ the last event before $t$.
        """
        batch = self._as_batch(sequence.subset([index]))
        h = self.histories(batch)[0]
        seq = sequence[index]
        grid = np.asarray(grid, dtype=np.float64)
        previous = np.searchsorted(seq.times, grid, side="left")
        last_time = np.concatenate([[seq.t_start], seq.times])[previous]
        tau = torch.as_tensor(np.maximum(grid - last_time, 1e-12), dtype=self.dtype, device=h.device)
        hh = h[torch.as_tensor(previous, device=h.device)]
        log_lambda = self.distribution.log_prob(tau, hh) - self.distribution.log_survival(tau, hh)
        return log_lambda.exp().cpu().double().numpy()
