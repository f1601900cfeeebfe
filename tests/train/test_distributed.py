"""Data-parallel fit under torchrun: 2 CPU processes (gloo) against a single process on the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

from flowkit.train import fit
from flowkit.train.checkpoint import load_state
from flowkit.train.loop import CHECKPOINT_FILE

# Shared by the worker script and the reference run: a float64 RealNVP, 64 points, per-rank batch 8,
# and an objective whose loss is NaN (detached) at step 3 on the last rank only.
COMMON = textwrap.dedent(
    """
    import math, torch, flowkit
    from flowkit.train import MaximumLikelihood, Objective

    class _NaNAtStep3(Objective):
        def __init__(self, nan_here):
            self.nan_here, self.calls = nan_here, 0

        def loss(self, flow, batch):
            self.calls += 1
            if self.calls == 3 and self.nan_here:
                return torch.tensor(math.nan, dtype=torch.float64)
            return MaximumLikelihood.negative_log_likelihood(flow, batch)

        def validation_loss(self, flow, batch):
            return MaximumLikelihood().validation_loss(flow, batch)

    def make_flow(init_seed):
        torch.manual_seed(init_seed)
        return flowkit.flows.RealNVP(2, transforms=2, hidden=(16,)).double()

    def make_data():
        g = torch.Generator().manual_seed(0)
        return torch.randn(64, 2, generator=g, dtype=torch.float64) * 0.5 + 1.0

    OPTIONS = dict(steps=6, lr=1e-2, seed=3, progress=False, val_every=3)
    """
)

WORKER = COMMON + textwrap.dedent(
    """
    import os, sys, json
    from safetensors.torch import save_file
    from flowkit.train import fit

    out = sys.argv[1]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    flow = make_flow(100 + rank)  # different initial weights on each rank: DDP starts them from rank 0's
    x = make_data()
    history = fit(flow, _NaNAtStep3(rank == world - 1), x, batch_size=8, val_data=x[:20],
                  checkpoint_dir=os.path.join(out, f"ckpt{rank}"), **OPTIONS)
    save_file({k: v.contiguous() for k, v in flow.state_dict().items()}, os.path.join(out, f"rank{rank}.safetensors"))
    with open(os.path.join(out, f"history{rank}.json"), "w") as f:
        json.dump(history.to_dict(), f)
    print(f"rank {rank}: first run written", flush=True)

    # ActNorm initialises from each rank's own batch; the loop must make the ranks agree afterwards
    from flowkit.bijectors import ActNorm, AffineCoupling, Chain
    from flowkit.distributions import StandardNormal
    torch.manual_seed(rank)
    flow = flowkit.Flow(Chain(ActNorm(2), AffineCoupling(2, parity=0, hidden=(8,))), StandardNormal(2)).double()
    fit(flow, MaximumLikelihood(), x, steps=2, batch_size=8, progress=False)
    weights = {k: v.contiguous() for k, v in flow.state_dict().items()}
    save_file(weights, os.path.join(out, f"actnorm{rank}.safetensors"))
    print(f"rank {rank}: both runs written", flush=True)

    # Leave the group here and skip the interpreter's teardown: gloo's worker threads can abort a process
    # that finalises while they are still being torn down ("terminate called without an active exception",
    # seen once in CI after both runs), which says nothing about fit. A failure before this line still fails.
    import torch.distributed as dist
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
    """
)


@pytest.mark.slow
def test_two_processes_match_one_process_on_the_global_batch(tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env["OMP_NUM_THREADS"] = "1"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(tmp_path / "worker.py"),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    ranks = [load_file(str(tmp_path / f"rank{r}.safetensors")) for r in range(2)]
    histories = [json.loads((tmp_path / f"history{r}.json").read_text()) for r in range(2)]
    # the ranks saw different halves of each batch yet hold bit-identical weights: gradients were all-reduced
    for key in ranks[0]:
        assert torch.equal(ranks[0][key], ranks[1][key]), key
    actnorm = [load_file(str(tmp_path / f"actnorm{r}.safetensors")) for r in range(2)]
    for key in actnorm[0]:
        assert torch.equal(actnorm[0][key], actnorm[1][key]), key
    for h in histories:
        h.pop("time")  # wall time is each rank's own
    assert histories[0] == histories[1]  # metrics averaged over ranks, the same everywhere
    assert histories[0]["skipped"] == [3]  # one rank's NaN skips the step on both

    # the reference: one process, rank 0's initial weights, batch 16 = the union of the ranks' batches
    namespace: dict = {}
    exec(COMMON, namespace)
    flow = namespace["make_flow"](100)
    x = namespace["make_data"]()
    history = fit(flow, namespace["_NaNAtStep3"](True), x, batch_size=16, val_data=x[:20], **namespace["OPTIONS"])
    assert history.skipped == [3]
    for key, value in flow.state_dict().items():
        torch.testing.assert_close(ranks[0][key], value, rtol=0, atol=1e-10)
    torch.testing.assert_close(
        torch.tensor(histories[0]["loss"]), torch.tensor(history.loss), rtol=0, atol=1e-12, equal_nan=True
    )
    torch.testing.assert_close(
        torch.tensor(histories[0]["val_loss"]), torch.tensor(history.val_loss), rtol=0, atol=1e-12
    )

    # checkpoints and history from rank 0 only, with both ranks' RNG states
    assert not (tmp_path / "ckpt1").exists()
    state = load_state(tmp_path / "ckpt0" / CHECKPOINT_FILE)
    assert len(state["rng"]) == 2 and state["step"] == 6
    assert (tmp_path / "ckpt0" / "history.json").exists() and (tmp_path / "ckpt0" / "model").is_dir()
