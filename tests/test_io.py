import importlib
import json
import math
import re

import pytest
import torch

import flowkit
from flowkit._config import Configurable, registry
from flowkit.bijectors import ActNorm, Chain, LULinear, Permutation, Standardization
from flowkit.distributions import DiagNormal, StandardNormal
from flowkit.flows import Flow, RealNVP
from flowkit.io import from_config, to_config
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
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), name


def _rewrite(tmp_path, model, edit):
    flowkit.io.save(model, tmp_path / "m")
    path = tmp_path / "m" / "config.json"
    header = json.loads(path.read_text())
    edit(header)
    path.write_text(json.dumps(header))


def test_a_config_that_is_not_a_model_is_refused(tmp_path):
    _rewrite(
        tmp_path,
        RealNVP(2, transforms=1, hidden=(4,)),
        lambda h: h.update(model={"class": "MaximumLikelihood", "args": {}}),
    )
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_finite_weights_too_large_to_compute_with_are_refused(tmp_path, dtype):
    from safetensors.torch import load_file, save_file

    flow = RealNVP(2, transforms=1, hidden=(4,)).to(dtype)
    flowkit.io.save(flow, tmp_path / "m")
    weights = tmp_path / "m" / "weights.safetensors"
    state = load_file(str(weights))
    bound = math.sqrt(torch.finfo(dtype).max)
    absurd = {
        k: torch.full_like(v, torch.finfo(dtype).max / 1.1) if v.is_floating_point() else v for k, v in state.items()
    }
    save_file(absurd, str(weights), metadata={"format": "flowkit"})
    with pytest.raises(ValueError, match=r"with a value of magnitude .* beyond .*the square root of the largest"):
        flowkit.io.load(tmp_path / "m")
    # half the bound of the dtype loads (in float64, far beyond the float32 bound)
    key = next(k for k, v in state.items() if v.is_floating_point() and v.numel())
    save_file({**state, key: torch.full_like(state[key], bound / 2)}, str(weights), metadata={"format": "flowkit"})
    flowkit.io.load(tmp_path / "m")


def test_save_to_an_existing_file_names_the_path(tmp_path):
    (tmp_path / "a_file").write_text("")
    flow = RealNVP(2, transforms=1, hidden=(4,))
    with pytest.raises(
        ValueError,
        match=rf"save: {re.escape(str(tmp_path / 'a_file'))} is an existing file; a model is saved as a directory",
    ):
        flowkit.io.save(flow, tmp_path / "a_file")
    with pytest.raises(
        ValueError, match=rf"is inside {re.escape(str(tmp_path / 'a_file'))}, which is an existing file"
    ):
        flowkit.io.save(flow, tmp_path / "a_file" / "model")
    assert (tmp_path / "a_file").read_text() == ""


# to_config / from_config on their own: the nested config, its round trip, and what is refused.


def _standardized_flow():
    layers = Chain(Permutation(3, seed=1), Standardization([1.0, -2.0, 0.5], [2.0, 0.5, 4.0]))
    return Flow(layers, DiagNormal(3, loc=0.5, scale=2.0, trainable=False))


def test_to_config_gives_the_nested_constructor_arguments():
    config = to_config(_standardized_flow())
    assert config == {
        "class": "Flow",
        "args": {
            "bijector": {
                "class": "Chain",
                "args": {
                    "*bijectors": [
                        {"class": "Permutation", "args": {"features": 3, "seed": 1}},
                        {"class": "Standardization", "args": {"loc": [1.0, -2.0, 0.5], "scale": [2.0, 0.5, 4.0]}},
                    ]
                },
            },
            "base": {"class": "DiagNormal", "args": {"event_shape": 3, "loc": 0.5, "scale": 2.0, "trainable": False}},
        },
    }
    assert json.loads(json.dumps(config)) == config


