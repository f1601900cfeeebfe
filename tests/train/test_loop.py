"""The fit loop: data forms, schedules, clipping, the non-finite guard, validation, checkpoints and exact resume."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

import flowkit
from flowkit.train import Callback, History, MaximumLikelihood, Objective, fit, loop, split_batch
from flowkit.train.checkpoint import load_state, save_state
from flowkit.train.loop import CHECKPOINT_FILE, train_step
from flowkit.train.objective import as_objective


def small_flow(context: int = 0, seed: int = 0) -> flowkit.Flow:
    torch.manual_seed(seed)
    return flowkit.flows.RealNVP(2, transforms=2, hidden=(16,), context=context)


def params_of(flow: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in flow.parameters()]


def assert_same_params(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)


class _Recorder(Objective):
    """Maximum likelihood that keeps every batch it was handed."""

    def __init__(self) -> None:
        self.batches: list = []

    def loss(self, flow, batch):
        self.batches.append(batch)
        return MaximumLikelihood.negative_log_likelihood(flow, batch)


# ---------------------------------------------------------------- data forms


def test_tensor_data_epochs_and_batches_cover_the_data():
    x = torch.randn(100, 2)
    objective = _Recorder()
    history = fit(small_flow(), objective, x, epochs=2, batch_size=32, progress=False, seed=1)
    assert len(history) == 8 == len(objective.batches)  # ceil(100 / 32) = 4 batches per epoch
    assert all(isinstance(b, torch.Tensor) for b in objective.batches)
    for epoch in range(2):
        seen = torch.cat(objective.batches[4 * epoch : 4 * epoch + 4])
        assert seen.shape == x.shape
        # a permutation of the data: the same rows, each once
        assert torch.equal(seen[seen[:, 0].argsort()], x[x[:, 0].argsort()])
    assert not torch.equal(torch.cat(objective.batches[:4]), torch.cat(objective.batches[4:]))  # reshuffled


@pytest.mark.parametrize("n, world_size", [(1, 3), (7, 1), (7, 3), (100, 8)])
def test_shuffled_order_is_distributed_samplers(n, world_size):
    # the sharded batches follow torch's DistributedSampler exactly (same seed, epoch, padding by wrapping)
    from torch.utils.data import DistributedSampler

    from flowkit.train.batches import ShardedBatchSampler

    for rank in range(world_size):
        for epoch in (0, 5):
            ours = ShardedBatchSampler(n, 4, world_size=world_size, rank=rank, seed=11)
            ours.set_epoch(epoch)
            torchs = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=True, seed=11)
            torchs.set_epoch(epoch)
            assert torch.cat(list(ours.index_batches())).tolist() == list(torchs)


def test_pairs_keep_context_aligned_and_reach_the_flow():
    x = torch.randn(64, 2)
    context = x.sum(-1, keepdim=True)  # a function of x: alignment is checkable
    objective = _Recorder()
    fit(small_flow(context=1), objective, (x, context), steps=3, batch_size=16, progress=False, seed=0)
    for batch in objective.batches:
        assert isinstance(batch, tuple) and len(batch) == 2
        bx, bc = batch
        assert torch.equal(bc, bx.sum(-1, keepdim=True))
    flow = small_flow(context=1)
    bx, bc = objective.batches[0]
    assert torch.equal(MaximumLikelihood().loss(flow, (bx, bc)), -flow.log_prob(bx, bc).mean())


def test_dataset_and_dataloader_forms():
    x, c = torch.randn(50, 2), torch.randn(50, 1)
    objective = _Recorder()
    history = fit(small_flow(context=1), objective, TensorDataset(x, c), epochs=1, batch_size=20, progress=False)
    assert len(history) == 3 and all(isinstance(b, tuple) for b in objective.batches)
    # a DataLoader is used as given: its batch size wins
    objective = _Recorder()
    loader = DataLoader(TensorDataset(x), batch_size=10)
    history = fit(small_flow(), objective, loader, epochs=2, batch_size=999, progress=False)
    assert len(history) == 10
    assert torch.equal(objective.batches[0], x[:10])  # unshuffled loader: its own order
    # numpy arrays and float64 data are cast to the model's dtype
    objective = _Recorder()
    fit(small_flow(), objective, np.random.default_rng(0).normal(size=(40, 2)), steps=2, batch_size=8, progress=False)
    assert objective.batches[0].dtype == torch.float32


def test_latent_batches_for_objectives_without_data():
    class _Energy(Objective):
        needs_data = False

        def __init__(self):
            self.batches = []

        def loss(self, flow, z):
            self.batches.append(z)
            x, log_q = flow.rsample_and_log_prob(z.shape[0])
            return (log_q + 0.5 * (x**2).sum(-1)).mean()

    flow = small_flow()
    objective = _Energy()
    fit(flow, objective, steps=2, batch_size=7, progress=False, seed=3)
    torch.manual_seed(3)
    expected = flow.base.sample((7,))
    assert torch.equal(objective.batches[0], expected)


def test_auxiliary_loss_is_added():
    class _Regularised(flowkit.flows.RealNVP):
        def auxiliary_loss(self):
            return sum((p**2).sum() for p in self.parameters())

    class _Zero(Objective):
        def loss(self, flow, batch):
            return 0.0 * sum(p.sum() for p in flow.parameters())

    torch.manual_seed(0)
    flow = _Regularised(2, transforms=2, hidden=(16,))
    before = params_of(flow)
    history = fit(flow, _Zero(), torch.randn(10, 2), steps=1, optimizer="sgd", lr=0.1, schedule=None, progress=False)
    # one SGD step on sum p^2: p <- p - 0.1 * 2p
    for p, q in zip(before, flow.parameters(), strict=True):
        torch.testing.assert_close(q.detach(), 0.8 * p, rtol=1e-6, atol=1e-7)
    expected = sum(float((p**2).sum()) for p in before)
    assert history.loss[0] == pytest.approx(expected, rel=1e-6)
    assert history.metrics["auxiliary_loss"][0] == pytest.approx(expected, rel=1e-6)


# ---------------------------------------------------------------- optimiser, schedule, clipping


@pytest.mark.parametrize(
    "schedule, expected",
    [
        (None, lambda t: 1.0),
        ("cosine", lambda t: 0.5 * (1 + math.cos(math.pi * t / 8))),
        ("step", lambda t: 0.1 ** ((t >= 4) + (t >= 6))),
        (lambda opt: torch.optim.lr_scheduler.StepLR(opt, 3, gamma=0.5), lambda t: 0.5 ** (t // 3)),
    ],
)
def test_schedules(schedule, expected):
    history = fit(
        small_flow(), MaximumLikelihood(), torch.randn(64, 2), steps=8, lr=0.01, schedule=schedule, progress=False
    )
    assert history.lr == pytest.approx([0.01 * expected(t) for t in range(8)], rel=1e-12)


def test_optimizer_forms():
    x = torch.randn(32, 2)
    flow = small_flow()
    sgd = torch.optim.SGD(flow.parameters(), lr=0.5)
    history = fit(flow, MaximumLikelihood(), x, steps=2, optimizer=sgd, schedule=None, progress=False)
    assert history.lr == [0.5, 0.5]  # a built optimizer keeps its own lr
    history = fit(small_flow(), MaximumLikelihood(), x, steps=1, optimizer=torch.optim.AdamW, lr=0.03, progress=False)
    assert history.lr == [0.03]
    with pytest.raises(ValueError, match="unknown optimizer"):
        fit(small_flow(), MaximumLikelihood(), x, steps=1, optimizer="adamax", progress=False)


@pytest.mark.parametrize("name", ["adam", "adamw", "sgd", "rmsprop"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_named_optimizers_take_the_multi_tensor_update_with_the_per_tensor_numbers(name, dtype):
    x = torch.randn(96, 2, dtype=dtype)
    per_tensor = loop._OPTIMIZERS[name]
    flows = [small_flow().to(dtype) for _ in range(2)]
    runs = [
        (flows[0], name),
        (flows[1], lambda params, lr, cls=per_tensor: cls(params, lr=lr, foreach=False)),
    ]
    for flow, optimizer in runs:
        fit(flow, MaximumLikelihood(), x, steps=12, batch_size=32, lr=0.01, optimizer=optimizer, seed=3, progress=False)
    assert_same_params(flows[0], flows[1])  # one process: the same kernels, so bit for bit
    params = list(small_flow().parameters())
    assert loop._make_optimizer(name, params, 0.01).defaults["foreach"] is True
    large = [torch.nn.Parameter(torch.zeros(loop._SMALL_MODEL_NUMBERS + 1))]
    assert loop._make_optimizer(name, large, 0.01).defaults["foreach"] is None  # torch's default


def test_gradient_clipping_bounds_the_update():
    flow = small_flow()
    before = params_of(flow)
    history = fit(
        flow,
        MaximumLikelihood(),
        torch.randn(64, 2) * 3 + 2,
        steps=1,
        optimizer="sgd",
        lr=1.0,
        schedule=None,
        clip=1e-3,
        progress=False,
    )
    assert history.grad_norm[0] > 1e-3  # the raw gradient was larger than the clip
    delta = torch.sqrt(sum(((q.detach() - p) ** 2).sum() for p, q in zip(before, flow.parameters(), strict=True)))
    assert float(delta) == pytest.approx(1e-3, rel=1e-4)


@pytest.mark.parametrize("concatenated", [True, False])
def test_global_gradient_norm_is_torchs_on_both_paths(monkeypatch, concatenated):
    monkeypatch.setattr(loop, "_SMALL_MODEL_NUMBERS", 1 << 20 if concatenated else 0)
    torch.manual_seed(0)
    grads = [torch.randn(shape, dtype=torch.float64) for shape in ((7, 3), (5,), ())]
    expected = torch.nn.utils.get_total_norm(grads)
    torch.testing.assert_close(loop._global_norm(grads), expected, rtol=1e-14, atol=0)
    for bad in (math.nan, math.inf):
        grads[1][2] = bad
        assert not math.isfinite(float(loop._global_norm(grads)))


# ---------------------------------------------------------------- non-finite guard


class _FlakyObjective(Objective):
    """ML, except at the given calls: a NaN loss ("loss"), a NaN gradient ("grad") or a zero gradient ("zero")."""

    def __init__(self, bad_calls, kind):
        self.bad_calls, self.kind, self.calls = set(bad_calls), kind, 0

    def loss(self, flow, batch):
        self.calls += 1
        nll = MaximumLikelihood.negative_log_likelihood(flow, batch)
        if self.calls not in self.bad_calls:
            return nll
        if self.kind == "loss":
            return nll * math.nan
        if self.kind == "detached":
            return torch.tensor(math.nan)
        p = next(flow.parameters())
        if self.kind == "grad":  # finite value, NaN gradient
            return nll + torch.where(torch.tensor(True), torch.zeros(()), torch.sqrt(-p.abs().sum() - 1.0))
        return 0.0 * nll  # zero gradient: plain SGD leaves the parameters unchanged


@pytest.mark.parametrize("kind", ["loss", "grad", "detached"])
def test_non_finite_steps_are_skipped_counted_and_warned(kind):
    x = torch.randn(128, 2)
    reference = small_flow()
    fit(
        reference,
        _FlakyObjective({3, 7}, "zero"),
        x,
        steps=10,
        batch_size=32,
        optimizer="sgd",
        lr=0.05,
        schedule=None,
        progress=False,
        seed=0,
    )
    flow = small_flow()
    with pytest.warns(RuntimeWarning, match=f"non-finite {'gradient' if kind == 'grad' else 'loss'} at step 3"):
        history = fit(
            flow,
            _FlakyObjective({3, 7}, kind),
            x,
            steps=10,
            batch_size=32,
            optimizer="sgd",
            lr=0.05,
            schedule=None,
            progress=False,
            seed=0,
        )
    assert history.skipped == [3, 7]
    finite_losses = [s for s, v in zip(history.step, history.loss, strict=True) if math.isfinite(v)]
    assert finite_losses == (list(range(1, 11)) if kind == "grad" else [1, 2, 4, 5, 6, 8, 9, 10])
    assert math.isnan(history.grad_norm[2]) and math.isfinite(history.grad_norm[3])
    assert_same_params(flow, reference)  # a skipped step is a step without update


def test_many_non_finite_steps_warn_once_more_at_the_end():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = fit(
            small_flow(),
            _FlakyObjective(range(1, 31), "loss"),
            torch.randn(32, 2),
            steps=30,
            batch_size=8,
            progress=False,
        )
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(history.skipped) == 30
    assert len(messages) == 11 and "30 steps were skipped" in messages[-1]


# ---------------------------------------------------------------- validation and early stopping


def test_early_stopping_restores_the_best_weights():
    torch.manual_seed(0)
    train = torch.randn(256, 2) * 0.5 + 4.0  # training pulls the flow away from ...
    val = torch.randn(256, 2)  # ... the validation set, near the initial flow
    flow = small_flow()
    history = fit(
        flow,
        MaximumLikelihood(),
        train,
        steps=200,
        batch_size=64,
        lr=1e-2,
        val_data=val,
        patience=3,
        val_every=5,
        progress=False,
        seed=0,
    )
    assert history.stopped_early
    best = history.val_loss.index(min(history.val_loss))
    assert len(history.val_loss) == best + 1 + 3  # stopped after exactly `patience` worse validations
    assert history.best_val_loss == min(history.val_loss) and history.best_step == history.val_step[best]
    assert len(history) == history.val_step[-1] < 200
    with torch.no_grad():
        now = float(-flow.log_prob(val).mean())
    assert now == pytest.approx(history.best_val_loss, abs=1e-5)  # the best weights, not the last ones
    assert now < history.val_loss[-1] - 1e-3


def test_validation_uses_validation_loss_in_eval_mode():
    class _Probe(Objective):
        def __init__(self):
            self.modes = []

        def loss(self, flow, batch):
            return MaximumLikelihood.negative_log_likelihood(flow, batch)

        def validation_loss(self, flow, batch):
            self.modes.append(flow.training)
            return torch.tensor(float(split_batch(batch)[0].shape[0]))  # weighted mean of batch sizes

    objective = _Probe()
    history = fit(
        small_flow(),
        objective,
        torch.randn(20, 2),
        steps=4,
        val_data=torch.randn(10, 2),
        batch_size=8,
        val_every=2,
        progress=False,
    )
    assert history.val_step == [2, 4] and objective.modes and not any(objective.modes)
    assert history.val_loss == pytest.approx([(8 * 8 + 2 * 2) / 10] * 2)  # batches of 8 and 2 points


# ---------------------------------------------------------------- checkpoints, history and resume


class Interrupt(Exception):
    pass


class _Interrupting(Objective):
    """Wraps an objective and raises after ``limit`` calls (a crash in the middle of a run)."""

    def __init__(self, inner, limit):
        self.inner, self.limit, self.calls = inner, limit, 0
        self.needs_data = inner.needs_data

    def loss(self, flow, batch):
        self.calls += 1
        if self.calls > self.limit:
            raise Interrupt
        return self.inner.loss(flow, batch)

    def validation_loss(self, flow, batch):  # not counted: the crash happens in a training step
        with torch.no_grad():
            return self.inner.loss(flow, batch)


class _Dequantised(Objective):
    """ML on x + noise: the loop's RNG matters."""

    def loss(self, flow, batch):
        return MaximumLikelihood.negative_log_likelihood(flow, batch + 0.05 * torch.randn_like(batch))


