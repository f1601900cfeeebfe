import json

import pytest
import torch

import flowkit
from flowkit.bijectors import ActNorm, Chain, LULinear, Permutation
from flowkit.distributions import DiagNormal
from flowkit.flows import Flow, RealNVP
from flowkit.testing import randomize


def _models():
    yield randomize(RealNVP(3, transforms=3, hidden=(8,), context=2))
    an = ActNorm(3)
    an(torch.randn(50, 3) * 4)
    yield Flow(Chain(an, Permutation(3), randomize(LULinear(3))), randomize(DiagNormal(3)))


@pytest.mark.parametrize("model", list(_models()))
def test_round_trip_gives_identical_log_prob(model, tmp_path):
    model.eval()
    flowkit.io.save(model, tmp_path / "m")
    loaded = flowkit.io.load(tmp_path / "m").eval()
    assert type(loaded) is type(model)
    x = torch.randn(10, 3)
    c = torch.randn(10, model.context_features) if model.context_features else None
    assert torch.equal(model.log_prob(x, c), loaded.log_prob(x, c))


def test_float64_model_round_trip(tmp_path):
    model = randomize(RealNVP(2, transforms=2, hidden=(8,))).double()
    flowkit.io.save(model, tmp_path / "m")
    loaded = flowkit.io.load(tmp_path / "m")
    x = torch.randn(4, 2, dtype=torch.float64)
    assert torch.equal(model.log_prob(x), loaded.log_prob(x))


def test_actnorm_initialisation_is_restored(tmp_path):
    model = Flow(ActNorm(2), DiagNormal(2))
    model(torch.randn(20, 2) * 3)
    flowkit.io.save(model, tmp_path / "m")
    loaded = flowkit.io.load(tmp_path / "m").train()
    x = torch.randn(5, 2) * 100
    loaded(x)  # must not re-initialise on this batch
    torch.testing.assert_close(loaded.bijector.loc, model.bijector.loc)


def test_no_pickle_in_the_files(tmp_path):
    flowkit.io.save(RealNVP(2, transforms=1, hidden=(4,)), tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "weights.safetensors"]
    json.loads((tmp_path / "m" / "config.json").read_text())


def test_foreign_class_is_refused(tmp_path):
    flowkit.io.save(RealNVP(2, transforms=1, hidden=(4,)), tmp_path / "m")
    path = tmp_path / "m" / "config.json"
    header = json.loads(path.read_text())
    header["model"]["class"] = "os.system"
    path.write_text(json.dumps(header))
    with pytest.raises(ValueError, match="not a flowkit class"):
        flowkit.io.load(tmp_path / "m")


def test_nested_foreign_class_is_refused(tmp_path):
    flowkit.io.save(RealNVP(2, transforms=1, hidden=(4,)), tmp_path / "m")
    path = tmp_path / "m" / "config.json"
    text = path.read_text().replace('"RealNVP"', '"subprocess.Popen"')
    path.write_text(text)
    with pytest.raises(ValueError, match="not a flowkit class"):
        flowkit.io.load(tmp_path / "m")


def test_corrupt_config_is_a_clear_error(tmp_path):
    flowkit.io.save(RealNVP(2, transforms=1, hidden=(4,)), tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        flowkit.io.load(tmp_path / "m")


def test_corrupt_weights_are_a_clear_error(tmp_path):
    flowkit.io.save(RealNVP(2, transforms=1, hidden=(4,)), tmp_path / "m")
    (tmp_path / "m" / "weights.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ValueError, match="not a valid safetensors"):
        flowkit.io.load(tmp_path / "m")


def test_weights_of_another_model_are_refused(tmp_path):
    flowkit.io.save(RealNVP(2, transforms=1, hidden=(4,)), tmp_path / "a")
    flowkit.io.save(RealNVP(2, transforms=2, hidden=(4,)), tmp_path / "b")
    (tmp_path / "a" / "weights.safetensors").write_bytes((tmp_path / "b" / "weights.safetensors").read_bytes())
    with pytest.raises(ValueError, match="do not fit"):
        flowkit.io.load(tmp_path / "a")


def test_missing_file_and_foreign_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such model"):
        flowkit.io.load(tmp_path / "nope")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "config.json").write_text('{"hello": 1}')
    (tmp_path / "x" / "weights.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="not a flowkit model"):
        flowkit.io.load(tmp_path / "x")


def test_mixed_precision_model_keeps_each_dtype(tmp_path):
    model = randomize(RealNVP(2, transforms=2, hidden=(8,)))
    model.bijector[0].double()
    flowkit.io.save(model, tmp_path / "m")
    loaded = flowkit.io.load(tmp_path / "m")
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert a.dtype == b.dtype and torch.equal(a, b), name


def _rewrite(tmp_path, model, edit):
    flowkit.io.save(model, tmp_path / "m")
    path = tmp_path / "m" / "config.json"
    header = json.loads(path.read_text())
    edit(header)
    path.write_text(json.dumps(header))


def test_a_config_that_is_not_a_model_is_refused(tmp_path):
    _rewrite(tmp_path, RealNVP(2, transforms=1, hidden=(4,)), lambda h: h.update(model={"class": "MaximumLikelihood", "args": {}}))
    with pytest.raises(ValueError, match="not a model"):
        flowkit.io.load(tmp_path / "m")


def test_a_config_the_constructor_rejects_is_a_clear_error(tmp_path):
    def negative_width(header):
        header["model"]["args"]["hidden"] = [-1]

    _rewrite(tmp_path, RealNVP(2, transforms=1, hidden=(4,)), negative_width)
    with pytest.raises(ValueError, match="cannot build RealNVP"):
        flowkit.io.load(tmp_path / "m")


def test_non_finite_weights_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    flowkit.io.save(RealNVP(2, transforms=1, hidden=(4,)), tmp_path / "m")
    weights = tmp_path / "m" / "weights.safetensors"
    state = load_file(str(weights))
    key = next(k for k, v in state.items() if v.is_floating_point() and v.numel())
    state[key] = torch.full_like(state[key], float("nan"))
    save_file(state, str(weights), metadata={"format": "flowkit"})
    with pytest.raises(ValueError, match="non-finite"):
        flowkit.io.load(tmp_path / "m")