def test_from_config_rebuilds_the_same_model_from_json():
    model = _standardized_flow()
    rebuilt = from_config(json.loads(json.dumps(to_config(model))))
    assert type(rebuilt) is Flow and [type(b) for b in rebuilt.bijector] == [Permutation, Standardization]
    assert type(rebuilt.base) is DiagNormal
    assert to_config(rebuilt) == to_config(model)
    perm = model.bijector[0].perm
    assert torch.equal(rebuilt.bijector[0].perm, perm)
    # every buffer comes from the config alone: the density is the closed form
    x = torch.randn(6, 3)
    loc, scale = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([2.0, 0.5, 4.0])
    z = (x[:, perm] - loc) / scale
    expected = (-0.5 * ((z - 0.5) / 2.0) ** 2 - math.log(2.0) - 0.5 * math.log(2 * math.pi)).sum(-1) - scale.log().sum()
    torch.testing.assert_close(rebuilt.log_prob(x), expected)


class _Holder(Configurable):
    """A test-only configurable with a dict argument (not in the registry: its name starts with an underscore)."""

    def __init__(self, options, extra=None):
        self.options = options
        self.extra = extra


def test_dict_arguments_round_trip(monkeypatch):
    monkeypatch.setitem(registry, "_Holder", _Holder)
    # a dict whose keys look like a nested config must come back as a dict, not be built
    options = {"class": "os.system", "args": {}, "flag": None, "sizes": [1, 2.5, True], "base": StandardNormal(2)}
    holder = _Holder(options, extra=[Permutation(2, seed=0), "text"])
    config = to_config(holder)
    assert config == {
        "class": "_Holder",
        "args": {
            "options": {
                "__dict__": {
                    "class": "os.system",
                    "args": {"__dict__": {}},
                    "flag": None,
                    "sizes": [1, 2.5, True],
                    "base": {"class": "StandardNormal", "args": {"event_shape": 2}},
                }
            },
            "extra": [{"class": "Permutation", "args": {"features": 2, "seed": 0}}, "text"],
        },
    }
    rebuilt = from_config(json.loads(json.dumps(config)))
    assert type(rebuilt) is _Holder
    assert {k: v for k, v in rebuilt.options.items() if k != "base"} == {
        "class": "os.system",
        "args": {},
        "flag": None,
        "sizes": [1, 2.5, True],
    }
    assert type(rebuilt.options["base"]) is StandardNormal and rebuilt.options["base"].event_shape == (2,)
    assert type(rebuilt.extra[0]) is Permutation and rebuilt.extra[1] == "text"
    assert to_config(rebuilt) == config


def test_positional_arguments_round_trip():
    chain = Chain(Permutation(2, seed=0), Standardization([1.0, 2.0], [3.0, 4.0]), Permutation(2, seed=5))
    config = to_config(chain)
    assert list(config["args"]) == ["*bijectors"] and len(config["args"]["*bijectors"]) == 3
    rebuilt = from_config(json.loads(json.dumps(config)))
    assert [type(b) for b in rebuilt] == [Permutation, Standardization, Permutation]
    assert to_config(rebuilt) == config


@pytest.mark.parametrize(
    "config",
    [
        None,
        [],
        "Flow",
        {"class": "Flow"},
        {"args": {}},
        {"class": "Flow", "args": []},
        {"class": "Flow", "args": {}, "extra": 1},
    ],
)
def test_from_config_refuses_malformed_configs(config):
    with pytest.raises(ValueError, match="invalid model config at config: expected an object with 'class' and 'args'"):
        from_config(config)


@pytest.mark.parametrize(
    "config,where,name",
    [
        ({"class": "os.system", "args": {}}, "config", "'os.system'"),
        ({"class": 3, "args": {}}, "config", "3"),
        ({"class": "Configurable", "args": {}}, "config", "'Configurable'"),
        ({"class": "_Holder", "args": {}}, "config", "'_Holder'"),
        (
            {
                "class": "Chain",
                "args": {
                    "*bijectors": [
                        {"class": "Permutation", "args": {"features": 2}},
                        {"class": "eval", "args": {}},
                    ]
                },
            },
            "config.Chain.*bijectors[1]",
            "'eval'",
        ),
    ],
)
def test_from_config_refuses_unregistered_classes_and_says_where(config, where, name):
    message = f"model config at {re.escape(where)} names {re.escape(name)}, which is not a flowkit class"
    with pytest.raises(ValueError, match=message):
        from_config(config)