class _NoisyDataset(Dataset):
    def __init__(self, x):
        self.x = x

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i] + 0.01 * torch.rand(2)  # the loader's RNG use interleaves with the loop's


class _Reverse(Objective):
    needs_data = False

    def loss(self, flow, z):
        x, log_q = flow.rsample_and_log_prob(z.shape[0])
        return (log_q + 0.5 * ((x - 1) ** 2).sum(-1)).mean()


# Seeded here: at import the global RNG is wherever collection left it, which differs between runs.
X = torch.randn(100, 2, generator=torch.Generator().manual_seed(0)) * 0.7 + 0.3
RESUME_CASES = {
    "tensor": (_Dequantised, lambda: X),
    "shuffled-loader": (_Dequantised, lambda: DataLoader(_NoisyDataset(X), batch_size=16, shuffle=True)),
    "dataset": (MaximumLikelihood, lambda: _NoisyDataset(X)),
    "latent": (_Reverse, lambda: None),
}


@pytest.mark.parametrize("case", list(RESUME_CASES))
def test_resume_after_interruption_reproduces_the_uninterrupted_run(case, tmp_path):
    make_objective, make_data = RESUME_CASES[case]
    options = dict(steps=16, batch_size=16, lr=1e-2, checkpoint_every=5, progress=False, val_every=4)
    if case != "latent":
        options["val_data"] = X[:30]
    full = small_flow()
    full_history = fit(full, make_objective(), make_data(), checkpoint_dir=tmp_path / "full", seed=5, **options)

    crashed = small_flow()
    with pytest.raises(Interrupt):  # dies at step 13; the last checkpoint is step 10, mid-epoch
        fit(
            crashed,
            _Interrupting(make_objective(), 12),
            make_data(),
            checkpoint_dir=tmp_path / "run",
            seed=5,
            **options,
        )
    assert load_state(tmp_path / "run" / CHECKPOINT_FILE)["step"] == 10
    resumed = small_flow(seed=99)  # a fresh process would build a new flow: the checkpoint sets everything
    history = fit(
        resumed, make_objective(), make_data(), checkpoint_dir=tmp_path / "run", resume=True, seed=5, **options
    )
    assert_same_params(resumed, full)
    assert history.loss == full_history.loss and history.lr == full_history.lr
    assert history.val_loss == full_history.val_loss and history.step == list(range(1, 17))


