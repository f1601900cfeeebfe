"""DependentMaximumLikelihood: the unbiased mini-batch estimator, K = I, log-determinants, rho recovery, bad inputs."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from interruptions import KillAt, Killed, run_killed_by_sigkill

import flowkit
from flowkit.data import equicorrelated_groups, random_kinship, stock_pairs
from flowkit.train import (
    DependenceUpdate,
    DependentMaximumLikelihood,
    MaximumLikelihood,
    fit,
    split_indexed_batch,
    with_indices,
)
from flowkit.train.checkpoint import load_state, save_state
from flowkit.train.loop import CHECKPOINT_FILE

F64 = torch.float64


def _kinship(n: int, rank: int = 15, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, rank, generator=g, dtype=F64)
    k = w @ w.T
    d = k.diagonal().sqrt()
    return k / d[:, None] / d[None, :]


def _groups_sigma(groups: torch.Tensor, rho: float) -> torch.Tensor:
    same = groups[:, None] == groups[None, :]
    sigma = torch.where(same, torch.tensor(rho, dtype=F64), torch.tensor(0.0, dtype=F64))
    return sigma.fill_diagonal_(1.0)


def _identity_flow() -> flowkit.Flow:
    scaling = flowkit.bijectors.Standardization([0.0, 0.0], [1.0, 1.0])
    return flowkit.Flow(scaling, flowkit.distributions.StandardNormal(2)).double()


def _flow() -> flowkit.Flow:
    torch.manual_seed(0)
    return flowkit.flows.RealNVP(2, transforms=2, hidden=(16,)).double()


@pytest.mark.parametrize("kind", ["kinship", "groups"])
def test_minibatch_term_averages_to_the_full_batch_value(kind):
    n, b = 120, 16
    structure = {"kinship": _kinship(n)} if kind == "kinship" else {"groups": torch.arange(n) // 7}
    objective = DependentMaximumLikelihood(**structure, value=0.35)
    flow = _flow()
    x = torch.randn(n, 2, dtype=F64) * 1.5 + 0.3
    with torch.no_grad():
        full = float(objective.log_likelihood(flow, x)) / n
        batch = torch.randperm(n)[:b]
        z, ladj = objective.latents(flow, x)  # the flow acts point by point: one pass for every batch below
        one_batch = (ladj[batch] + objective.point_terms(z[batch], batch)).mean()
        assert torch.allclose(-objective.loss(flow, (x[batch], batch)), one_batch)
        g = torch.Generator().manual_seed(1)
        batches = (torch.randperm(n, generator=g)[:b] for _ in range(2000))
        draws = torch.stack([(ladj[i] + objective.point_terms(z[i], i)).mean() for i in batches])
    mean, se = float(draws.mean()), float(draws.std()) / math.sqrt(len(draws))
    assert abs(mean - full) < 3 * se, (mean, full, se)
    assert se < 0.05 * abs(full)  # a tight comparison


def test_full_batch_value_matches_dense_gaussian():
    n = 60
    k = _kinship(n)
    objective = DependentMaximumLikelihood(kinship=k, value=0.3)
    z = torch.randn(n, 2, dtype=F64)
    sigma = 0.3 * torch.eye(n, dtype=F64) + 0.7 * k
    dense = torch.distributions.MultivariateNormal(torch.zeros(n, dtype=F64), covariance_matrix=sigma)
    assert torch.allclose(objective.latent_log_likelihood(z), dense.log_prob(z.T).sum(), rtol=1e-10)
    groups = torch.arange(n) // 9
    objective = DependentMaximumLikelihood(groups=groups, value=0.6)
    dense = torch.distributions.MultivariateNormal(torch.zeros(n, dtype=F64), _groups_sigma(groups, 0.6))
    assert torch.allclose(objective.latent_log_likelihood(z), dense.log_prob(z.T).sum(), rtol=1e-10)


def test_identity_kinship_is_iid_maximum_likelihood():
    n = 50
    objective = DependentMaximumLikelihood(kinship=torch.eye(n, dtype=F64), value=0.2)
    flow = _flow()
    x = torch.randn(n, 2, dtype=F64)
    index = torch.randperm(n)[:20]
    dependent = objective.loss(flow, (x[index], index))
    iid = MaximumLikelihood().loss(flow, x[index])
    assert torch.allclose(dependent, iid, rtol=1e-12, atol=1e-12)
    grads = [torch.autograd.grad(loss, list(flow.parameters())) for loss in (dependent, iid)]
    for a, b in zip(*grads, strict=True):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)


def test_eigen_log_determinant_matches_slogdet():
    n = 80
    k = _kinship(n, rank=30)
    objective = DependentMaximumLikelihood(kinship=k)
    for lam in (0.01, 0.3, 0.9):
        sigma = lam * torch.eye(n, dtype=F64) + (1 - lam) * k
        sign, logdet = torch.linalg.slogdet(sigma)
        assert sign == 1
        eigen = objective.structure.log_det(torch.tensor(lam, dtype=F64))
        assert math.isclose(float(eigen), float(logdet), rel_tol=1e-10)
    groups = torch.tensor([0, 0, 0, 1, 2, 2, 5, 5, 5, 5])
    objective = DependentMaximumLikelihood(groups=groups)
    for rho in (0.1, 0.8):
        logdet = torch.linalg.slogdet(_groups_sigma(groups, rho))[1]
        closed_form = objective.structure.log_det(torch.tensor(rho, dtype=F64))
        assert math.isclose(float(closed_form), float(logdet), rel_tol=1e-10)
        index = torch.tensor([6, 0, 9, 3, 1])
        inverse = torch.linalg.inv(_groups_sigma(groups, rho))
        assert torch.allclose(objective.structure.precision(rho, index), inverse[index][:, index], atol=1e-12)


def test_update_recovers_rho_of_exact_latents():
    data = equicorrelated_groups("cres", n=2000, rho=0.7, seed=3)
    g = torch.Generator().manual_seed(0)
    # the latents themselves (identity flow): the update is the maximum-likelihood rho
    groups = data.groups
    shared = torch.randn(int(groups.max()) + 1, 2, generator=g, dtype=F64)[groups]
    z = math.sqrt(0.7) * shared + math.sqrt(0.3) * torch.randn(len(groups), 2, generator=g, dtype=F64)
    objective = DependentMaximumLikelihood(groups=groups)
    flow = _identity_flow()
    assert abs(objective.update(flow, z) - 0.7) < 0.05


def test_fit_with_alternation_recovers_rho_on_synthetic_groups():
    # equicorrelated latents (the data set's Pareto groups, rho = 0.7) through an affine map the flow can learn
    groups = equicorrelated_groups("cres", n=2000, rho=0.7, seed=2).groups
    g = torch.Generator().manual_seed(2)
    shared = torch.randn(int(groups.max()) + 1, 2, generator=g)[groups]
    z = math.sqrt(0.7) * shared + math.sqrt(0.3) * torch.randn(len(groups), 2, generator=g)
    x = z @ torch.tensor([[2.0, 0.5], [0.0, 0.7]]) + torch.tensor([1.0, -2.0])
    torch.manual_seed(0)
    flow = flowkit.flows.RealNVP(2, transforms=2, hidden=(16,))
    objective = DependentMaximumLikelihood(groups=groups)
    update = DependenceUpdate(objective, flow, x, every=10, at_start=True)
    settings = dict(steps=600, batch_size=256, lr=1e-2, progress=False)
    history = fit(flow, objective, with_indices(x), callbacks=[update], **settings)
    assert len(history.metrics["rho"]) == 600 and history.metrics["rho"][0] != 0.5  # updated before the first step
    assert abs(objective.value - 0.7) < 0.05, objective.value


def test_random_kinship_update_estimates_lambda_of_exact_latents():
    n = 300
    data = random_kinship("cres", n=n, lam=0.4, seed=0)
    sigma = 0.4 * torch.eye(n, dtype=F64) + 0.6 * data.kinship
    z = torch.linalg.cholesky(sigma) @ torch.randn(n, 2, dtype=F64)
    objective = DependentMaximumLikelihood(kinship=data.kinship)
    flow = _identity_flow()
    assert abs(objective.update(flow, z) - 0.4) < 0.1
    assert data.kinship.diagonal().eq(1).all() and torch.linalg.eigvalsh(data.kinship)[0] > -1e-8


def test_validation_loss_is_the_marginal_nll():
    n = 40
    objective = DependentMaximumLikelihood(groups=torch.arange(n) // 4)
    flow = _flow()
    x = torch.randn(n, 2, dtype=F64)
    expected = -flow.log_prob(x).mean()
    assert torch.allclose(objective.validation_loss(flow, x), expected)
    assert torch.allclose(objective.validation_loss(flow, with_indices(x)), expected)
    assert objective.metrics() == {"rho": pytest.approx(0.5)}


def test_with_indices_and_split_indexed_batch():
    x, c = torch.randn(5, 2), torch.randn(5, 1)
    assert torch.equal(with_indices(x)[1], torch.arange(5))
    xx, cc, index = split_indexed_batch(with_indices((x, c)))
    assert xx is x and cc is c and torch.equal(index, torch.arange(5))
    with pytest.raises(ValueError, match="integer"):
        split_indexed_batch((x, c))
    with pytest.raises(ValueError, match="points"):
        split_indexed_batch((x, torch.arange(4)))
    with pytest.raises(ValueError, match="with_indices"):
        split_indexed_batch(x)


@pytest.mark.parametrize(
    "kinship, match",
    [
        (torch.tensor([[1.0, 0.5], [0.2, 1.0]]), "symmetric"),
        (torch.tensor([[1.0, 2.0], [2.0, 1.0]]), "positive semi-definite"),
        (torch.tensor([[2.0, 0.0], [0.0, 1.0]]), "unit diagonal"),
        (torch.ones(3, 2), "square"),
        (torch.ones(1, 1), "square"),
        (torch.tensor([[1.0, float("nan")], [float("nan"), 1.0]]), "non-finite"),
        ("abc", "matrix of numbers"),
    ],
)
def test_bad_kinship(kinship, match):
    with pytest.raises(ValueError, match=match):
        DependentMaximumLikelihood(kinship=kinship)


def test_bad_arguments_and_batches():
    n = 10
    with pytest.raises(ValueError, match="exactly one"):
        DependentMaximumLikelihood()
    with pytest.raises(ValueError, match="exactly one"):
        DependentMaximumLikelihood(kinship=torch.eye(n), groups=torch.arange(n))
    with pytest.raises(ValueError, match="integer labels"):
        DependentMaximumLikelihood(groups=torch.rand(n))
    with pytest.raises(ValueError, match="value"):
        DependentMaximumLikelihood(groups=torch.arange(n), value=1.0)
    objective = DependentMaximumLikelihood(kinship=torch.eye(n, dtype=F64))
    flow, x = _flow(), torch.randn(4, 2, dtype=F64)
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        objective.loss(flow, (x, torch.tensor([0, 1, 2, 10])))
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        objective.loss(flow, (x, torch.tensor([-1, 1, 2, 3])))
    with pytest.raises(ValueError, match="twice"):
        objective.loss(flow, (x, torch.tensor([0, 1, 1, 3])))
    with pytest.raises(ValueError, match="with_indices"):
        objective.loss(flow, x)
    with pytest.raises(ValueError, match="all 10 training points"):
        objective.update(flow, x)
    with pytest.raises(ValueError, match="StandardNormal"):
        other = flowkit.flows.RealNVP(2, transforms=1, base=flowkit.distributions.DiagNormal(2)).double()
        objective.loss(other, (x, torch.arange(4)))
    with pytest.raises(ValueError, match="data has 4 points"):
        DependenceUpdate(objective, flow, x)
    with pytest.raises(ValueError, match="every"):
        DependenceUpdate(objective, flow, torch.randn(n, 2), every=0)


@pytest.mark.parametrize(
    "build, what",
    [
        (lambda n: DependentMaximumLikelihood(groups=torch.arange(n) // 4), "group labels are"),
        (lambda n: DependentMaximumLikelihood(kinship=_kinship(n)), "kinship matrix is"),
    ],
)
@pytest.mark.parametrize("labels", [70, 50])  # more labels than points (trained silently), and fewer
def test_fit_refuses_data_of_another_size_than_the_labels(build, what, labels):
    x = torch.randn(60, 2, dtype=F64)
    objective = build(labels)
    for data in (with_indices(x), torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*with_indices(x)), 20)):
        with pytest.raises(ValueError, match=rf"the data has 60 points but the {what} for {labels}"):
            fit(_flow(), objective, data, steps=2, batch_size=20, progress=False)
    history = fit(_flow(), build(60), with_indices(x), steps=2, batch_size=20, progress=False)
    assert len(history.loss) == 2


def test_synthetic_and_real_data_sets():
    data = equicorrelated_groups("sine", n=300, rho=0.5, seed=0)
    assert data.train.shape == (300, 2) and data.groups.shape == (300,)
    assert sum(data.info["group_sizes"]) == 300 and data.truth == {"rho": 0.5}
    assert torch.equal(equicorrelated_groups("sine", n=300, rho=0.5, seed=0).train, data.train)
    with pytest.raises(ValueError, match="unknown shape"):
        equicorrelated_groups("moons")
    with pytest.raises(ValueError, match="rho"):
        equicorrelated_groups(rho=1.0)
    with pytest.raises(ValueError, match="lam"):
        random_kinship(lam=0.0)
    pytest.importorskip("arch")
    stocks = stock_pairs()
    assert stocks.train.shape[0] == 2 * (int(stocks.groups.max()) + 1)
    assert np.allclose(stocks.train.mean(0), 0, atol=1e-4) and np.allclose(stocks.train.std(0), 1, atol=1e-3)
    days = stocks.train.reshape(-1, 2, 2)
    assert np.corrcoef(days[:, 0, 0], days[:, 1, 0])[0, 1] > 0.8  # the two indices move together


def test_fit_passes_contexts_and_indices_to_the_objective():
    n = 64
    x, context = torch.randn(n, 2), torch.randn(n, 1)
    torch.manual_seed(0)
    flow = flowkit.flows.RealNVP(2, transforms=2, hidden=(8,), context=1)
    objective = DependentMaximumLikelihood(groups=torch.arange(n) // 4, value=0.3)
    update = DependenceUpdate(objective, flow, with_indices((x, context)), every=2)
    data = with_indices((x, context))
    history = fit(flow, objective, data, steps=4, batch_size=16, callbacks=[update], progress=False)
    assert len(history.loss) == 4 and objective.value != 0.3
    expected = objective.log_likelihood(flow, x, context) / n
    assert torch.isfinite(expected)


def test_a_resumed_run_continues_with_the_checkpoints_value_and_refits_one_without_it(tmp_path):
    n = 64
    x = torch.randn(n, 2)
    groups = torch.arange(n) // 8

    def run(steps, resume):
        torch.manual_seed(0)
        flow = flowkit.flows.RealNVP(2, transforms=1, hidden=(8,))  # a plain base: rho lives in the objective
        objective = DependentMaximumLikelihood(groups=groups)
        update = DependenceUpdate(objective, flow, x, every=100)
        options = dict(steps=steps, batch_size=16, progress=False, seed=0, checkpoint_dir=tmp_path, resume=resume)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return fit(flow, objective, with_indices(x), callbacks=[update], **options)

    assert run(3, False).metrics["rho"] == [0.5] * 3  # no update before the first step by default
    assert run(5, True).metrics["rho"] == [0.5] * 5  # the objective's state came back: no refit
    saved = load_state(tmp_path / CHECKPOINT_FILE)
    del saved["objective"]  # a checkpoint of an earlier version, without the objective's state
    save_state(saved, tmp_path / CHECKPOINT_FILE)
    with pytest.warns(RuntimeWarning, match="holds no objective state"):
        resumed = run(7, True)
    assert len(resumed.metrics["rho"]) == 7 and resumed.metrics["rho"][5] != 0.5  # refitted first


# ---- a rho per group or per group size (the paper's equicorrelated model), held-out relatives


def _groups_sigma_per_group(groups: torch.Tensor, rho_of_group: torch.Tensor) -> torch.Tensor:
    same = groups[:, None] == groups[None, :]
    rho = rho_of_group[groups]
    sigma = torch.where(same, rho[:, None].expand(len(groups), len(groups)), torch.zeros((), dtype=F64))
    return sigma.fill_diagonal_(1.0)


_GROUPS = torch.tensor([3, 3, 3, 0, 7, 7, 5, 5, 5, 5, 9, 3, 0, 0])  # labels unsorted; sizes 4, 3, 2, 4, 1 (+ label 0)


def test_per_group_log_determinant_precision_and_likelihood_match_dense():
    objective = DependentMaximumLikelihood(groups=_GROUPS, rho="group")
    labels = torch.unique(_GROUPS, return_inverse=True)[1]
    values = torch.tensor([0.15, 0.4, 0.9, 0.6, 0.3], dtype=F64)  # groups in sorted-label order: 0, 3, 5, 7, 9
    objective.logits = torch.logit(values)
    sigma = _groups_sigma_per_group(labels, values)
    sign, logdet = torch.linalg.slogdet(sigma)
    assert sign == 1 and math.isclose(float(objective.structure.log_det(values)), float(logdet), rel_tol=1e-12)
    index = torch.tensor([9, 0, 13, 4, 1, 10, 6])
    inverse = torch.linalg.inv(sigma)
    assert torch.allclose(objective.structure.precision(values, index), inverse[index][:, index], atol=1e-12)
    z = torch.randn(len(_GROUPS), 3, dtype=F64)
    dense = torch.distributions.MultivariateNormal(torch.zeros(len(_GROUPS), dtype=F64), sigma)
    assert torch.allclose(objective.latent_log_likelihood(z), dense.log_prob(z.T).sum(), rtol=1e-12)


def test_kinship_precision_block_matches_the_dense_inverse():
    n = 40
    k = _kinship(n, rank=10)
    objective = DependentMaximumLikelihood(kinship=k)
    inverse = torch.linalg.inv(0.3 * torch.eye(n, dtype=F64) + 0.7 * k)
    index = torch.tensor([5, 0, 39, 17, 2])
    assert torch.allclose(objective.structure.precision(0.3, index), inverse[index][:, index], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("rho", ["group", "size"])
def test_per_group_minibatch_term_averages_to_the_full_batch_value(rho):
    n, b = 120, 16
    groups = torch.arange(n) // 7 + (torch.arange(n) >= 100) * torch.arange(n)  # groups of 7, then singletons
    objective = DependentMaximumLikelihood(groups=groups, rho=rho)
    g = torch.Generator().manual_seed(3)
    objective.logits = torch.logit(torch.rand(objective.structure.parameters, generator=g, dtype=F64) * 0.9 + 0.05)
    flow = _flow()
    x = torch.randn(n, 2, dtype=F64, generator=g) * 1.5 + 0.3
    with torch.no_grad():
        full = float(objective.log_likelihood(flow, x)) / n
        z, ladj = objective.latents(flow, x)
        batches = (torch.randperm(n, generator=g)[:b] for _ in range(2000))
        draws = torch.stack([(ladj[i] + objective.point_terms(z[i], i)).mean() for i in batches])
    mean, se = float(draws.mean()), float(draws.std()) / math.sqrt(len(draws))
    assert abs(mean - full) < 3 * se, (mean, full, se)
    assert se < 0.05 * abs(full)


def _dense_optimum(z: torch.Tensor, eps: float = 1e-3) -> float:
    """The maximum-likelihood rho of one equicorrelated group's latents z (m, p), by the dense Gaussian."""
    from scipy.optimize import minimize_scalar

    m = z.shape[0]

    def negative(rho: float) -> float:
        sigma = (1 - rho) * torch.eye(m, dtype=F64) + rho
        return -float(torch.distributions.MultivariateNormal(torch.zeros(m, dtype=F64), sigma).log_prob(z.T).sum())

    grid = np.linspace(eps, 1 - eps, 400)
    best = grid[int(np.argmin([negative(r) for r in grid]))]
    step = grid[1] - grid[0]
    bounds = (max(eps, best - step), min(1 - eps, best + step))
    return float(minimize_scalar(negative, bounds=bounds, method="bounded", options={"xatol": 1e-12}).x)


