r"""History encoders: the history $\mathcal{H}_i = \{(\tau_j, m_j)\}_{j < i}$ of a sequence as a vector $h_i$.

Each encoder reads the standardised log inter-event times $y_j = (\log\tau_j - a)/b$, the marks $m_j$ (through a
learned embedding) and the inter-event times in units of the typical interval, and returns, for a batch of `L`
events, `L + 1` history vectors `(B, L + 1, H)`: $h_i$ before event $i$ (the first one, before any event, is
learned) and, last, the history after the last event, which conditions the survival term of the open interval
and the next event. Encoders are causal: $h_i$ depends on events $j < i$ only, so padding after a sequence's end
changes nothing before it.

References:
    Shchur, Biloš & Günnemann, *Intensity-free learning of temporal point processes*, ICLR 2020
    (arXiv:1909.12127); Zuo et al., *Transformer Hawkes process*, ICML 2020 (arXiv:2002.09291).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from .._config import Configurable
from .._validation import check_number

__all__ = ["HistoryEncoder", "GRUEncoder", "TransformerEncoder", "ConstantEncoder"]


class HistoryEncoder(Configurable, nn.Module):
    """The contract of a history encoder (see the module `flowkit.events.encoders`).

    Attributes:
        features: the size `H` of a history vector.
    """

    _flowkit_register = False
    features: int

    def forward(self, y: Tensor, marks: Tensor, scaled_tau: Tensor) -> Tensor:
        """History vectors `(B, L + 1, H)` of events `y`, `marks`, `scaled_tau` `(B, L)`."""
        raise NotImplementedError

    def initial_state(self, batch: int, like: Tensor) -> Any:
        """The state before any event of `batch` sequences (dtype and device of `like`)."""
        raise NotImplementedError

    def advance(self, state: Any, y: Tensor, marks: Tensor, scaled_tau: Tensor) -> tuple[Any, Tensor]:
        """The state after one more event per sequence (`(B,)` each) and the new history vector `(B, H)`."""
        raise NotImplementedError

    def history(self, state: Any) -> Tensor:
        """The history vector `(B, H)` of a state."""
        raise NotImplementedError


def _mark_embedding(num_marks: int, size: int) -> nn.Embedding | None:
    return nn.Embedding(num_marks, size) if num_marks > 1 and size > 0 else None


def _event_features(embedding: nn.Embedding | None, y: Tensor, marks: Tensor) -> Tensor:
    parts = [y[..., None]]
    if embedding is not None:
        parts.append(embedding(marks).to(y.dtype))
    return torch.cat(parts, dim=-1)


class GRUEncoder(HistoryEncoder):
    r"""A GRU over $(y_j, \mathrm{embed}(m_j))$, as in Shchur et al. (2020).

    Arguments:
        num_marks: the number of marks $K$ (no embedding when 1).
        hidden: the size `H` of the history vector.
        mark_embedding: the size of the mark embedding.

    Examples:
        >>> import torch
        >>> enc = GRUEncoder(num_marks=3, hidden=8, mark_embedding=4)
        >>> enc(torch.randn(2, 5), torch.zeros(2, 5, dtype=torch.long), torch.ones(2, 5)).shape
        torch.Size([2, 6, 8])
    """

    def __init__(self, num_marks: int = 1, hidden: int = 64, mark_embedding: int = 32) -> None:
        super().__init__()
        self.features = check_number(hidden, "hidden", where="GRUEncoder", integer=True, low=1)
        size = check_number(mark_embedding, "mark_embedding", where="GRUEncoder", integer=True, low=0)
        self.embedding = _mark_embedding(num_marks, size)
        inputs = 1 + (size if self.embedding is not None else 0)
        self.gru = nn.GRU(inputs, self.features, batch_first=True)
        self.initial = nn.Parameter(torch.zeros(self.features))

    def forward(self, y: Tensor, marks: Tensor, scaled_tau: Tensor) -> Tensor:
        h0 = self.initial.to(y.dtype).expand(y.shape[0], -1)
        out, _ = self.gru(_event_features(self.embedding, y, marks), h0[None].contiguous())
        return torch.cat([h0[:, None], out], dim=1)

    def initial_state(self, batch: int, like: Tensor) -> Tensor:
        return self.initial.to(like.dtype).expand(batch, -1).contiguous()

    def advance(self, state: Tensor, y: Tensor, marks: Tensor, scaled_tau: Tensor) -> tuple[Tensor, Tensor]:
        _, h = self.gru(_event_features(self.embedding, y[:, None], marks[:, None]), state[None].contiguous())
        return h[0], h[0]

    def history(self, state: Tensor) -> Tensor:
        return state


class TransformerEncoder(HistoryEncoder):
    r"""A small causal transformer over the events, with a learned start token.

    Token $j \ge 1$ embeds event $j$ (a linear map of $(y_j, \mathrm{embed}(m_j))$) plus a sinusoidal encoding of
    its time since the window start in units of the typical interval (as the transformer Hawkes process encodes
    time); a causal mask lets output $i$ see tokens $0, \dots, i$, that is events before $i + 1$.

    Arguments:
        num_marks: the number of marks $K$.
        hidden: the model width `H` (a multiple of `heads`).
        mark_embedding: the size of the mark embedding.
        heads: attention heads.
        layers: transformer layers.

    Examples:
        >>> import torch
        >>> enc = TransformerEncoder(num_marks=2, hidden=8, heads=2, layers=1)
        >>> enc(torch.randn(3, 4), torch.ones(3, 4, dtype=torch.long), torch.ones(3, 4)).shape
        torch.Size([3, 5, 8])
    """

    def __init__(
        self, num_marks: int = 1, hidden: int = 32, mark_embedding: int = 16, heads: int = 2, layers: int = 2
    ) -> None:
        super().__init__()
        self.features = check_number(hidden, "hidden", where="TransformerEncoder", integer=True, low=1)
        heads = check_number(heads, "heads", where="TransformerEncoder", integer=True, low=1)
        if self.features % heads:
            raise ValueError(f"TransformerEncoder: hidden={hidden} must be a multiple of heads={heads}")
        size = check_number(mark_embedding, "mark_embedding", where="TransformerEncoder", integer=True, low=0)
        self.embedding = _mark_embedding(num_marks, size)
        self.project = nn.Linear(1 + (size if self.embedding is not None else 0), self.features)
        self.start = nn.Parameter(torch.zeros(self.features))
        layer = nn.TransformerEncoderLayer(
            self.features, heads, dim_feedforward=2 * self.features, dropout=0.0, batch_first=True, norm_first=True
        )
        self.layers = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def _time_encoding(self, t: Tensor) -> Tensor:
        half = self.features // 2
        frequencies = torch.exp(-math.log(1e3) * torch.arange(half, dtype=t.dtype, device=t.device) / max(half, 1))
        angles = t[..., None] * frequencies
        encoding = torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
        return nn.functional.pad(encoding, (0, self.features - 2 * half))

    def _tokens(self, y: Tensor, marks: Tensor, scaled_tau: Tensor) -> Tensor:
        events = self.project(_event_features(self.embedding, y, marks)) + self._time_encoding(scaled_tau.cumsum(-1))
        start = self.start.to(y.dtype).expand(y.shape[0], 1, -1)
        return torch.cat([start, events], dim=1)

    def forward(self, y: Tensor, marks: Tensor, scaled_tau: Tensor) -> Tensor:
        tokens = self._tokens(y, marks, scaled_tau)
        n = tokens.shape[1]
        causal = torch.full((n, n), float("-inf"), dtype=tokens.dtype, device=tokens.device).triu(1)
        return self.layers(tokens, mask=causal, is_causal=True)

    def initial_state(self, batch: int, like: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        empty = like.new_zeros(batch, 0)
        history = self.forward(empty, empty.long(), empty)[:, -1]
        return empty, empty.long(), empty, history

    def advance(
        self, state: tuple[Tensor, Tensor, Tensor, Tensor], y: Tensor, marks: Tensor, scaled_tau: Tensor
    ) -> tuple[tuple[Tensor, Tensor, Tensor, Tensor], Tensor]:
        ys, ms, ts, _ = state
        ys, ms, ts = (
            torch.cat([ys, y[:, None]], 1),
            torch.cat([ms, marks[:, None]], 1),
            torch.cat([ts, scaled_tau[:, None]], 1),
        )
        history = self.forward(ys, ms, ts)[:, -1]
        return (ys, ms, ts, history), history

    def history(self, state: tuple[Tensor, Tensor, Tensor, Tensor]) -> Tensor:
        return state[3]


class ConstantEncoder(HistoryEncoder):
    """No history: one learned vector for every event.

    With an exponential head this is a homogeneous Poisson process; with any head, a renewal process.

    Arguments:
        hidden: the size `H` of the (constant) history vector.

    Examples:
        >>> import torch
        >>> ConstantEncoder(4)(torch.randn(2, 3), torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3)).shape
        torch.Size([2, 4, 4])
    """

    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.features = check_number(hidden, "hidden", where="ConstantEncoder", integer=True, low=1)
        self.vector = nn.Parameter(torch.zeros(self.features))

    def forward(self, y: Tensor, marks: Tensor, scaled_tau: Tensor) -> Tensor:
        return self.vector.to(y.dtype).expand(y.shape[0], y.shape[1] + 1, -1)

    def initial_state(self, batch: int, like: Tensor) -> Tensor:
        return self.vector.to(like.dtype).expand(batch, -1)

    def advance(self, state: Tensor, y: Tensor, marks: Tensor, scaled_tau: Tensor) -> tuple[Tensor, Tensor]:
        return state, state

    def history(self, state: Tensor) -> Tensor:
        return state