def test_n_steps_then_resume_for_n_more_equals_2n_steps(tmp_path):
    options = dict(batch_size=16, lr=1e-2, schedule=None, progress=False, seed=2)
    full = small_flow()
    fit(full, _Dequantised(), X, steps=20, **options)
    part = small_flow()
    fit(part, _Dequantised(), X, steps=10, checkpoint_dir=tmp_path, **options)
    fit(part, _Dequantised(), X, steps=20, checkpoint_dir=tmp_path, resume=True, **options)
    assert_same_params(part, full)
    history = History.from_json(tmp_path / "history.json")
    assert history.step == list(range(1, 21))


def test_resume_with_another_flow_is_refused(tmp_path):
    fit(small_flow(), MaximumLikelihood(), X, steps=2, checkpoint_dir=tmp_path, progress=False)
    other = flowkit.flows.RealNVP(2, transforms=3, hidden=(16,))
    with pytest.raises(ValueError, match="does not fit this flow"):
        fit(other, MaximumLikelihood(), X, steps=4, checkpoint_dir=tmp_path, resume=True, progress=False)


def test_resume_without_checkpoint_starts_afresh(tmp_path):
    a, b = small_flow(), small_flow()
    fit(a, MaximumLikelihood(), X, steps=3, progress=False, seed=0)
    fit(b, MaximumLikelihood(), X, steps=3, progress=False, seed=0, checkpoint_dir=tmp_path, resume=True)
    assert_same_params(a, b)