def test_per_group_update_is_the_dense_maximum_likelihood_of_each_group():
    sizes, truth = [40, 7, 120, 2, 1, 15], [0.8, 0.3, 0.55, 0.9, 0.5, 0.05]
    groups = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    g = torch.Generator().manual_seed(5)
    rho = torch.tensor(truth, dtype=F64)[groups, None]
    shared = torch.randn(len(sizes), 2, generator=g, dtype=F64)[groups]
    z = rho.sqrt() * shared + (1 - rho).sqrt() * torch.randn(len(groups), 2, generator=g, dtype=F64)
    objective = DependentMaximumLikelihood(groups=groups, rho="group", value=0.2)
    estimate = objective.update(_identity_flow(), z)
    assert estimate.shape == (len(sizes),)
    for k, size in enumerate(sizes):
        if size == 1:
            assert math.isclose(float(estimate[k]), 0.2, rel_tol=1e-12)  # a singleton's rho is not identified: kept
        else:
            assert abs(float(estimate[k]) - _dense_optimum(z[groups == k])) < 1e-6, k
    shared_fit = DependentMaximumLikelihood(groups=groups).update(_identity_flow(), z)  # one rho: the dense optimum too
    everything = [z[groups == k] for k in range(len(sizes))]

    def negative(r: float) -> float:
        return -sum(
            float(
                torch.distributions.MultivariateNormal(
                    torch.zeros(len(w), dtype=F64), (1 - r) * torch.eye(len(w), dtype=F64) + r
                )
                .log_prob(w.T)
                .sum()
            )
            for w in everything
        )

    from scipy.optimize import minimize_scalar

    dense = minimize_scalar(negative, bounds=(1e-3, 1 - 1e-3), method="bounded", options={"xatol": 1e-12}).x
    assert abs(shared_fit - dense) < 1e-6


