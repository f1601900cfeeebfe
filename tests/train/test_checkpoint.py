"""`load_checkpoint` reads a fit checkpoint and refuses, with a ValueError naming the field, anything malformed."""

import json
import re
import warnings

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import flowkit
from flowkit.train import MaximumLikelihood, fit
from flowkit.train.checkpoint import load_checkpoint, load_state, save_state
from flowkit.train.loop import CHECKPOINT_FILE
from flowkit.train.objective import check_state


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    directory = tmp_path_factory.mktemp("run")
    flow = flowkit.flows.RealNVP(2, transforms=1, hidden=(4,))
    fit(flow, MaximumLikelihood(), torch.randn(64, 2), steps=2, batch_size=32, checkpoint_dir=directory, progress=False)
    return directory / CHECKPOINT_FILE


def test_a_written_checkpoint_passes(written):
    saved = load_checkpoint(written)
    assert saved["step"] == 2 and set(saved["flow"]) == set(
        flowkit.flows.RealNVP(2, transforms=1, hidden=(4,)).state_dict()
    )


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda s: s.pop("rng"), "'rng' is missing"),
        (lambda s: s.update(rng=[]), "'rng' must be one"),
        (lambda s: s.update(rng=[{}]), "'rng' must be one"),
        (lambda s: s["rng"][0]["current"].update(torch=torch.zeros(3, dtype=torch.uint8)), "'rng'"),
        (lambda s: s.update(step=1.5), "'step' must be a non-negative integer"),
        (lambda s: s.update(step=-1), "'step' must be a non-negative integer"),
        (lambda s: s.update(epoch=None), "'epoch'"),
        (lambda s: s.update(elapsed="x"), "'elapsed'"),
        (lambda s: s.update(flow={"a": 1}), "'flow'"),
        (lambda s: s.update(optimizer={}), "'optimizer'"),
        (lambda s: s.update(scheduler={}), "'scheduler'"),
        (lambda s: s["history"].update(loss=None), "'history'"),
        (lambda s: s["history"].update(step=["x"]), "'history'"),
        (lambda s: s.update(ema={"decay": 2.0, "updates": 1, "shadow": {}}), "'ema'"),
        (lambda s: s.update(objective=[]), "'objective' must be one objective state dict"),
        (lambda s: s.update(objective=[{1: 2}]), "'objective'"),
        (lambda s: s.update(objective={}), "'objective'"),
    ],
)
def test_a_malformed_field_is_named(written, tmp_path, edit, match):
    state = load_state(written)
    edit(state)
    save_state(state, tmp_path / "c.safetensors")
    with pytest.raises(ValueError, match=match):
        load_checkpoint(tmp_path / "c.safetensors")


def _with_header(written, path, edit):
    with safe_open(str(written), framework="pt") as f:
        metadata, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    metadata["state"] = edit(metadata["state"])
    save_file(tensors, str(path), metadata=metadata)
    return path


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda h: h.replace('"__tensor__": "t0"', '"__tensor__": "t999"'), "does not hold"),
        (lambda h: h.replace('"__tensor__": "t0"', '"__tensor__": 0'), "does not hold"),
        (lambda h: re.sub(r'\["epoch", \d+\]', '["epoch"]', h, count=1), r"\[key, value\] pair"),
        (lambda h: re.sub(r'\["epoch", \d+\]', '[["epoch"], 0]', h, count=1), "a dict key must be"),
        (lambda h: h.replace('{"__tuple__": [0.9, 0.999]}', '{"__tuple__": 5}'), "unknown entry"),
        (lambda h: "[" * 2000 + "]" * 2000, "nested too deeply"),
        (lambda h: "{", "not valid JSON"),
        (lambda h: "[1, 2]", "holds a list, not a dict"),
    ],
)
def test_a_malformed_header_is_a_value_error(written, tmp_path, edit, match):
    path = _with_header(written, tmp_path / "c.safetensors", edit)
    with pytest.raises(ValueError, match=match):
        load_checkpoint(path)


def test_a_schedule_state_that_does_not_fit_is_a_value_error(written, tmp_path):
    state = load_state(written)
    state["scheduler"].pop("lr_lambdas", None)
    save_state(state, tmp_path / CHECKPOINT_FILE)
    flow = flowkit.flows.RealNVP(2, transforms=1, hidden=(4,))
    with pytest.raises(ValueError, match="does not fit"):
        fit(
            flow,
            MaximumLikelihood(),
            torch.randn(64, 2),
            steps=4,
            batch_size=32,
            checkpoint_dir=tmp_path,
            resume=True,
            progress=False,
        )


class _Counted:
    """A duck-typed objective (no Objective subclass) with state: its steps and the sum of its losses."""

    def __init__(self) -> None:
        self.calls, self.total = 0, torch.zeros((), dtype=torch.float64)

    def loss(self, flow, batch):
        loss = MaximumLikelihood().loss(flow, batch)
        self.calls, self.total = self.calls + 1, self.total + loss.detach().double()
        return loss

    def state_dict(self):
        return {"calls": self.calls, "total": self.total}

    def load_state_dict(self, state):
        self.calls, total = check_state(state, ("calls", "total"), "_Counted")
        self.total = total.clone()


def test_the_objectives_state_is_in_the_checkpoint_and_comes_back(tmp_path):
    x = torch.randn(64, 2, generator=torch.Generator().manual_seed(0))

    def run(objective, steps, resume):
        torch.manual_seed(0)
        flow = flowkit.flows.RealNVP(2, transforms=1, hidden=(4,))
        options = dict(batch_size=32, seed=0, schedule=None, progress=False)
        fit(flow, objective, x, steps=steps, checkpoint_dir=tmp_path, resume=resume, **options)
        return objective

    first = run(_Counted(), 3, False)
    with safe_open(str(tmp_path / CHECKPOINT_FILE), framework="pt") as f:
        header = json.loads(f.metadata()["state"])
    entries = dict((k, v) for k, v in header["__dict__"])
    assert entries["objective"][0]["__dict__"][0] == ["calls", 3]  # numbers in the JSON header
    assert set(entries["objective"][0]["__dict__"][1][1]) == {"__tensor__"}  # tensors in the safetensors file
    resumed = run(_Counted(), 5, True)
    straight = _Counted()
    run(straight, 5, False)
    assert first.calls == 3 and resumed.calls == straight.calls == 5
    assert torch.equal(resumed.total, straight.total)


def test_a_checkpoint_without_objective_state_resumes_an_objective_without_state_silently(written, tmp_path):
    saved = load_state(written)
    assert saved["objective"] == [{}]
    del saved["objective"]
    save_state(saved, tmp_path / CHECKPOINT_FILE)
    flow = flowkit.flows.RealNVP(2, transforms=1, hidden=(4,))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        history = fit(flow, MaximumLikelihood(), torch.randn(64, 2), steps=3, batch_size=32, checkpoint_dir=tmp_path,
                      resume=True, progress=False)  # fmt: skip
    assert history.step == [1, 2, 3]