def test_checkpoint_dir_files_and_history_formats(tmp_path):
    flow = small_flow()
    history = fit(
        flow,
        MaximumLikelihood(),
        X,
        steps=6,
        batch_size=32,
        val_data=X[:20],
        val_every=3,
        checkpoint_dir=tmp_path,
        progress=False,
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_FILE, "history.csv", "history.json", "model"]
    loaded = flowkit.io.load(tmp_path / "model")
    torch.testing.assert_close(loaded.log_prob(X), flow.log_prob(X), rtol=0, atol=0)
    assert History.from_json(tmp_path / "history.json") == history
    rows = (tmp_path / "history.csv").read_text().splitlines()
    assert rows[0] == "step,loss,lr,time,grad_norm,skipped,val_loss"
    assert len(rows) == 7
    cells = rows[3].split(",")
    assert int(cells[0]) == 3 and float(cells[1]) == history.loss[2] and float(cells[6]) == history.val_loss[0]
    assert rows[1].split(",")[6] == ""  # no validation at step 1
    # non-finite numbers become null in JSON (which stays standard JSON)
    h = History()
    h.record(1, math.nan, 0.1, 0.0, math.inf, {})
    h.to_json(tmp_path / "h.json")
    assert json.loads((tmp_path / "h.json").read_text(), parse_constant=lambda c: pytest.fail(c))["loss"] == [None]


