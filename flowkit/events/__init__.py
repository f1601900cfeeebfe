"""Temporal point processes: event sequences, history encoders, inter-event distributions, simulators.

Intensity-free models (Shchur, Biloš & Günnemann, ICLR 2020): the next inter-event time given the history has a
log-normal mixture or a normalizing-flow density, so likelihood, mean and sampling are in closed form, with no
integral of an intensity. See the [API page](../api/events.md) for the maths.
"""

from .data import EventBatch, EventSequence, EventSequences, read_csv, read_jsonl
from .diagnostics import evaluate, ks_test, rescaled_residuals
from .distributions import (
    Exponential,
    FlowInterEvent,
    Gamma,
    InterEventDistribution,
    LogNormalMixture,
    Weibull,
    gamma_log_survival,
)
from .encoders import ConstantEncoder, GRUEncoder, HistoryEncoder, TransformerEncoder
from .model import EventModel
from .simulators import (
    SIMULATORS,
    Hawkes,
    MarkovModulatedPoisson,
    PointProcess,
    Renewal,
    SelfCorrecting,
    simulate,
    simulator,
)
from .training import EventLikelihood, LengthBucketSampler, fit_events

__all__ = [
    "EventSequence",
    "EventSequences",
    "EventBatch",
    "read_csv",
    "read_jsonl",
    "HistoryEncoder",
    "GRUEncoder",
    "TransformerEncoder",
    "ConstantEncoder",
    "InterEventDistribution",
    "LogNormalMixture",
    "FlowInterEvent",
    "Exponential",
    "Weibull",
    "Gamma",
    "gamma_log_survival",
    "EventModel",
    "EventLikelihood",
    "LengthBucketSampler",
    "fit_events",
    "PointProcess",
    "Hawkes",
    "SelfCorrecting",
    "Renewal",
    "MarkovModulatedPoisson",
    "SIMULATORS",
    "simulator",
    "simulate",
    "rescaled_residuals",
    "ks_test",
    "evaluate",
]
