r"""Event sequences: checked containers, padded batches with masks, readers and splits.

A sequence is a list of events $(t_1, m_1), \dots, (t_n, m_n)$ with strictly increasing times in an observation
window $(t_\mathrm{start}, t_\mathrm{end}]$ and marks $m_i \in \{0, \dots, K - 1\}$. The models work with the
inter-event times $\tau_i = t_i - t_{i-1}$ ($t_0 = t_\mathrm{start}$) and with the open last interval
$t_\mathrm{end} - t_n$, whose survival term enters the likelihood.

[`EventSequences`][flowkit.events.EventSequences] checks its input (a `ValueError` naming the sequence for
times that do not increase, NaN times, marks out of range, empty sequences and a window that ends before the last
event), reads the CSV layout `(sequence id, time, mark)` and the JSON-lines layouts of EasyTPP
(`time_since_start`, `type_event`) and ifl-tpp (`arrival_times`, `marks`), splits by sequence, and packs batches
([`EventBatch`][flowkit.events.EventBatch]) for [`flowkit.train.fit`][flowkit.train.fit].
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["EventSequence", "EventSequences", "EventBatch", "read_csv", "read_jsonl"]


@dataclass(frozen=True)
class EventSequence:
    """One checked sequence: event times, marks and its observation window.

    Attributes:
        times: event times, strictly increasing, float64 array `(n,)`.
        marks: marks in `[0, num_marks)`, int64 array `(n,)`.
        t_start: start of the observation window (before the first event).
        t_end: end of the observation window (at or after the last event).
        name: the sequence's id (used in error messages).
    """

    times: np.ndarray
    marks: np.ndarray
    t_start: float
    t_end: float
    name: str

    @property
    def inter_times(self) -> np.ndarray:
        r"""The inter-event times $\tau_i = t_i - t_{i-1}$ with $t_0 = t_\mathrm{start}$."""
        return np.diff(self.times, prepend=self.t_start)

    def __len__(self) -> int:
        return len(self.times)


def _check_sequence(
    times: Any, marks: Any, t_start: float, t_end: float | None, name: str, num_marks: int
) -> EventSequence:
    where = f"sequence {name!r}"
    try:
        t = np.asarray(times, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: times must be numbers") from None
    if t.size == 0:
        raise ValueError(f"{where} is empty (an event sequence needs at least one event)")
    if not np.isfinite(t).all():
        i = int(np.flatnonzero(~np.isfinite(t))[0])
        raise ValueError(f"{where}: time {i} is {t[i]} (times must be finite numbers)")
    m = np.zeros(t.size, dtype=np.int64) if marks is None else np.asarray(marks).reshape(-1)
    if m.size != t.size:
        raise ValueError(f"{where}: {t.size} times but {m.size} marks")
    if m.size and not np.issubdtype(m.dtype, np.integer):
        as_float = m.astype(np.float64)
        if not np.all(np.isfinite(as_float)) or not np.all(as_float == np.round(as_float)):
            raise ValueError(f"{where}: marks must be integers")
        m = as_float.astype(np.int64)
    m = m.astype(np.int64)
    bad = np.flatnonzero((m < 0) | (m >= num_marks))
    if bad.size:
        raise ValueError(f"{where}: mark {m[bad[0]]} at event {bad[0]} is outside the declared range [0, {num_marks})")
    t_start = float(t_start)
    if not math.isfinite(t_start) or t[0] <= t_start:
        raise ValueError(f"{where}: the first event at {t[0]:g} is not after the window start {t_start:g}")
    steps = np.diff(t)
    if steps.size and (steps <= 0).any():
        i = int(np.flatnonzero(steps <= 0)[0])
        raise ValueError(
            f"{where}: times must increase strictly, but event {i + 1} at {t[i + 1]:g} follows {t[i]:g}"
            + (" (decreasing)" if steps[i] < 0 else " (a tie)")
        )
    t_end = float(t[-1]) if t_end is None else float(t_end)
    if not math.isfinite(t_end) or t_end < t[-1]:
        raise ValueError(f"{where}: the window ends at {t_end:g}, before the last event at {t[-1]:g}")
    return EventSequence(t, m, t_start, t_end, str(name))


@dataclass
class EventBatch:
    r"""A padded batch of sequences, the form the models read.

    Attributes:
        tau: inter-event times `(B, L)`, padded with 1 (so that $\log \tau = 0$ there).
        marks: marks `(B, L)` (int64), padded with 0.
        mask: `(B, L)` bool, True at real events.
        survival: the open last interval $t_\mathrm{end} - t_n$ of each sequence `(B,)`.
        context: sequence-level context `(B, C)`, or None.
    """

    tau: Tensor
    marks: Tensor
    mask: Tensor
    survival: Tensor
    context: Tensor | None = None

    @property
    def lengths(self) -> Tensor:
        """The number of events of each sequence `(B,)`."""
        return self.mask.sum(-1)

    def to_tensors(self) -> tuple[Tensor, Tensor]:
        """The pair `(x, context)` that [`fit`][flowkit.train.fit] batches.

        `x = (tau, mark, mask)` stacked on the last axis `(B, L, 3)`, `context = (survival, sequence context...)`
        `(B, 1 + C)`.
        """
        x = torch.stack([self.tau, self.marks.to(self.tau.dtype), self.mask.to(self.tau.dtype)], dim=-1)
        extra = [self.survival[:, None]] + ([] if self.context is None else [self.context.to(self.tau.dtype)])
        return x, torch.cat(extra, dim=-1)

    @classmethod
    def from_tensors(cls, x: Tensor, context: Tensor) -> EventBatch:
        """The batch back from the pair of [`to_tensors`][flowkit.events.EventBatch.to_tensors], trimmed.

        Padding beyond the longest sequence of the batch is dropped.

        Raises:
            ValueError: if the shapes are not `(B, L, 3)` and `(B, 1 + C)`.
        """
        if x.dim() != 3 or x.shape[-1] != 3 or context.dim() != 2 or context.shape[0] != x.shape[0]:
            raise ValueError(
                "EventBatch.from_tensors: expected x (B, L, 3) and context (B, 1 + C), "
                f"got {tuple(x.shape)} and {tuple(context.shape)}"
            )
        mask = x[..., 2] > 0.5
        length = int(mask.sum(-1).max()) if mask.numel() else 0
        x, mask = x[:, :length], mask[:, :length]
        rest = context[:, 1:] if context.shape[1] > 1 else None
        return cls(x[..., 0], x[..., 1].round().long(), mask, context[:, 0], rest)

    def to(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> EventBatch:
        """The batch with floating tensors in `dtype` and everything on `device`."""

        def move(t: Tensor | None, floating: bool) -> Tensor | None:
            if t is None:
                return None
            return t.to(device=device, dtype=dtype if floating and dtype is not None else t.dtype)

        return EventBatch(
            move(self.tau, True), move(self.marks, False), move(self.mask, False), move(self.survival, True),
            move(self.context, True),
        )  # fmt: skip


class EventSequences:
    r"""A checked collection of event sequences with `num_marks` marks.

    Arguments:
        sequences: each either an [`EventSequence`][flowkit.events.data.EventSequence] or a dict with `times`
            (and optionally `marks`, `t_start` (default 0), `t_end` (default: the last event), `name`).
        num_marks: the number of marks $K$ (default: one more than the largest mark seen).
        context: optional sequence-level features `(N, C)` (an array), one row per sequence.

    Raises:
        ValueError: naming the sequence, for decreasing (or tied) times, NaN times, marks outside
            `[0, num_marks)`, an empty sequence, or a window that ends before the last event.

    Examples:
        >>> seqs = EventSequences([{"times": [0.5, 1.2, 2.0], "marks": [0, 1, 0], "t_end": 3.0},
        ...                        {"times": [0.1, 0.4], "marks": [1, 1]}])
        >>> len(seqs), seqs.num_events, seqs.num_marks
        (2, 5, 2)
        >>> batch = seqs.batch()
        >>> batch.mask.tolist()
        [[True, True, True], [True, True, False]]
    """

    def __init__(self, sequences: Sequence[Any], num_marks: int | None = None, context: Any = None) -> None:
        items = list(sequences)
        if not items:
            raise ValueError("EventSequences: no sequences given")
        if num_marks is None:
            largest = 0
            for item in items:
                marks = item.marks if isinstance(item, EventSequence) else item.get("marks")
                if marks is not None and len(marks):
                    values = np.asarray(marks, dtype=np.float64)
                    largest = max(largest, int(np.nanmax(values)) if np.isfinite(values).any() else 0)
            num_marks = largest + 1
        if int(num_marks) != num_marks or num_marks < 1:
            raise ValueError(f"EventSequences: num_marks must be a positive integer, got {num_marks}")
        self.num_marks = int(num_marks)
        checked = []
        for i, item in enumerate(items):
            if isinstance(item, EventSequence):
                item = {"times": item.times, "marks": item.marks, "t_start": item.t_start, "t_end": item.t_end,
                        "name": item.name}  # fmt: skip
            if not isinstance(item, dict) or "times" not in item:
                raise ValueError(f"EventSequences: sequence {i} must be a dict with 'times', got {type(item).__name__}")
            name = str(item.get("name", i))
            checked.append(
                _check_sequence(
                    item["times"], item.get("marks"), item.get("t_start", 0.0), item.get("t_end"), name, self.num_marks
                )
            )
        self.sequences: list[EventSequence] = checked
        self.context: np.ndarray | None = None
        if context is not None:
            array = np.asarray(context, dtype=np.float64)
            if array.ndim != 2 or array.shape[0] != len(checked) or not np.isfinite(array).all():
                raise ValueError(
                    f"EventSequences: context must be a finite array (N, C) with N = {len(checked)} sequences, "
                    f"got shape {array.shape}"
                )
            self.context = array

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int) -> EventSequence:
        return self.sequences[index]

    def __iter__(self) -> Iterator[EventSequence]:
        return iter(self.sequences)

    def __repr__(self) -> str:
        return f"EventSequences({len(self)} sequences, {self.num_events} events, {self.num_marks} marks)"

    @property
    def num_events(self) -> int:
        """The total number of events."""
        return sum(len(s) for s in self.sequences)

    @property
    def context_features(self) -> int:
        """The number of sequence-level context features (0 when none)."""
        return 0 if self.context is None else int(self.context.shape[1])

    def subset(self, indices: Sequence[int]) -> EventSequences:
        """The sequences at `indices` (with their context rows)."""
        indices = [int(i) for i in indices]
        context = None if self.context is None else self.context[indices]
        return EventSequences([self.sequences[i] for i in indices], self.num_marks, context)

    def split(self, fractions: Sequence[float] = (0.6, 0.2, 0.2), seed: int = 0) -> tuple[EventSequences, ...]:
        """Split by sequence (never inside one) at random into parts of the given fractions (train, val, test).

        Raises:
            ValueError: if the fractions are not positive or do not sum to 1, or a part would be empty.
        """
        fractions = [float(f) for f in fractions]
        if any(f <= 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
            raise ValueError(f"EventSequences.split: fractions must be positive and sum to 1, got {fractions}")
        order = np.random.default_rng(seed).permutation(len(self))
        bounds = np.round(np.cumsum([0.0, *fractions]) * len(self)).astype(int)
        parts = [order[bounds[i] : bounds[i + 1]] for i in range(len(fractions))]
        if any(len(p) == 0 for p in parts):
            raise ValueError(f"EventSequences.split: {len(self)} sequences are too few for {len(fractions)} parts")
        return tuple(self.subset(sorted(p.tolist())) for p in parts)

    def log_inter_time_stats(self) -> tuple[float, float]:
        r"""Mean and standard deviation of $\log \tau$ over all events, for standardising (std 1 if constant)."""
        logs = np.log(np.concatenate([s.inter_times for s in self.sequences]))
        std = float(logs.std())
        return float(logs.mean()), std if std > 0 and math.isfinite(std) else 1.0

    def batch(self, indices: Sequence[int] | None = None, dtype: torch.dtype = torch.float64) -> EventBatch:
        """Pack the sequences (all, or those at `indices`) into an [`EventBatch`][flowkit.events.EventBatch]."""
        chosen = range(len(self)) if indices is None else [int(i) for i in indices]
        seqs = [self.sequences[i] for i in chosen]
        length = max(len(s) for s in seqs)
        tau = torch.ones(len(seqs), length, dtype=dtype)
        marks = torch.zeros(len(seqs), length, dtype=torch.long)
        mask = torch.zeros(len(seqs), length, dtype=torch.bool)
        for row, s in enumerate(seqs):
            tau[row, : len(s)] = torch.as_tensor(s.inter_times, dtype=dtype)
            marks[row, : len(s)] = torch.as_tensor(s.marks)
            mask[row, : len(s)] = True
        survival = torch.tensor([s.t_end - s.times[-1] for s in seqs], dtype=dtype)
        context = None if self.context is None else torch.as_tensor(self.context[list(chosen)], dtype=dtype)
        return EventBatch(tau, marks, mask, survival, context)

    def as_fit_data(self, dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
        """All sequences as the pair `(x, context)` that [`fit`][flowkit.train.fit] batches (by sequence).

        See [`EventBatch.to_tensors`][flowkit.events.EventBatch.to_tensors].
        """
        return self.batch(dtype=dtype).to_tensors()

    def to_jsonl(self, path: str | os.PathLike) -> Path:
        """Write the sequences as JSON lines, one sequence a line; [`read_jsonl`][flowkit.events.read_jsonl] reads them.

        The fields are ifl-tpp's (`arrival_times`, `marks`, `t_start`, `t_end`) plus `name` and `num_marks`.
        """
        path = Path(path)
        with path.open("w") as f:
            for s in self.sequences:
                row = {"name": s.name, "arrival_times": s.times.tolist(), "marks": s.marks.tolist(),
                       "t_start": s.t_start, "t_end": s.t_end, "num_marks": self.num_marks}  # fmt: skip
                f.write(json.dumps(row) + "\n")
        return path

    @classmethod
    def concatenate(cls, parts: Sequence[EventSequences]) -> EventSequences:
        """The sequences of all `parts` (the same `num_marks`) in one collection."""
        marks = {p.num_marks for p in parts}
        if len(marks) != 1:
            raise ValueError(f"EventSequences.concatenate: parts have different num_marks {sorted(marks)}")
        return cls([s for p in parts for s in p.sequences], marks.pop())


_ID_COLUMNS = ("sequence", "sequence_id", "seq_id", "seq_idx", "id")
_TIME_COLUMNS = ("time", "timestamp", "t", "time_since_start")
_MARK_COLUMNS = ("mark", "type", "type_event", "event_type", "label")


def _column(header: list[str], wanted: str | None, options: Sequence[str], what: str, path: Path) -> int | None:
    lowered = [h.strip().lower() for h in header]
    if wanted is not None:
        if wanted.lower() not in lowered:
            raise ValueError(f"{path}: no column {wanted!r} for the {what} (columns: {header})")
        return lowered.index(wanted.lower())
    return next((lowered.index(o) for o in options if o in lowered), None)


def read_csv(
    path: str | os.PathLike,
    *,
    num_marks: int | None = None,
    sequence_column: str | None = None,
    time_column: str | None = None,
    mark_column: str | None = None,
    window_end: float | None = None,
) -> EventSequences:
    """Read events from a CSV file with a header, one event a row: sequence id, time and (optionally) mark.

    The columns are found by name (`sequence`/`seq_id`/`id`, `time`/`timestamp`, `mark`/`type`/`type_event`)
    unless given; rows of one sequence may come in any order of sequences but in time order within each.
    Windows start at 0 and end at `window_end` (the same for all sequences), or at each sequence's last event.

    Raises:
        ValueError: for a missing column, a value that is not a number, or a bad sequence (named).
    """
    path = Path(path)
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) < 2:
        raise ValueError(f"{path}: expected a header and at least one event row")
    header = rows[0]
    sid = _column(header, sequence_column, _ID_COLUMNS, "sequence id", path)
    tid = _column(header, time_column, _TIME_COLUMNS, "time", path)
    mid = _column(header, mark_column, _MARK_COLUMNS, "mark", path)
    if sid is None or tid is None:
        raise ValueError(f"{path}: needs a sequence id column and a time column (columns: {header})")
    times: dict[str, list[float]] = {}
    marks: dict[str, list[float]] = {}
    for line, row in enumerate(rows[1:], start=2):
        if not row or all(not c.strip() for c in row):
            continue
        try:
            key = row[sid].strip()
            times.setdefault(key, []).append(float(row[tid]))
            marks.setdefault(key, []).append(float(row[mid]) if mid is not None else 0.0)
        except (ValueError, IndexError):
            raise ValueError(f"{path}: line {line} is not (sequence id, time, mark) numbers: {row}") from None
    sequences = [{"times": times[k], "marks": marks[k], "t_end": window_end, "name": k} for k in times]
    return EventSequences(sequences, num_marks)


def read_jsonl(path: str | os.PathLike, *, num_marks: int | None = None) -> EventSequences:
    """Read sequences from JSON lines, one sequence an object, in EasyTPP's or ifl-tpp's field names.

    EasyTPP: `time_since_start`, `type_event`, `dim_process` (the number of marks), `seq_idx`. ifl-tpp:
    `arrival_times`, `marks`, `t_start`, `t_end`, `num_marks`. A file holding one JSON object with a list
    `sequences` (ifl-tpp's saved datasets) is read too. An EasyTPP sequence whose first event is at time 0 (as in
    EasyTPP's datasets) has its window start there: that event opens the window and is not modelled (EasyTPP's
    likelihood does not score it either).

    Raises:
        ValueError: for lines that are not JSON objects with event times, or a bad sequence (named).
    """
    path = Path(path)
    text = path.read_text()
    try:
        whole = json.loads(text)
    except ValueError:
        whole = None
    if isinstance(whole, dict) and isinstance(whole.get("sequences"), list):
        objects = whole["sequences"]
        num_marks = num_marks if num_marks is not None else whole.get("num_marks")
    else:
        objects = []
        for line_number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                objects.append(json.loads(line))
            except ValueError:
                raise ValueError(f"{path}: line {line_number} is not JSON") from None
    sequences = []
    declared = set()
    for i, obj in enumerate(objects):
        if not isinstance(obj, dict):
            raise ValueError(f"{path}: sequence {i} is not a JSON object")
        times = obj.get("time_since_start", obj.get("arrival_times"))
        if times is None:
            raise ValueError(f"{path}: sequence {i} has neither 'time_since_start' nor 'arrival_times'")
        marks = obj.get("type_event", obj.get("marks"))
        for key in ("dim_process", "num_marks"):
            if obj.get(key) is not None:
                declared.add(int(obj[key]))
        name = obj.get("name", obj.get("seq_idx", i))
        times = [math.nan if t is None else t for t in times]
        if "time_since_start" in obj and "t_start" not in obj and len(times) and times[0] == 0:
            # EasyTPP's sequences start with an event at time 0, which its likelihood does not score: the window
            # starts there (a zero inter-event time has no log-density)
            times, marks = times[1:], None if marks is None else marks[1:]
        sequences.append(
            {
                "times": times,
                "marks": marks,
                "t_start": obj.get("t_start", 0.0),
                "t_end": obj.get("t_end"),
                "name": name,
            }
        )
    if num_marks is None and declared:
        num_marks = max(declared)
    return EventSequences(sequences, num_marks)