def test_checkpoint_files_hold_no_pickle(tmp_path):
    state = {"a": (1, 2.5, None), 3: [torch.arange(4), {"b": torch.ones(2, dtype=torch.float64)}], "s": "x"}
    save_state(state, tmp_path / "c.safetensors")
    back = load_state(tmp_path / "c.safetensors")
    assert back["a"] == (1, 2.5, None) and back["s"] == "x" and set(back) == {"a", 3, "s"}
    assert torch.equal(back[3][0], torch.arange(4)) and back[3][1]["b"].dtype == torch.float64
    (tmp_path / "bad.safetensors").write_bytes(b"\x80\x04not a checkpoint")
    with pytest.raises(ValueError, match="not a readable flowkit checkpoint"):
        load_state(tmp_path / "bad.safetensors")


def test_seed_makes_runs_reproducible():
    a, b, c = small_flow(), small_flow(), small_flow()
    for flow, seed in ((a, 4), (b, 4), (c, 5)):
        fit(flow, _Dequantised(), X, steps=5, batch_size=16, progress=False, seed=seed)
    assert_same_params(a, b)
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters(), strict=True))


# ---------------------------------------------------------------- argument errors


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(steps=2, epochs=2), "steps= or epochs=, not both"),
        (dict(epochs=2, data=None, objective=_Reverse()), "without data .* give steps="),
        (dict(steps=0), "steps must be a positive integer"),
        (dict(steps=2, batch_size=0), "batch_size must be a positive integer"),
        (dict(steps=2, lr=-1.0), "lr must be a positive number"),
        (dict(steps=2, clip=0), "clip must be a positive number"),
        (dict(steps=2, patience=2), "patience .* needs val_data"),
        (dict(steps=2, resume=True), "resume=True needs checkpoint_dir"),
        (dict(steps=2, schedule="linear"), "unknown schedule"),
        (dict(steps=2, data=None), "learns from data"),
        (dict(steps=2, data="moons"), "must be a tensor, a pair"),
        (dict(steps=2, data=(torch.randn(5, 2), torch.randn(4, 1))), "different numbers of points"),
        (dict(steps=2, data=torch.randn(0, 2)), "empty"),
        (dict(steps=2, ema=1.0), "ema must be a decay"),
        (dict(steps=2, ema=0), "ema must be a decay"),
        (dict(steps=2, callbacks=[lambda state: None]), "callbacks must be"),
        (dict(steps=2, objective=object()), "must have a loss"),
    ],
)
def test_bad_arguments(kwargs, match):
    kwargs = {"data": X, "objective": MaximumLikelihood(), "progress": False, **kwargs}
    data, objective = kwargs.pop("data"), kwargs.pop("objective")
    with pytest.raises(ValueError, match=match):
        fit(small_flow(), objective, data, **kwargs)


