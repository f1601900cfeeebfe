"""Tampered models, checkpoints and data files: every `flowkit` command prints one line and exits with code 2."""

import json
import pickle
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

import flowkit
from flowkit.cli import main
from flowkit.train.checkpoint import load_state, save_state


def _error(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"flowkit {argv[0]}: error: "), err
    return err


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model"
    flow = flowkit.flows.Flow(
        flowkit.bijectors.Chain(flowkit.bijectors.Permutation(2, seed=0), flowkit.bijectors.AffineCoupling(2)),
        flowkit.distributions.StandardNormal(2),
    )
    flowkit.io.save(flow, path)
    return path


def _edit_config(path, edit):
    """Apply `edit` to the config's text, written compactly (`"clamp": 5.0`, `"hidden": [64, 64]`)."""
    config = path / "config.json"
    text = edit(json.dumps(json.loads(config.read_text())))
    config.write_text(text)


def _edit_weights(path, **replace):
    weights = path / "weights.safetensors"
    state = load_file(str(weights))
    state.update(replace)
    save_file(state, str(weights), metadata={"format": "flowkit-model"})


_PERMUTATION = '{"class": "Permutation", "args": {"features": 2, "seed": 0}}'
_EMPTY_ACTNORM = '{"class": "ActNorm", "args": {"event_shape": []}}'
_HUGE = '{"class": "RealNVP", "args": {"features": 2, "transforms": 200000}}'

TAMPERED_MODELS = {
    "nested 2,000 levels deep": (
        lambda p: _edit_config(p, lambda t: t.replace('"hidden": [64, 64]', '"hidden": ' + "[" * 2000 + "]" * 2000)),
        "nested too deeply",
    ),
    "a NaN literal": (lambda p: _edit_config(p, lambda t: t.replace('"clamp": 5.0', '"clamp": NaN')), "holds NaN"),
    "an Infinity literal": (
        lambda p: _edit_config(p, lambda t: t.replace('"clamp": 5.0', '"clamp": Infinity')),
        "holds Infinity",
    ),
    "ActNorm(event_shape=[])": (
        lambda p: _edit_config(
            p, lambda t: t.replace(_PERMUTATION, '{"class": "ActNorm", "args": {"event_shape": []}}')
        ),
        "cannot build ActNorm",
    ),
    "a tiny config for 200000 layers": (
        lambda p: _edit_config(p, lambda t: re.sub(r'"model": \{.*\}$', f'"model": {_HUGE}}}', t)),
        "bigger model than its weights file holds",
    ),
    "perm [0, 0]": (
        lambda p: _edit_weights(p, **{"bijector.layers.0.perm": torch.tensor([0, 0])}),
        "not a permutation",
    ),
    "int32 weights": (
        lambda p: _edit_weights(p, **{"bijector.layers.1.conditioner.0.bias": torch.zeros(64, dtype=torch.int32)}),
        "as int32, but the model config gives it dtype float32",
    ),
}


@pytest.mark.parametrize("case", list(TAMPERED_MODELS))
@pytest.mark.parametrize("command", ["check", "sample"])
def test_a_tampered_model_is_a_one_line_error(model, tmp_path, capsys, case, command):
    tamper, match = TAMPERED_MODELS[case]
    tamper(model)
    argv = [command, str(model)] + (["--out", str(tmp_path / "s.npy")] if command == "sample" else [])
    assert match in _error(capsys, argv)


@pytest.fixture
def fitted(tmp_path):
    out = tmp_path / "run"
    argv = ["fit", "moons", "--steps", "2", "--transforms", "1", "--hidden", "4", "--no-plots", "--no-progress"]
    assert main([*argv, "--out", str(out)]) == 0
    return out, [*argv, "--steps", "3", "--out", str(out), "--resume"]


def _rewrite_checkpoint(path, edit):
    state = load_state(path)
    edit(state)
    save_state(state, path)


def _rewrite_header(path, edit):
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        metadata, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    metadata["state"] = edit(metadata["state"])
    save_file(tensors, str(path), metadata=metadata)


TAMPERED_CHECKPOINTS = {
    "no RNG state (ZeroDivisionError)": (lambda p: _rewrite_checkpoint(p, lambda s: s.update(rng=[])), "'rng'"),
    "no step (KeyError)": (lambda p: _rewrite_checkpoint(p, lambda s: s.pop("step")), "'step' is missing"),
    "a step of NaN (it hung)": (
        lambda p: _rewrite_header(p, lambda h: re.sub(r'\["step", \d+\]', '["step", NaN]', h, count=1)),
        "'step' must be a non-negative integer",
    ),
    "a list for the optimizer (TypeError)": (
        lambda p: _rewrite_checkpoint(p, lambda s: s.update(optimizer=[])),
        "'optimizer' must be",
    ),
    "a dangling tensor reference (KeyError)": (
        lambda p: _rewrite_header(p, lambda h: h.replace('"__tensor__": "t0"', '"__tensor__": "t999"')),
        "does not hold",
    ),
    "a dict entry that is not a pair": (
        lambda p: _rewrite_header(p, lambda h: re.sub(r'\["epoch", \d+\]', '["epoch"]', h, count=1)),
        "[key, value] pair",
    ),
    "a header nested 2,000 levels deep (RecursionError)": (
        lambda p: _rewrite_header(p, lambda h: "[" * 2000 + "]" * 2000),
        "nested too deeply",
    ),
}


@pytest.mark.parametrize("case", list(TAMPERED_CHECKPOINTS))
def test_resuming_from_a_tampered_checkpoint_is_a_one_line_error(fitted, capsys, case):
    out, resume = fitted
    tamper, match = TAMPERED_CHECKPOINTS[case]
    tamper(out / "checkpoint.safetensors")
    assert match in _error(capsys, resume)


class _Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_fit_gas_refuses_the_pickle_and_names_the_conversion(tmp_path, capsys):
    (tmp_path / "gas").mkdir()
    (tmp_path / "gas" / "ethylene_CO.pickle").write_bytes(pickle.dumps(_Payload(tmp_path / "unpickled")))
    err = _error(capsys, ["fit", "gas", "--root", str(tmp_path), "--steps", "1", "--out", str(tmp_path / "o")])
    assert "refusing to unpickle" in err and "to_csv('gas/ethylene_CO.csv', index=False)" in err
    assert not (tmp_path / "unpickled").exists()