@pytest.mark.parametrize(
    "config,match",
    [
        ({"class": "Flow", "args": {}}, "cannot build Flow from the model config at config: .*'bijector'"),
        ({"class": "StandardNormal", "args": {"event_shape": 2, "bogus": 1}}, "cannot build StandardNormal .*'bogus'"),
        (
            {"class": "Standardization", "args": {"loc": [0.0], "scale": [-1.0]}},
            "cannot build Standardization .*scale must be positive",
        ),
        (
            {"class": "StandardNormal", "args": {"event_shape": {"a": 1}}},
            "invalid model config at config.StandardNormal.event_shape",
        ),
        ({"class": "StandardNormal", "args": {"event_shape": (2,)}}, "invalid value at config.StandardNormal.event_"),
    ],
)
def test_from_config_refuses_bad_arguments_with_a_value_error(config, match):
    with pytest.raises(ValueError, match=match):
        from_config(config)


def test_to_config_refuses_what_json_cannot_hold():
    with pytest.raises(TypeError, match="cannot save argument Standardization.loc of type Tensor"):
        to_config(Standardization(torch.zeros(2), torch.ones(2)))
    with pytest.raises(TypeError, match="Linear was not built through a flowkit constructor"):
        to_config(torch.nn.Linear(2, 2))


class _Positional(Configurable):
    def __init__(self, name, *items):
        self.name, self.items = name, items


def test_from_config_rebuilds_named_then_variadic_positional_arguments(monkeypatch):
    monkeypatch.setitem(registry, "_Positional", _Positional)
    rebuilt = from_config(json.loads(json.dumps(to_config(_Positional("a", 1, 2)))))
    assert rebuilt.name == "a" and rebuilt.items == (1, 2)


def test_from_config_refuses_a_variadic_argument_that_is_not_a_list():
    with pytest.raises(ValueError, match=r"\*bijectors must be a list"):
        from_config({"class": "Chain", "args": {"*bijectors": 5}})


def test_to_config_of_a_non_flowkit_object_names_it():
    with pytest.raises(TypeError, match="int was not built"):
        to_config(3)


@pytest.mark.parametrize("scale", [float("nan"), float("inf")])
def test_from_config_refuses_a_non_finite_scale(scale):
    with pytest.raises(ValueError, match="scale"):
        from_config(json.loads(json.dumps({"class": "DiagNormal", "args": {"event_shape": 2, "scale": scale}})))


def test_from_config_refuses_a_negative_event_shape():
    with pytest.raises(ValueError, match="negative sizes"):
        from_config({"class": "StandardNormal", "args": {"event_shape": -2}})


# Factories (a preset's conditioner=) and the migration of configs saved by older versions.


def test_a_registered_class_or_a_partial_of_one_round_trips():
    from functools import partial

    from flowkit.io import _decode, _encode
    from flowkit.nn import MADE, MLP

    encoded = _encode(partial(MLP, hidden=(16, 8), periodic=True), "conditioner")
    assert encoded == {"__factory__": {"class": "MLP", "args": {"hidden": [16, 8], "periodic": True}}}
    decoded = _decode(json.loads(json.dumps(encoded)), "conditioner")
    assert decoded.func is MLP and decoded.keywords == {"hidden": [16, 8], "periodic": True} and not decoded.args
    assert _decode(_encode(MADE, "conditioner"), "conditioner") is MADE