@pytest.mark.parametrize("seed", [1.5, "1", True, float("nan"), 2**70])
def test_a_seed_that_is_not_an_integer_is_refused(seed):
    with pytest.raises(ValueError, match="seed must be an integer"):
        fit(small_flow(), MaximumLikelihood(), X, steps=1, seed=seed, progress=False)


def test_numbers_are_checked_by_check_number():
    # NumPy numbers pass as Python ones do (check_number's rule); an infinite clip turns clipping off
    numbers = dict(steps=np.int64(3), batch_size=np.int64(32), lr=np.float32(1e-3), seed=np.int64(0))
    history = fit(small_flow(), MaximumLikelihood(), X, **numbers, ema=np.float64(0.9), clip=math.inf, progress=False)
    assert history.steps_run == 3
    with pytest.raises(ValueError, match=r"fit: clip must be a positive number \(the maximum gradient norm\)"):
        fit(small_flow(), MaximumLikelihood(), X, steps=1, clip=-math.inf, progress=False)
    with pytest.raises(ValueError, match=r"fit: lr must be a positive number, got nan"):
        fit(small_flow(), MaximumLikelihood(), X, steps=1, lr=math.nan, progress=False)


def test_a_schedule_after_a_skipped_first_step_does_not_warn():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = fit(small_flow(), _FlakyObjective({1}, "loss"), torch.randn(64, 2), steps=4, batch_size=16,
                      schedule="step", progress=False)  # fmt: skip
    assert history.skipped == [1]
    assert history.lr == pytest.approx([1e-3, 1e-3, 1e-4, 1e-5])  # the schedule stepped after the skipped step too
    assert not [w for w in caught if "lr_scheduler" in str(w.message)]