def test_rho_per_size_ties_groups_of_one_size():
    groups = torch.repeat_interleave(torch.arange(6), torch.tensor([3, 5, 3, 5, 5, 1]))
    objective = DependentMaximumLikelihood(groups=groups, rho="size")
    assert objective.structure.parameter_sizes.tolist() == [1, 3, 5]
    assert objective.structure.identified().tolist() == [False, True, True]
    z = torch.randn(len(groups), 2, dtype=F64)
    values = objective.update(_identity_flow(), z)
    rho = objective.structure.group_rho(values)
    assert rho[0] == rho[2] and rho[1] == rho[3] == rho[4] and rho[0] != rho[1]
    equal, w = torch.arange(60) // 6, torch.randn(60, 2, dtype=F64)  # groups all of one size: "size" is "shared"
    one = DependentMaximumLikelihood(groups=equal, rho="size").update(_identity_flow(), w)
    two = DependentMaximumLikelihood(groups=equal).update(_identity_flow(), w)
    assert math.isclose(float(one), two, rel_tol=1e-12)


def test_per_group_rho_recovered_by_fit_on_the_papers_design():
    data = equicorrelated_groups("cres", n=3000, rho=(0.5, 0.99), max_group=1000, seed=1)
    truth = torch.tensor(data.truth["rho"], dtype=F64)
    assert len(truth) == int(data.groups.max()) + 1 and bool(((truth >= 0.5) & (truth <= 0.99)).all())
    groups = data.groups
    g = torch.Generator().manual_seed(0)
    shared = torch.randn(len(truth), 2, generator=g, dtype=F64)[groups]
    rho = truth[groups, None]
    z = rho.sqrt() * shared + (1 - rho).sqrt() * torch.randn(len(groups), 2, generator=g, dtype=F64)
    objective = DependentMaximumLikelihood(groups=groups, rho="group")
    estimate = objective.update(_identity_flow(), z)
    m, p = objective.structure.sizes, 2
    big = m >= 200
    assert int(big.sum()) >= 2
    # the Fisher information of one group's rho: p/2 [(m-1)/(1-rho)^2 + (m-1)^2/(1+(m-1)rho)^2]
    information = p / 2 * ((m - 1) / (1 - truth) ** 2 + (m - 1) ** 2 / (1 + (m - 1) * truth) ** 2)
    se = information.rsqrt()
    assert bool(((estimate - truth).abs()[big] < 4 * se[big]).all()), (estimate[big], truth[big], se[big])