def test_factories_that_cannot_be_saved_are_refused_by_name():
    from functools import partial

    from flowkit.io import _decode, _encode
    from flowkit.nn import MLP

    with pytest.raises(TypeError, match="cannot save argument conditioner of type partial"):
        _encode(partial(MLP, 1, hidden=(4,)), "conditioner")  # positional arguments
    with pytest.raises(TypeError, match="cannot save argument RealNVP.conditioner of type function"):
        to_config(RealNVP(2, transforms=1, conditioner=lambda i, o, context: MLP(i, o, context=context)))
    with pytest.raises(ValueError, match="names 'os.system', which is not a flowkit class"):
        _decode({"__factory__": {"class": "os.system", "args": {}}}, "conditioner")
    with pytest.raises(ValueError, match="a factory needs 'class' and 'args'"):
        _decode({"__factory__": "MLP"}, "conditioner")


def test_migrate_rewrites_the_old_layer_classes_and_leaves_the_rest():
    from flowkit._legacy import RULES, migrate

    old = {
        "class": "Chain",
        "args": {
            "*bijectors": [
                {
                    "class": "AffineCoupling",
                    "args": {"features": 2, "mask": None, "parity": 1, "hidden": [4], "context": 0, "clamp": 3.0},
                },
                {"class": "Permutation", "args": {"features": 2, "seed": 0}},
                {
                    "class": "MaskedSplineAutoregressive",
                    "args": {"features": 2, "bins": 3, "bound": 2.0, "hidden": [4]},
                },
                {"class": "CircularSplineCoupling", "args": {"features": 2, "bins": 2, "parity": 0, "hidden": [5]}},
            ]
        },
    }
    before = json.dumps(old)
    new = migrate(old)
    assert json.dumps(old) == before  # the input is not changed
    affine, permutation, spline, circular = new["args"]["*bijectors"]
    assert affine == {
        "class": "Coupling",
        "args": {
            "transformer": {"class": "Affine", "args": {"clamp": 3.0}},
            "features": 2,
            "mask": None,
            "parity": 1,
            "hidden": [4],
            "context": 0,
        },
    }
    assert permutation == old["args"]["*bijectors"][1]
    assert spline["class"] == "MaskedAutoregressive"
    assert spline["args"]["transformer"] == {"class": "RationalQuadraticSpline", "args": {"bins": 3, "bound": 2.0}}
    assert circular["class"] == "Coupling"
    assert circular["args"]["conditioner"] == {
        "class": "MLP",
        "args": {
            "in_features": 1,
            "out_features": 7,
            "hidden": [5],
            "activation": "relu",
            "context": 0,
            "periodic": True,
        },
    }
    chain = from_config(new)
    assert [type(b).__name__ for b in chain] == ["Coupling", "Permutation", "MaskedAutoregressive", "Coupling"]
    assert {rule.cls for rule in RULES} >= {"AffineCoupling", "SplineCoupling", "CircularSplineCoupling"}
    assert all(rule.name for rule in RULES)
    for value in (None, [], "Flow", {"class": "Flow"}, {"__dict__": {"a": 1}}):
        assert migrate(value) == value


# Files from untrusted sources: every way the review broke load is a clear ValueError.


def _tamper_weights(directory, **replace):
    from safetensors.torch import load_file, save_file

    weights = directory / "weights.safetensors"
    state = load_file(str(weights))
    state.update(replace)
    save_file(state, str(weights), metadata={"format": "flowkit-model"})


@pytest.mark.parametrize(
    ("perm", "match"),
    [([0, 0, 0], "not a permutation of 0..2"), ([0, 1, 7], "not a permutation of 0..2"), ([2.0, 0.0, 1.0], "dtype")],
)
def test_a_loaded_permutation_must_be_one(tmp_path, perm, match):
    flowkit.io.save(Flow(Permutation(3, seed=0), StandardNormal(3)), tmp_path / "m")
    _tamper_weights(tmp_path / "m", **{"bijector.perm": torch.tensor(perm)})
    with pytest.raises(ValueError, match=match):
        flowkit.io.load(tmp_path / "m")
    with pytest.raises(ValueError, match=match if match != "dtype" else "must hold integers"):
        Permutation(3).load_state_dict({"perm": torch.tensor(perm)})  # the layer checks, not io