def test_one_epoch_by_default():
    history = fit(small_flow(), MaximumLikelihood(), X, batch_size=30, progress=False)
    assert len(history) == 4  # ceil(100 / 30)


def test_bad_loss_and_batch():
    class _Vector(Objective):
        def loss(self, flow, batch):
            return -flow.log_prob(batch)

    with pytest.raises(ValueError, match="must return a scalar tensor"):
        fit(small_flow(), _Vector(), X, steps=1, progress=False)
    with pytest.raises(ValueError, match="a pair \\(x, context\\)"):
        split_batch((X, X, X))


# ---------------------------------------------------------------- EMA, callbacks, adapted objectives, the step


class _Snapshots(Callback):
    """Keeps the flow's weights after every step that updated them."""

    def __init__(self, flow):
        self.flow, self.weights = flow, []

    def on_step_end(self, state):
        if not state.skipped:
            self.weights.append({k: v.detach().clone() for k, v in self.flow.state_dict().items()})


def test_ema_weights_end_in_the_flow():
    plain, averaged = small_flow(), small_flow()
    initial = {k: v.detach().clone() for k, v in plain.state_dict().items()}
    snapshots = _Snapshots(plain)
    options = dict(steps=12, batch_size=16, lr=1e-2, progress=False, seed=1)
    fit(plain, _Dequantised(), X, callbacks=[snapshots], **options)
    fit(averaged, _Dequantised(), X, ema=0.9, **options)
    expected = {k: v.clone() for k, v in initial.items() if v.is_floating_point()}
    for n, weights in enumerate(snapshots.weights):  # avg <- d avg + (1 - d) w, d = min(0.9, (1 + n) / (10 + n))
        d = min(0.9, (1 + n) / (10 + n))
        for k in expected:
            expected[k] = d * expected[k] + (1 - d) * weights[k]
    for k, value in averaged.state_dict().items():
        if value.is_floating_point():
            torch.testing.assert_close(value, expected[k], rtol=1e-5, atol=1e-6)
    assert not all(torch.equal(p, q) for p, q in zip(plain.parameters(), averaged.parameters(), strict=True))


def test_validation_sees_the_ema_weights():
    flow = small_flow()
    # restore_best=False: the flow keeps the weights of the last validation (else those of the best one).
    history = fit(flow, MaximumLikelihood(), X, steps=10, batch_size=16, lr=1e-2, val_data=X[:30], val_every=5,
                  ema=0.8, progress=False, seed=0, restore_best=False)  # fmt: skip
    with torch.no_grad():
        now = float(-flow.log_prob(X[:30]).mean())
    assert history.val_step[-1] == 10 and now == pytest.approx(history.val_loss[-1], abs=1e-6)


@pytest.mark.parametrize("restore_best", [False, True])
def test_resume_with_ema_reproduces_the_uninterrupted_run(restore_best, tmp_path):
    options = dict(steps=16, batch_size=16, lr=1e-2, checkpoint_every=5, progress=False, val_every=4, ema=0.9,
                   val_data=X[:30], restore_best=restore_best, seed=5)  # fmt: skip
    full = small_flow()
    full_history = fit(full, _Dequantised(), X, checkpoint_dir=tmp_path / "full", **options)
    with pytest.raises(Interrupt):
        fit(small_flow(), _Interrupting(_Dequantised(), 12), X, checkpoint_dir=tmp_path / "run", **options)
    assert load_state(tmp_path / "run" / CHECKPOINT_FILE)["ema"]["updates"] == 10
    resumed = small_flow(seed=99)
    history = fit(resumed, _Dequantised(), X, checkpoint_dir=tmp_path / "run", resume=True, **options)
    assert_same_params(resumed, full)
    assert history.loss == full_history.loss and history.val_loss == full_history.val_loss
    with pytest.raises(ValueError, match="written with ema=0.9"):
        fit(small_flow(), _Dequantised(), X, checkpoint_dir=tmp_path / "run", resume=True, **{**options, "ema": 0.5})


