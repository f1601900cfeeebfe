"""Alanine dipeptide Boltzmann generator at 1000 K in vacuum, against flowkit's own MD reference.

Protocol (Noé et al. 2019; Midgley et al. 2023 for the coordinates, at CPU scale):

1. Reference data made here: Langevin MD with OpenMM (``flowkit.data.alanine_dipeptide_md``,
   1 fs, friction 1/ps, no constraints, a frame every 0.2 ps), cached under ``--data``: training
   runs (``--train-md``, default 5 ns seed 0 and 20 ns seed 2; the last 10% held out for
   validation) and independent reference runs (``--ref-md``, default 10 ns seed 1). All frames are
   moved rigidly into the flow's anchored frame, where the forces match the flow's output.
2. The flow (``flowkit.flows.internal_coordinate_flow``): internal coordinates
   (Z-matrix, three anchors, normalised around the minimum-energy frame; 60 coordinates of
   which 10 circular dihedrals), blocks of rational-quadratic and circular spline couplings,
   base uniform on the circular coordinates and N(0, 1) on the others.
3. Maximum likelihood on the training frames (cosine learning rate, the weights of the best
   validation NLL restored), then ``BoltzmannGenerator`` (ML on the frames plus ``--w-kl`` times the
   reverse KL to the OpenMM energy, path-gradient estimator). The reverse ESS on ``--probe`` samples
   is printed after each stage; the ML model is saved as ``.ml.model`` so that BG variants start
   from it (``--init ... --ml-steps 0``).
4. Evaluation: ``--samples`` flow samples with float64 weights; mirror images (D-alanine, caught by
   ``same_chirality``) are dropped, so the flow is compared with the L-alanine that MD samples;
   reverse Kish ESS; forward ESS on the reference MD frames, 1 / (E_p[w] E_p[1/w]); the free
   energy along phi (36 bins) from the raw and the reweighted flow samples against the MD
   reference, in kT, on the bins where the MD free energy is below 5 kT (both normalised as
   densities, no fitted shift), with the bootstrap error per bin of the reweighted profile
   (``--bootstrap`` resamples of the flow samples) and the MD reference's own error per bin
   (10 contiguous blocks), so that noise and bias can be told apart; P(phi > 0) with the
   delta-method error of the self-normalised estimate; which internal coordinates carry the heavy
   weights (the weight beyond the MD frames' 99.5% quantile, per coordinate); wall time, process
   CPU time and energy evaluations. Writes JSON and a Ramachandran / F(phi) figure.

Measured (2 cores shared with about seven other jobs, load 4-8, 1 torch thread, ``nice -n 10``; 3 blocks,
hidden 128, 128, 8 bins, 879,720 parameters; training MD 5 ns seed 0 + 20 ns seed 2, 112,500 training and
12,500 validation frames; P(phi > 0) of the MD runs by 10 blocks: 0.113 +- 0.009 (10 ns seed 1, the
reference), 0.103 +- 0.006 (20 ns seed 3), 0.096 +- 0.010 (5 ns seed 0), 0.105 +- 0.004 (20 ns seed 2);
36 bins, all below 5 kT):

* A, ``--ml-steps 3000 --bg-steps 400 --w-kl 0.1 --samples 200000``: validation NLL -176.24 after ML
  (reverse ESS 4.8% on 1e4 probes), -176.16 after BG (7.9% on 1e4); on 2e5 samples reverse ESS 2.6%,
  forward ESS 7e-4, P(phi > 0) 0.101 +- 0.005 reweighted (0.084 raw), F(phi) max error 0.71 kT
  reweighted (32 of 36 bins within 0.5 kT; bootstrap error up to 0.38 kT, MD error up to 0.20 kT);
  wall 23 min (ML 15.6, BG 5.3, evaluation 2.0), process CPU 7.2 min, 112,400 energy evaluations in BG,
  372,400 in all;
* B, from A's ML model, ``--init alanine_A.ml.model --ml-steps 0 --bg-steps 800 --w-kl 0.5
  --samples 500000``: reverse ESS 11.7% on 1e4 probes, 3.3% on 5e5; P(phi > 0) 0.0995 +- 0.0027
  (0.074 raw); F(phi) max error 0.503 kT reweighted (35 of 36 bins within 0.5 kT; bootstrap error up to
  0.27 kT), 0.79 kT raw; BG 10.1 min wall, 214,800 energy evaluations in BG;
* B evaluated again on three fresh sample sets (``--init alanine_B.model --ml-steps 0 --bg-steps 0
  --ref-md 10:1,20:3 --samples 500000 --seed 0|1|2``; 650,000 energy evaluations and 2-5 min wall
  each): reverse ESS 6.3% / 4.9% / 1.0% (the last with one weight of 1.25%), P(phi > 0)
  0.0990 / 0.0970 / 0.0930 +- 0.0025, F(phi) max error 0.40 / 0.46 / 0.35 kT against the 10 ns
  reference and 0.40 / 0.40 / 0.34 kT against the 30 ns one (10 ns seed 1 + 20 ns seed 3,
  P(phi > 0) 0.1065 +- 0.0049, MD error up to 0.09 kT per bin), all 36 bins within 0.5 kT each
  time; bootstrap error up to 0.23-0.31 kT;
* C, B plus ``--bg-steps 600 --w-kl 0.5 --ml-estimator path`` (forward-KL path gradient with the
  forces): reverse ESS 5.2% on 5e5, but the raw flow lost half of the phi > 0 basin (P 0.049 raw,
  0.096 +- 0.003 reweighted) and F(phi) max error 0.75 kT (10 ns reference), 0.65 kT (30 ns).

Reading: the reverse ESS of 1-6% on 5e5 samples leaves a bootstrap error of about 0.25 kT in the 4 kT
bins, so the same model (B) lands between 0.35 and 0.50 kT depending on the sample set (3 of 4 sets
within 0.5 kT of the 10 ns reference, 3 of 3 within 0.5 kT of the 30 ns one): the 0.5 kT target is at
the edge of what this budget resolves. The reweighted P(phi > 0) sits 0.007-0.014 below the 30 ns MD
value, more than its delta-method error: the raw flow holds only 0.074 in that basin and the
self-normalised weights under-correct it. No single internal coordinate carries the heavy
weights (each holds at most 1-5% of the weight beyond the MD frames' 99.5% quantile, against 0.5%
expected); the gain over the previous runs (reverse ESS 0.01-1%) came from more MD frames with a
validation set (the earlier flows overfitted 25,000 frames by 6 nats), not from the coordinates.
More reverse-KL weight raises the ESS but drains the minor phi > 0 basin of the raw flow (C).

Run: ``nice -n 10 python bench/alanine.py`` (defaults: B's protocol in one run: ML 3000 steps, BG 800 steps
with ``--w-kl 0.5``, 5e5 samples);
``--quick`` for a smoke run.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

import flowkit
import flowkit.plot
from flowkit.bijectors.internal import same_chirality
from flowkit.data import alanine_dipeptide_md
from flowkit.flows import internal_coordinate_flow
from flowkit.sampling import ess, importance_sample
from flowkit.stats import free_energy_profile
from flowkit.targets import AlanineDipeptide
from flowkit.targets.alanine import (
    ALANINE_CHIRAL_CENTRES,
    ALANINE_Z_MATRIX,
    alanine_internal_coordinates,
    backbone_dihedrals,
)
from flowkit.train import BoltzmannGenerator, MaximumLikelihood, fit
from flowkit.train.callbacks import Callback

RESULTS = Path(__file__).resolve().parent / "results"
EDGES = np.linspace(-math.pi, math.pi, 37)


class _Report(Callback):
    """Print the step, the loss and the elapsed time every `every` steps (for logs, where tqdm is silent)."""

    def __init__(self, name: str, every: int = 100) -> None:
        self.name, self.every, self.start = name, every, time.time()

    def on_step_end(self, state) -> None:
        if state.step % self.every == 0:
            extra = " ".join(f"{k} {v:.3g}" for k, v in state.last.metrics.items())
            elapsed = time.time() - self.start
            print(f"{self.name} {state.step} loss {state.last.loss:.3f} {extra} {elapsed:.0f} s", flush=True)


def free_energy(phi: np.ndarray, log_w: np.ndarray | None = None) -> np.ndarray:
    """-log of the (weighted) histogram density of phi on `EDGES`, in kT (inf in empty bins)."""
    return free_energy_profile(phi, log_w, bins=len(EDGES) - 1, error=None).free_energy


def bootstrap_error(phi: np.ndarray, log_w: np.ndarray, reps: int, seed: int) -> np.ndarray:
    """Per-bin standard deviation of the reweighted free energy over `reps` bootstrap resamples of the flow samples."""
    return free_energy_profile(phi, log_w, bins=len(EDGES) - 1, resamples=reps, seed=seed).error


def block_error(phi: np.ndarray, blocks: int) -> np.ndarray:
    """Per-bin standard error of the MD free energy from `blocks` contiguous blocks (correlated frames)."""
    return free_energy_profile(phi, bins=len(EDGES) - 1, error="blocks", blocks=blocks).error


def forward_ess(log_w: torch.Tensor) -> float:
    """Forward ESS fraction from target samples: 1 / (E_p[w] E_p[1/w]) with w = exp(log_w)."""
    a = torch.logsumexp(log_w, 0) - math.log(log_w.numel())
    b = torch.logsumexp(-log_w, 0) - math.log(log_w.numel())
    return float(torch.exp(-(a + b)))


def profile_errors(f_flow: np.ndarray, f_md: np.ndarray, cut: float, err: np.ndarray | None = None) -> dict:
    """Errors of a free-energy profile against MD on the bins where MD is below `cut` kT (no fitted shift)."""
    keep = f_md - f_md[np.isfinite(f_md)].min() < cut
    diff = f_flow[keep] - f_md[keep]
    if not np.isfinite(diff).all():
        return {"bins": int(keep.sum()), "max_abs_kT": None, "empty_bins": int((~np.isfinite(diff)).sum())}
    out = {
        "bins": int(keep.sum()),
        "max_abs_kT": float(np.max(np.abs(diff))),
        "bins_within_0.5kT": int((np.abs(diff) <= 0.5).sum()),
        "rms_kT": float(np.sqrt(np.mean(diff**2))),
        "max_abs_after_shift_kT": float(np.max(np.abs(diff - diff.mean()))),
    }
    if err is not None:
        out["max_abs_over_combined_error"] = float(np.max(np.abs(diff) / err[keep]))
    return out


def coordinate_diagnosis(internal, x: torch.Tensor, log_w: torch.Tensor, md: torch.Tensor, top: int = 6) -> list:
    """Which latent coordinates carry the heavy weights.

    For each internal coordinate, the share of the normalised importance weight on flow samples beyond the
    99.5% quantile of the MD frames' distance from their mean (circular distance for circular dihedrals);
    a well-fitted flow puts about 0.5% of the weight there. Returns the `top` largest.
    """
    names = [f"bond {a}" for a, _ in ALANINE_Z_MATRIX] + ["anchor bond 1", "anchor bond 2"]
    names += [f"angle {a}" for a, _ in ALANINE_Z_MATRIX] + ["anchor angle"]
    names += [f"dihedral {a} (row {k})" for k, (a, _) in enumerate(ALANINE_Z_MATRIX)]
    ic = internal.double()
    zs, zm = ic(x.double())[0], ic(md.double())[0]
    w = torch.softmax(log_w, 0)
    rows = []
    for i in range(zs.shape[1]):
        if i in internal.circular_idx:
            mean = torch.atan2(zm[:, i].sin().mean(), zm[:, i].cos().mean())
            ds, dm = ((torch.remainder(z[:, i] - mean + math.pi, 2 * math.pi) - math.pi).abs() for z in (zs, zm))
        else:
            ds, dm = (zs[:, i] - zm[:, i].mean()).abs(), (zm[:, i] - zm[:, i].mean()).abs()
        beyond = ds > torch.quantile(dm, 0.995)
        rows.append(
            {
                "coordinate": names[i],
                "circular": i in internal.circular_idx,
                "weight_beyond_md_q995": float(w[beyond].sum()),
                "flow_fraction_beyond": float(beyond.double().mean()),
            }
        )
    return sorted(rows, key=lambda r: -r["weight_beyond_md_q995"])[:top]


def md_frames(spec: str, temperature: float, root) -> dict[str, torch.Tensor]:
    """MD frames of each run in `spec` ("ns:seed,ns:seed"), by run."""
    runs = {}
    for item in spec.split(","):
        ns, seed = item.split(":")
        runs[item] = alanine_dipeptide_md(temperature, float(ns), seed=int(seed), root=root, progress=True)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--temperature", type=float, default=1000.0)
    parser.add_argument(
        "--train-md", default="5:0,20:2", help="training MD runs, 'ns:seed,...' (seeds other than the reference's)"
    )
    parser.add_argument("--ref-md", default="10:1", help="independent reference MD runs, 'ns:seed,...'")
    parser.add_argument("--val-fraction", type=float, default=0.1, help="last part of the training frames held out")
    parser.add_argument("--ml-steps", type=int, default=3000)
    parser.add_argument("--bg-steps", type=int, default=800)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--bg-lr", type=float, default=1e-4)
    parser.add_argument("--w-kl", type=float, default=0.5, help="weight of the reverse KL in the BG stage")
    parser.add_argument(
        "--ml-estimator", choices=("nll", "path"), default="nll", help="ML term of the BG stage (path: uses forces)"
    )
    parser.add_argument("--ema", type=float, default=None, help="EMA decay of the weights in the ML stage")
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--hidden", default="128,128")
    parser.add_argument("--bins", type=int, default=8)
    parser.add_argument("--init", type=Path, default=None, help="start from a saved .ml.model")
    parser.add_argument("--probe", type=int, default=10_000, help="flow samples for the ESS after the ML stage")
    parser.add_argument("--samples", type=int, default=500_000, help="flow samples for the evaluation")
    parser.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples of the reweighted profile")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data", default=None, help="MD cache directory (default $FLOWKIT_DATA or ./data)")
    parser.add_argument("--out", type=Path, default=RESULTS / "alanine.json")
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny MD, few steps")
    parser.add_argument("--progress", action="store_true", help="progress bars")
    args = parser.parse_args()
    if args.quick:
        args.train_md, args.ref_md, args.ml_steps, args.bg_steps = "0.2:0", "0.2:1", 30, 10
        args.samples, args.probe, args.bootstrap = 2000, 500, 20
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    hidden = tuple(int(h) for h in args.hidden.split(","))
    timings: dict[str, float] = {}
    cpu0 = time.process_time()

    t0 = time.time()
    target = AlanineDipeptide(args.temperature)
    internal = alanine_internal_coordinates(target.minimum())
    frame = internal.domain.to_frame  # frames in the anchored frame, where the forces match the flow's output
    frames = frame(torch.cat(list(md_frames(args.train_md, args.temperature, args.data).values())))
    ref_runs = md_frames(args.ref_md, args.temperature, args.data)
    ref = frame(torch.cat(list(ref_runs.values())))
    n_val = int(args.val_fraction * len(frames))
    train, val = frames[: len(frames) - n_val], frames[len(frames) - n_val :]
    timings["md_s (or cache read)"] = time.time() - t0

    if args.init is not None:
        flow = flowkit.io.load(args.init)
    else:
        flow = internal_coordinate_flow(internal, args.blocks, hidden, args.bins, seed=args.seed)
    n_params = sum(p.numel() for p in flow.parameters())
    results: dict = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}

    def val_nll() -> float:
        with torch.no_grad():
            return float(-torch.cat([flow.log_prob(c.float()) for c in val.split(5000)]).mean())

    def probe(stage: str) -> None:
        flow.eval()
        with torch.no_grad():
            _, lw = importance_sample(flow, target, args.probe, batch_size=5000)
        results[f"after_{stage}"] = {"val_nll": val_nll() if n_val else None, "reverse_ess_probe": ess(lw)}
        print(stage, results[f"after_{stage}"], flush=True)
        flow.train()

    t0 = time.time()
    hist_ml = None
    if args.ml_steps > 0:
        hist_ml = fit(
            flow,
            MaximumLikelihood(),
            train.float(),
            steps=args.ml_steps,
            batch_size=args.batch_size,
            lr=args.lr,
            clip=10.0,
            val_data=val.float() if n_val else None,
            val_every=max(args.ml_steps // 20, 1),
            ema=args.ema,
            progress=args.progress,
            seed=args.seed,
            callbacks=[_Report("ml")],
        )
        probe("ml")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        flowkit.io.save(flow, args.out.with_suffix(".ml.model"))  # for BG variants from the same start (--init)
    timings["ml_s"] = time.time() - t0
    evals_before = target.evaluations
    t0 = time.time()
    hist_bg = None
    if args.bg_steps > 0:
        objective = BoltzmannGenerator(
            target, samples=train.float(), w_ml=1.0, w_kl=args.w_kl, ml_estimator=args.ml_estimator
        )
        hist_bg = fit(
            flow,
            objective,
            steps=args.bg_steps,
            batch_size=args.batch_size,
            lr=args.bg_lr,
            clip=10.0,
            progress=args.progress,
            seed=args.seed + 1,
            callbacks=[_Report("bg", 50)],
        )
        probe("bg")
    timings["bg_s"] = time.time() - t0
    train_evals = target.evaluations - evals_before

    t0 = time.time()
    flow.eval()
    with torch.no_grad():
        x, log_w = importance_sample(flow, target, args.samples, batch_size=5000)
        ok = same_chirality(x, internal.reference, ALANINE_CHIRAL_CENTRES)
        finite = torch.isfinite(log_w)
        keep = ok & finite
        x, log_w = x[keep], log_w[keep]
        phi, psi = backbone_dihedrals(x)
        log_q_ref = torch.cat([flow.log_prob(chunk.float()).double() for chunk in ref.split(5000)])
        log_w_ref = -target.energy(ref) - log_q_ref
        diagnosis = coordinate_diagnosis(internal, x[:50_000], log_w[:50_000], ref[::5])
    timings["eval_s"] = time.time() - t0
    phi_ref, psi_ref = backbone_dihedrals(ref)

    phi_np, lw_np, phi_ref_np = phi.numpy(), log_w.numpy(), phi_ref.numpy()
    f_md = free_energy(phi_ref_np)
    f_raw = free_energy(phi_np)
    f_rew = free_energy(phi_np, lw_np)
    err_flow = bootstrap_error(phi_np, lw_np, args.bootstrap, args.seed)
    err_md = block_error(phi_ref_np, 10)
    err = np.sqrt(err_flow**2 + err_md**2)
    low = f_md - f_md[np.isfinite(f_md)].min() < 5.0
    w = torch.softmax(log_w, 0)
    positive = (phi > 0).double()
    p_rew = float((w * positive).sum())  # delta-method error of the self-normalised estimate below
    timings["process_cpu_s"] = time.process_time() - cpu0
    blocks = np.array_split(phi_ref_np, 10)
    per_run = {}  # the reweighted flow against each reference run alone
    for name, run in ref_runs.items():
        phi_run = backbone_dihedrals(run)[0].numpy()
        f_run, err_run = free_energy(phi_run), block_error(phi_run, 10)
        per_run[name] = {
            "p_phi_positive": float((phi_run > 0).mean()),
            "reweighted": profile_errors(f_rew, f_run, 5.0, np.sqrt(err_flow**2 + err_run**2)),
            "md_block_err_max_kT": float(np.nanmax(err_run[low])),
        }
    results.update(
        {
            "flow": {"parameters": n_params, "latent": 60, "circular": len(internal.circular_idx)},
            "md": {"train_frames": len(train), "validation_frames": n_val, "reference_frames": len(ref)},
            "ml_final_nll": None if hist_ml is None else float(np.mean(hist_ml.loss[-50:])),
            "ml_validation": None if hist_ml is None else {"step": hist_ml.val_step, "nll": hist_ml.val_loss},
            "bg_final_loss": None if hist_bg is None else float(np.mean(hist_bg.loss[-50:])),
            "reference_nll": float(-log_q_ref.mean()),
            "mirror_fraction": float(1 - ok.double().mean()),
            "nonfinite_weights": int((~finite).sum()),
            "reverse_ess": ess(log_w),
            "reverse_ess_samples": len(log_w),
            "forward_ess": forward_ess(log_w_ref),
            "heaviest_weight": float(w.max()),
            "weights_by_coordinate": diagnosis,
            "p_phi_positive": {
                "md": float((phi_ref > 0).double().mean()),
                "md_block_err": float(np.std([(b > 0).mean() for b in blocks], ddof=1) / math.sqrt(10)),
                "train_md": float((backbone_dihedrals(train)[0] > 0).double().mean()),
                "flow_raw": float((phi > 0).double().mean()),
                "flow_reweighted": p_rew,
                "flow_reweighted_err": float(torch.sqrt((w**2 * (positive - p_rew) ** 2).sum())),
            },
            "free_energy_phi": {
                "bins_below_5kT": int(low.sum()),
                "raw": profile_errors(f_raw, f_md, 5.0),
                "reweighted": profile_errors(f_rew, f_md, 5.0, err),
                "md_block_err_max_kT": float(np.nanmax(err_md[low])),
                "flow_bootstrap_err_max_kT": float(np.nanmax(err_flow[low])),
                "edges": EDGES.tolist(),
                "md": f_md.tolist(),
                "md_err": err_md.tolist(),
                "flow_raw": f_raw.tolist(),
                "flow_reweighted": f_rew.tolist(),
                "flow_reweighted_err": err_flow.tolist(),
                "per_reference_run": per_run,
            },
            "energy_evaluations": {"bg_training": train_evals, "total": target.evaluations},
            "time_s": timings,
            "torch_threads": args.threads,
        }
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=float))
    flowkit.io.save(flow, args.out.with_suffix(".model"))
    np.savez(args.out.with_suffix(".samples.npz"), phi=phi_np, psi=psi.numpy(), log_w=lw_np)  # for re-analysis

    fig = flowkit.plot.ramachandran(
        phi, psi, log_w, reference=(phi_ref, psi_ref), titles=("flow (reweighted)", "MD reference")
    )
    fig.savefig(args.out.with_suffix(".ramachandran.png"), dpi=120)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 4), layout="constrained")
    ax = fig.add_subplot()
    centres = 0.5 * (EDGES[1:] + EDGES[:-1])
    base = np.nanmin(np.where(np.isfinite(f_md), f_md, np.nan))
    ax.errorbar(centres, f_md - base, err_md, fmt="k-", label="MD reference")
    ax.plot(centres, f_raw - base, "C0--", label="flow (raw)")
    ax.errorbar(centres, f_rew - base, err_flow, fmt="C1-", label="flow (reweighted)")
    ax.set(xlabel=r"$\phi$", ylabel="free energy / kT", title=f"alanine dipeptide, {args.temperature:g} K, vacuum")
    ax.legend()
    fig.savefig(args.out.with_suffix(".phi.png"), dpi=120)
    keys = ("reverse_ess", "forward_ess", "heaviest_weight", "p_phi_positive", "mirror_fraction", "reference_nll")
    summary = {k: results[k] for k in keys}
    for stage in ("after_ml", "after_bg"):
        summary[stage] = results.get(stage)
    summary["F(phi) reweighted"] = results["free_energy_phi"]["reweighted"]
    summary["F(phi) raw"] = results["free_energy_phi"]["raw"]
    summary["errors"] = {k: results["free_energy_phi"][k] for k in ("md_block_err_max_kT", "flow_bootstrap_err_max_kT")}
    summary["weights_by_coordinate"] = diagnosis[:3]
    summary["time_s"] = timings
    summary["energy_evaluations"] = results["energy_evaluations"]
    print(json.dumps(summary, indent=2, default=float))


if __name__ == "__main__":
    main()