def test_held_out_joint_likelihood_of_related_test_points():
    train_groups = torch.arange(40) // 4
    objective = DependentMaximumLikelihood(groups=train_groups, value=0.35)
    flow = _flow()
    test_groups = torch.tensor([0, 0, 1, 1, 1, 2])
    held = objective.held_out(groups=test_groups)
    assert held.n == 6 and held.value == pytest.approx(0.35)
    x = torch.randn(6, 2, dtype=F64)
    with torch.no_grad():
        z, ladj = held.latents(flow, x)
        sigma = _groups_sigma(test_groups, 0.35)
        dense = torch.distributions.MultivariateNormal(torch.zeros(6, dtype=F64), sigma).log_prob(z.T).sum()
        assert torch.allclose(held.log_likelihood(flow, x), ladj.sum() + dense, rtol=1e-12)
    sized = DependentMaximumLikelihood(groups=torch.tensor([0, 0, 1, 1, 1, 2, 2, 2]), rho="size")
    sized.logits = torch.logit(torch.tensor([0.2, 0.7], dtype=F64))  # sizes 2 and 3
    other = sized.held_out(groups=torch.tensor([5, 5, 5, 1, 1]))  # groups by sorted label: 1 (size 2), 5 (size 3)
    assert other.structure.group_rho(other.values).tolist() == pytest.approx([0.2, 0.7])
    with pytest.raises(ValueError, match="size 4"):
        sized.held_out(groups=torch.tensor([0, 0, 0, 0]))
    with pytest.raises(ValueError, match="does not carry"):
        DependentMaximumLikelihood(groups=train_groups, rho="group").held_out(groups=test_groups)
    with pytest.raises(ValueError, match="give the held-out points' groups"):
        objective.held_out(kinship=torch.eye(3))
    with pytest.raises(ValueError, match="exactly one"):
        objective.held_out()
    kin = DependentMaximumLikelihood(kinship=_kinship(20), value=0.6).held_out(kinship=_kinship(5, rank=3))
    assert kin.n == 5 and kin.value == pytest.approx(0.6)