def test_user_callbacks_see_every_hook_in_order():
    class _Log(Callback):
        def __init__(self):
            self.calls = []

        def on_start(self, state):
            self.calls.append(("start", state.step))

        def on_step_end(self, state):
            self.calls.append(("step", state.step, state.last.loss))

        def on_validation(self, state):
            self.calls.append(("validation", state.step, state.val_loss))

        def on_train_end(self, state):
            self.calls.append(("train_end", state.step))

        def on_end(self, state):
            self.calls.append(("end", state.step))

    log = _Log()
    history = fit(small_flow(), MaximumLikelihood(), X, steps=4, batch_size=32, val_data=X[:20], val_every=2,
                  callbacks=[log], progress=False)  # fmt: skip
    assert log.calls[0] == ("start", 0) and log.calls[-2:] == [("train_end", 4), ("end", 4)]
    assert [c[2] for c in log.calls if c[0] == "step"] == history.loss
    validations = [c[1:] for c in log.calls if c[0] == "validation"]
    assert validations == list(zip(history.val_step, history.val_loss, strict=True))
    after_step_2 = log.calls.index(("step", 2, history.loss[1])) + 1
    assert log.calls[after_step_2] == ("validation", 2, history.val_loss[0])


class _DuckML:
    """Not an Objective: only loss, validation_loss and metrics methods."""

    def __init__(self):
        self.validated = 0

    def loss(self, flow, batch):
        return MaximumLikelihood.negative_log_likelihood(flow, batch)

    def validation_loss(self, flow, batch):
        self.validated += 1
        with torch.no_grad():
            return MaximumLikelihood.negative_log_likelihood(flow, batch)

    def metrics(self):
        return {"calls": 1}


def test_objects_with_a_loss_method_are_adapted():
    duck, reference = small_flow(), small_flow()
    objective = _DuckML()
    options = dict(steps=5, batch_size=16, val_data=X[:20], val_every=5, progress=False, seed=3)
    history = fit(duck, objective, X, **options)
    expected = fit(reference, MaximumLikelihood(), X, **options)
    assert_same_params(duck, reference)
    assert history.val_loss == expected.val_loss and objective.validated == 2  # 20 points in batches of 16
    assert history.metrics["calls"] == [1.0] * 5

    class _Latent:
        needs_data = False

        def loss(self, flow, z):
            return _Reverse().loss(flow, z)

    assert fit(small_flow(), _Latent(), steps=2, batch_size=8, progress=False).step == [1, 2]
    adapted = as_objective(_Latent())
    assert isinstance(adapted, Objective) and not adapted.needs_data and adapted.metrics() == {}
    ml = MaximumLikelihood()
    assert as_objective(ml) is ml


def test_train_step_skips_the_update_of_a_non_finite_loss():
    class _Model(torch.nn.Module):
        def __init__(self, value):
            super().__init__()
            self.w, self.value = torch.nn.Parameter(torch.ones(2)), value

        def forward(self, batch):
            return self.value * (self.w**2).sum(), None

    for value, skipped in ((1.0, None), (math.inf, "loss")):
        model = _Model(value)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        outcome = train_step(model, MaximumLikelihood(), optimizer, torch.zeros(1, 2))
        assert outcome.skipped == skipped and outcome.lr == 0.1
        expected = torch.full((2,), 0.8) if skipped is None else torch.ones(2)  # w - 0.1 * 2w
        torch.testing.assert_close(model.w.detach(), expected)


def test_a_flow_that_cannot_be_saved_trains_and_warns(tmp_path):
    from flowkit.distributions import StandardNormal
    from flowkit.flows import MetropolisBlock, StochasticFlow

    energy = flowkit.targets.Energy(lambda x: x.square().sum(-1), (2,))
    flow = StochasticFlow(
        [flowkit.bijectors.AffineCoupling(2, hidden=(4,)), MetropolisBlock(energy, 0.5)], StandardNormal(2)
    )
    with pytest.warns(RuntimeWarning, match="not saved"):
        history = fit(flow, MaximumLikelihood(), torch.randn(64, 2), steps=2, checkpoint_dir=tmp_path, progress=False)
    assert len(history.loss) == 2 and (tmp_path / "history.json").exists()