def test_a_loaded_reverse_must_reverse():
    with pytest.raises(ValueError, match="does not reverse"):
        flowkit.bijectors.Reverse(3).load_state_dict({"perm": torch.tensor([0, 1, 2])})


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("bijector.permutation", 5 * torch.eye(3), "not a signed permutation matrix"),
        ("bijector.permutation", torch.eye(3)[[0, 0, 1]], "not a signed permutation matrix"),
        ("bijector.log_diag", torch.full((3,), 3e38), "log_diag must lie in"),
        ("bijector.upper", torch.full((3, 3), 3e38), "overflow torch.float32"),
    ],
)
def test_lulinear_checks_the_values_it_loads(tmp_path, key, value, match):
    flowkit.io.save(Flow(randomize(LULinear(3)), StandardNormal(3)), tmp_path / "m")
    _tamper_weights(tmp_path / "m", **{key: value})
    with pytest.raises(ValueError, match=match):
        flowkit.io.load(tmp_path / "m")


def test_linear_checks_the_values_it_loads():
    layer = flowkit.bijectors.Linear(2)
    with pytest.raises(ValueError, match="overflow"):
        layer.load_state_dict({"weight": torch.full((2, 2), 3e38), "bias": torch.zeros(2)})
    with pytest.raises(ValueError, match="singular"):
        layer.load_state_dict({"weight": torch.ones(2, 2), "bias": torch.zeros(2)})
    signed = torch.tensor([[0.0, -1.0], [1.0, 0.0]])
    layer.load_state_dict({"weight": signed, "bias": torch.zeros(2)})  # a valid matrix loads
    assert torch.equal(layer.weight, signed)


@pytest.mark.parametrize("dtype", [torch.int32, torch.float16, torch.float64])
def test_weights_of_another_dtype_are_refused(tmp_path, dtype):
    flowkit.io.save(RealNVP(2, transforms=1, hidden=(4,)), tmp_path / "m")
    from safetensors.torch import load_file

    state = load_file(str(tmp_path / "m" / "weights.safetensors"))
    key = next(k for k, v in state.items() if v.is_floating_point())
    _tamper_weights(tmp_path / "m", **{key: state[key].to(dtype)})
    with pytest.raises(ValueError, match=f"holds '{re.escape(key)}' as {str(dtype)[6:]}, but the model config"):
        flowkit.io.load(tmp_path / "m")


def test_integer_weights_are_refused_in_a_mixed_precision_model(tmp_path):
    model = Flow(Chain(Permutation(2, seed=0), randomize(LULinear(2))), StandardNormal(2))
    model.bijector[1].double()
    flowkit.io.save(model, tmp_path / "m")
    _tamper_weights(tmp_path / "m", **{"bijector.layers.1.log_diag": torch.tensor([0, 1], dtype=torch.int32)})
    with pytest.raises(ValueError, match="as int32, but the model config gives it dtype float"):
        flowkit.io.load(tmp_path / "m")


def _time_load(path):
    import time

    start = time.perf_counter()
    with pytest.raises(ValueError, match="bigger model than its weights file holds") as error:
        flowkit.io.load(path)
    return time.perf_counter() - start, str(error.value)


def test_a_tiny_config_cannot_make_load_build_a_huge_model(tmp_path):
    flowkit.io.save(RealNVP(2, transforms=1, hidden=(4,)), tmp_path / "deep")
    _rewrite(tmp_path, RealNVP(2, transforms=1, hidden=(4,)), lambda h: h["model"]["args"].update(transforms=200000))
    seconds, message = _time_load(tmp_path / "m")
    assert seconds < 3, message  # it built for minutes
    assert len((tmp_path / "m" / "config.json").read_text().replace(" ", "").replace("\n", "")) < 400
    _rewrite(tmp_path, LULinear(3), lambda h: h["model"]["args"].update(features=30000))
    seconds, message = _time_load(tmp_path / "m")
    assert seconds < 1 and "(30000, 30000)" in message  # it allocated 3.75 GB (and factorised it)