def test_the_value_belongs_to_the_restored_best_weights():
    n = 200
    g = torch.Generator().manual_seed(0)
    groups = torch.arange(n) // 10
    x = torch.randn(n, 2, generator=g) * 0.5 + 0.5 * torch.randn(n // 10, 2, generator=g)[groups]
    torch.manual_seed(0)
    flow = flowkit.flows.RealNVP(2, transforms=2, hidden=(16,))
    objective = DependentMaximumLikelihood(groups=groups)
    update = DependenceUpdate(objective, flow, x, every=1000)
    val = torch.randn(100, 2, generator=g) + 4.0  # far from the training points: training makes it worse
    history = fit(
        flow, objective, with_indices(x), steps=40, batch_size=50, lr=5e-2, val_data=val, val_every=5,
        restore_best=True, callbacks=[update], progress=False,
    )  # fmt: skip
    assert history.best_step < 40  # the best weights are not the last ones
    final = objective.value
    assert objective.update(flow, x) == pytest.approx(final, abs=1e-12)  # the value was fitted to the returned flow


def test_the_final_update_is_skipped_when_the_last_step_already_fitted_those_weights(monkeypatch):
    n = 60
    groups = torch.arange(n) // 6
    x = torch.randn(n, 2, generator=torch.Generator().manual_seed(1))
    flow = flowkit.flows.RealNVP(2, transforms=1, hidden=(8,))
    objective = DependentMaximumLikelihood(groups=groups)
    calls = []
    update = objective.update
    monkeypatch.setattr(objective, "update", lambda *a: calls.append(1) or update(*a))
    callback = DependenceUpdate(objective, flow, x, every=5)
    fit(flow, objective, with_indices(x), steps=10, batch_size=20, callbacks=[callback], progress=False)
    assert len(calls) == 2  # after steps 5 and 10; the end adds none on unchanged weights
    fit(flow, objective, with_indices(x), steps=12, batch_size=20, callbacks=[callback], progress=False)
    assert len(calls) == 5  # a resumed-free second run: steps 5 and 10, then the end on the weights of step 12


def test_bad_rho_tyings_and_ranges():
    with pytest.raises(ValueError, match="rho must be one of"):
        DependentMaximumLikelihood(groups=torch.arange(6) // 2, rho="block")
    with pytest.raises(ValueError, match="for groups"):
        DependentMaximumLikelihood(kinship=torch.eye(4), rho="group")
    objective = DependentMaximumLikelihood(groups=torch.arange(6) // 2, rho="group")
    with pytest.raises(ValueError, match="3 parameters"):
        objective.logit  # noqa: B018
    with pytest.raises(ValueError, match="expected 3 values"):
        objective.structure.log_det(torch.tensor([0.5, 0.5], dtype=F64))
    with pytest.raises(ValueError, match="low <= high"):
        equicorrelated_groups(rho=(0.9, 0.5))
    with pytest.raises(ValueError, match="a range"):
        equicorrelated_groups(rho=(0.1, 0.5, 0.9))
    with pytest.raises(ValueError, match="rho"):
        equicorrelated_groups(rho=(0.5, 1.0))
    assert objective.metrics().keys() == {"rho_mean"}


@pytest.mark.parametrize("kind", ["kinship", "groups"])
def test_control_variate_keeps_the_expectation_and_cuts_the_variance(kind):
    n, b = 120, 16
    groups = torch.arange(n) // 30  # four large, strongly correlated groups
    structure = {"kinship": _kinship(n, rank=5)} if kind == "kinship" else {"groups": groups, "rho": "group"}
    plain = DependentMaximumLikelihood(**structure, value=0.9)
    varied = DependentMaximumLikelihood(**structure, value=0.9, control_variate=True)
    g = torch.Generator().manual_seed(4)
    flow = _flow()
    x = torch.randn(n, 2, dtype=F64, generator=g) + torch.randn(4, 2, dtype=F64, generator=g)[groups]
    with torch.no_grad():
        z, ladj = plain.latents(flow, x)
        varied.cache_latents(z + 0.05 * torch.randn(n, 2, dtype=F64, generator=g))  # latents of a nearby flow
        full = float(plain.log_likelihood(flow, x)) / n
        everything = torch.arange(n)
        assert math.isclose(float((ladj + varied.point_terms(z, everything)).mean()), full, rel_tol=1e-10)
        draws = {}
        for name, objective in (("plain", plain), ("varied", varied)):
            batches = (torch.randperm(n, generator=g)[:b] for _ in range(2000))
            draws[name] = torch.stack([(ladj[i] + objective.point_terms(z[i], i)).mean() for i in batches])
    for name, d in draws.items():
        mean, se = float(d.mean()), float(d.std()) / math.sqrt(len(d))
        assert abs(mean - full) < 3 * se, (name, mean, full, se)
    assert draws["varied"].std() < draws["plain"].std() / 2


def test_control_variate_cache_follows_the_parameter():
    n = 40
    groups = torch.arange(n) // 8
    objective = DependentMaximumLikelihood(groups=groups, control_variate=True)
    flow = _identity_flow()
    z = torch.randn(n, 2, dtype=F64)
    objective.update(flow, z)  # caches z~ with the new rho
    assert objective.cache is not None and torch.equal(objective.cache[1], z)
    objective.logit = 0.3  # the parameter moves: the products are recomputed for the new A
    with torch.no_grad():
        terms = objective.point_terms(z, torch.arange(n))
    plain = DependentMaximumLikelihood(groups=groups)
    plain.logit = 0.3
    assert torch.allclose(terms.sum(), plain.point_terms(z, torch.arange(n)).sum(), rtol=1e-12)
    with pytest.raises(ValueError, match="control_variate"):
        DependentMaximumLikelihood(groups=groups, control_variate=1)
    with pytest.raises(ValueError, match="cached latents"):
        objective.point_terms(torch.randn(3, 3, dtype=F64), torch.arange(3))


def test_a_dependent_normal_base_carries_rho_through_save_load_and_an_exact_resume(tmp_path):
    n = 64
    x = torch.randn(n, 2, generator=torch.Generator().manual_seed(3))
    groups = torch.arange(n) // 8

    def run(directory, resume, kill=False):
        torch.manual_seed(0)
        objective = DependentMaximumLikelihood(groups=groups, rho="group")
        flow = flowkit.flows.RealNVP(2, transforms=1, hidden=(8,), base=objective.base(2))
        # Killed mid-training: no end-of-run update, as for a real kill.
        callbacks = [DependenceUpdate(objective, flow, x, every=2), *([KillAt(3)] if kill else [])]
        options = dict(steps=6, batch_size=16, progress=False, seed=0, checkpoint_dir=directory, resume=resume)
        fit(flow, objective, with_indices(x), callbacks=callbacks, checkpoint_every=1, **options)
        return flow, objective

    straight, straight_objective = run(tmp_path / "straight", False)
    with pytest.raises(Killed):
        run(tmp_path / "resumed", False, kill=True)  # after the update at step 2 and the checkpoint of step 3
    resumed, resumed_objective = run(tmp_path / "resumed", True)
    assert not torch.equal(straight.base.logits, torch.zeros(8, dtype=torch.float64))  # rho moved from 0.5
    for a, b in zip(straight.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b)  # the weights and the rho's, bit for bit
    assert torch.equal(straight_objective.values, resumed_objective.values)
    # The objective's values are the model's, and the saved model keeps them.
    assert torch.equal(straight_objective.values, straight.base.values)
    flowkit.io.save(straight, tmp_path / "model")
    loaded = flowkit.io.load(tmp_path / "model")
    assert isinstance(loaded.base, flowkit.distributions.DependentNormal)
    assert torch.equal(loaded.base.values, straight.base.values)


def _dependent_run(directory, resume=False, kill=None, base="dependent-normal", every=3):
    """8 steps on 48 points in groups of 6 (a rho per group, the control variate), checkpoints every 2 steps.

    A fresh flow and objective, as in a new process; `kill` stops the run at the end of that step.
    """
    n = 48
    x = torch.randn(n, 2, generator=torch.Generator().manual_seed(3))
    torch.manual_seed(0)
    objective = DependentMaximumLikelihood(groups=torch.arange(n) // 6, rho="group", control_variate=True)
    plain = base == "standard-normal"
    flow = flowkit.flows.RealNVP(2, transforms=1, hidden=(8,), base=None if plain else objective.base(2))
    callbacks = [DependenceUpdate(objective, flow, x, every=every), *([KillAt(kill)] if kill else [])]
    options = dict(steps=8, batch_size=12, progress=False, seed=0, checkpoint_every=2, resume=resume)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        history = fit(flow, objective, with_indices(x), callbacks=callbacks, checkpoint_dir=directory, **options)
    return flow, objective, history


def _assert_same_dependent_run(straight, resumed) -> None:
    (flow_a, objective_a, history_a), (flow_b, objective_b, history_b) = straight, resumed
    for (name, a), b in zip(flow_a.state_dict().items(), flow_b.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert not torch.equal(objective_a.logits, torch.zeros(8, dtype=F64))  # rho moved from 0.5
    assert torch.equal(objective_a.logits, objective_b.logits)
    for a, b in zip(objective_a.cache, objective_b.cache, strict=True):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
    assert history_a.step == history_b.step == list(range(1, 9))
    assert history_a.loss == history_b.loss and history_a.grad_norm == history_b.grad_norm
    assert history_a.metrics == history_b.metrics


@pytest.mark.parametrize("base", ["dependent-normal", "standard-normal"])
@pytest.mark.parametrize("every", [2, 3])  # the checkpoint it resumes from (step 4's) at an update, or between two
def test_a_killed_dependent_run_with_a_control_variate_resumes_bit_for_bit(tmp_path, base, every):
    straight = _dependent_run(None, base=base, every=every)
    with pytest.raises(Killed):  # the checkpoint of step 4 holds the last update (of step 4 or 3), its cached latents
        _dependent_run(tmp_path, kill=5, base=base, every=every)
    _assert_same_dependent_run(straight, _dependent_run(tmp_path, resume=True, base=base, every=every))


def test_a_dependent_run_killed_by_sigkill_resumes_bit_for_bit(tmp_path):
    # Killed at the end of step 5, after the update of step 3: the checkpoint of step 4 holds the rho's (in the
    # flow's base), the control variate's cached latents and the RNG states; nothing of the killed process is left.
    run_killed_by_sigkill(__file__, f"_dependent_run({str(tmp_path)!r}, kill=5)")
    saved = load_state(tmp_path / CHECKPOINT_FILE)
    assert saved["step"] == 4 and saved["objective"][0]["cache"] is not None
    _assert_same_dependent_run(_dependent_run(None), _dependent_run(tmp_path, resume=True))


def test_dependent_state_round_trips_and_refuses_another_objectives():
    groups = torch.arange(12) // 3
    objective = DependentMaximumLikelihood(groups=groups, rho="group", control_variate=True)
    with pytest.warns(DeprecationWarning, match="plain StandardNormal"):
        objective.update(_identity_flow(), torch.randn(12, 2, dtype=F64))
    other = DependentMaximumLikelihood(groups=groups, rho="group", control_variate=True)
    other.load_state_dict(objective.state_dict())
    assert torch.equal(other.values, objective.values) and torch.equal(other.cache[1], objective.cache[1])
    with pytest.raises(ValueError, match=r"logits must be float64 of shape \(1,\)"):
        DependentMaximumLikelihood(groups=groups).load_state_dict(objective.state_dict())
    with pytest.raises(ValueError, match="cache must hold"):
        DependentMaximumLikelihood(groups=torch.arange(8) // 2, rho="group").load_state_dict(objective.state_dict())


def test_a_plain_standard_normal_base_warns_that_rho_is_not_saved():
    objective = DependentMaximumLikelihood(groups=torch.arange(8) // 2)
    flow = flowkit.flows.RealNVP(2, transforms=1, hidden=(4,))
    with pytest.warns(DeprecationWarning, match=r"base=objective.base\(features\)"):
        objective.loss(flow, (torch.randn(8, 2), torch.arange(8)))
    wrong = flowkit.flows.RealNVP(2, transforms=1, hidden=(4,), base=flowkit.distributions.DependentNormal(2, 3))
    with pytest.raises(ValueError, match="holds 3 parameters, the objective has 1"):
        objective.loss(wrong, (torch.randn(8, 2), torch.arange(8)))