def test_the_work_budget_lets_every_saved_model_load(tmp_path):
    from flowkit.flows import MAF, NSF

    for i, model in enumerate([NSF(50), MAF(20, transforms=10), RealNVP(5, transforms=30, hidden=(256, 256))]):
        flowkit.io.save(model, tmp_path / str(i))
        flowkit.io.load(tmp_path / str(i))


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_standard_json_numbers_in_a_config_are_refused(tmp_path, literal):
    flowkit.io.save(Flow(ActNorm(2), DiagNormal(2)), tmp_path / "m")
    path = tmp_path / "m" / "config.json"
    text = re.sub(r'"scale": [^,}\n]+', f'"scale": {literal}', path.read_text())
    assert literal in text
    path.write_text(text)
    with pytest.raises(ValueError, match=f"holds {re.escape(literal)}, which is not a finite number"):
        flowkit.io.load(tmp_path / "m")


@pytest.mark.parametrize("depth", [150, 2000, 100000])
def test_a_deeply_nested_config_is_refused(tmp_path, depth):
    flowkit.io.save(RealNVP(2, transforms=1, hidden=(4,)), tmp_path / "m")
    path = tmp_path / "m" / "config.json"
    header = json.loads(path.read_text())
    text = json.dumps(header).replace('"hidden": [4]', '"hidden": ' + "[" * depth + "4" + "]" * depth)
    path.write_text(text)
    with pytest.raises(ValueError, match="nested too deeply"):
        flowkit.io.load(tmp_path / "m")
    nested: object = 4
    for _ in range(min(depth, 5000)):
        nested = [nested]
    with pytest.raises(ValueError, match="nested too deeply"):
        from_config({"class": "StandardNormal", "args": {"event_shape": nested}})


@pytest.mark.parametrize("error", [IndexError, KeyError, ZeroDivisionError, AttributeError])
def test_any_failure_of_a_constructor_on_a_config_is_a_value_error(monkeypatch, error):
    class _Fragile(Configurable):
        def __init__(self, size=1):
            raise error("boom")

    monkeypatch.setitem(registry, "_Fragile", _Fragile)
    with pytest.raises(ValueError, match=f"cannot build _Fragile from the model config at config: {error.__name__}"):
        from_config({"class": "_Fragile", "args": {"size": 2}})


@pytest.mark.parametrize("location", ["cuda", "cuda:7", "mps", "meta", "no-such-device", 3])
def test_an_unavailable_map_location_is_a_value_error(tmp_path, location):
    if location == "cuda" and torch.cuda.is_available() or location == "cuda:7" and torch.cuda.device_count() > 7:
        pytest.skip("this machine has the device")
    if location == "mps" and torch.backends.mps.is_available():
        pytest.skip("this machine has the device")
    flowkit.io.save(RealNVP(2, transforms=1, hidden=(4,)), tmp_path / "m")
    with pytest.raises(ValueError, match="map_location"):
        flowkit.io.load(tmp_path / "m", map_location=location)


@pytest.mark.parametrize(
    "target",
    [
        lambda: flowkit.targets.DoubleWell(a=-0.4),
        lambda: flowkit.targets.ManyWell(4),
        lambda: flowkit.targets.GaussianMixture(dim=2, n_modes=3, seed=1),
    ],
)
def test_a_stochastic_flow_over_a_target_saves_and_loads(target, tmp_path):
    from flowkit.flows import MetropolisBlock, StochasticFlow

    target = target()
    d = target.event_shape[0]
    flow = StochasticFlow([Permutation(d, seed=0), MetropolisBlock(target, lam=0.5)], StandardNormal(d))
    flowkit.io.save(flow, tmp_path / "m")
    loaded = flowkit.io.load(tmp_path / "m")
    assert type(loaded.layers[1].target) is type(target)
    torch.manual_seed(3)
    a = flowkit.sampling.sample_with_log_weights(flow, 20, target)
    torch.manual_seed(3)
    b = flowkit.sampling.sample_with_log_weights(loaded, 20, loaded.layers[1].target)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_a_target_wrapping_a_function_is_refused_at_save_time(tmp_path):
    from flowkit.flows import MetropolisBlock, StochasticFlow

    energy = flowkit.targets.Energy(lambda x: x.square().sum(-1), (2,))
    flow = StochasticFlow([Permutation(2, seed=0), MetropolisBlock(energy, lam=0.5)], StandardNormal(2))
    with pytest.raises(TypeError, match="Energy"):
        flowkit.io.save(flow, tmp_path / "m")
    assert not (tmp_path / "m" / "config.json").exists()  # nothing written that load would refuse


def test_every_saveable_class_is_in_a_module_io_imports_before_it_builds():
    import pkgutil

    for info in pkgutil.walk_packages(flowkit.__path__, prefix="flowkit."):
        if info.name.split(".")[1] not in ("plot", "stochastic", "__main__"):
            importlib.import_module(info.name)
    homes = {cls.__module__.split(".")[1] for cls in registry.values() if cls.__module__.startswith("flowkit.")}
    assert homes <= set(flowkit.io.SAVEABLE_MODULES), sorted(homes - set(flowkit.io.SAVEABLE_MODULES))


# Objects several parents hold (a conditioner trunk shared by several layers) are written and built once.


def _shared_trunk_flow():
    from flowkit.bijectors import Coupling
    from flowkit.nn import SharedConditioner, SharedTrunk
    from flowkit.transformers import Affine

    trunk = SharedTrunk(2, (8,), context=1, embedding=3)
    layers = [
        Coupling(Affine(), 4, parity=k % 2, context=1, conditioner=SharedConditioner(trunk, 2, 4)) for k in range(3)
    ]
    return randomize(Flow(Chain(*layers), StandardNormal(4)))


def test_a_shared_trunk_round_trips_once(tmp_path):
    from safetensors import safe_open

    model = _shared_trunk_flow()
    flowkit.io.save(model, tmp_path / "m")
    loaded = flowkit.io.load(tmp_path / "m")
    trunks = {id(layer.conditioner.trunk) for layer in loaded.bijector}
    assert len(trunks) == 1
    count = sum(p.numel() for p in model.parameters())
    assert sum(p.numel() for p in loaded.parameters()) == count
    with safe_open(str(tmp_path / "m" / "weights.safetensors"), "pt") as f:
        assert sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys()) == count
    x, c = torch.randn(5, 4), torch.randn(5, 1)
    torch.testing.assert_close(loaded.log_prob(x, c), model.log_prob(x, c), rtol=0, atol=0)
    config = json.loads((tmp_path / "m" / "config.json").read_text())["model"]
    assert json.dumps(config).count('"__shared__"') == 3  # written once, referred to twice


def test_a_shared_preset_round_trips(tmp_path):
    from flowkit.flows import NSF

    model = randomize(NSF(3, transforms=3, hidden=(8,), bins=4, shared=True))
    flowkit.io.save(model, tmp_path / "m")
    loaded = flowkit.io.load(tmp_path / "m")
    x = torch.randn(5, 3)
    torch.testing.assert_close(loaded.log_prob(x), model.log_prob(x), rtol=0, atol=0)
    assert sum(p.numel() for p in loaded.parameters()) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "entry, match",
    [
        ({"id": 0}, "used before it is"),
        ({"id": "0", "object": {}}, "needs an integer 'id'"),
        ({"id": 0, "object": {"class": "Affine", "args": {}}, "extra": 1}, "defined twice or used before"),
    ],
)
def test_malformed_shared_entries_are_refused(entry, match):
    with pytest.raises(ValueError, match=match):
        from_config({"class": "Chain", "args": {"*bijectors": [{"__shared__": entry}]}})
