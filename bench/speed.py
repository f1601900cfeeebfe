"""Speed of neural spline flows: flowkit against zuko, nflows and normflows at matched architecture.

For each configuration (NSF with coupling or autoregressive layers, D features)
every library builds the same flow: ``layers`` spline layers with ``bins``
bins on ``[-bound, bound]`` and linear tails, conditioners with two hidden
layers of ``hidden`` ReLU units (a plain MLP for coupling on the D/2
conditioning features, a masked MLP for autoregressive layers), permutations
between layers, a standard normal base. Three operations are timed:

* ``train``: log_prob of a batch, mean, backward, one Adam step;
* ``log_prob``: log_prob of a batch without gradients;
* ``sample``: drawing a batch without gradients.

Libraries are interleaved within each repeat (so drifts in machine speed hit
them alike) and the median over repeats is reported, with the ratio
``peer time / flowkit time`` (above 1: flowkit is faster). The peak memory of
the training step is measured in a fresh subprocess per (configuration,
library): the growth of the process's resident-set high-water mark
(``ru_maxrss``) over its size just before the first step, after building the
model and the batch. That counts every allocation torch makes on the CPU
(activations saved for backward, gradients, Adam state), but also the code
pages of the kernels a library touches for the first time. A second column,
``saved MiB``, counts only the bytes of the distinct tensor storages autograd
saves for backward during one training step (through
``torch.autograd.graph.saved_tensors_hooks``): the activation memory, which
is what grows with batch size and depth.

The pseudo-library ``flowkit-compiled`` (``--libraries flowkit flowkit-compiled zuko ...``) times
``flowkit.compile(flow)`` (Inductor) of the same flow for ``train`` and ``log_prob`` (compiled in the
warm-up; its ``sample`` is the eager one), with its own ratio column; like ``flowkit-reference`` it is not a
peer. ``flowkit-pytorch`` times flowkit with its native spline kernel off
(``flowkit.kernels.use_spline_kernel("pytorch")``: the fused spline node's PyTorch kernel instead of the C++ one),
interleaved with the rest.

Two tables: ``matched`` (every library builds the architecture above) and
``default`` (each library's own NSF as a user builds it, with the same number
of layers, bins and hidden widths: ``zuko.flows.NSF`` (``passes=2`` for
coupling), nflows' spline transforms with their default ``ResidualNet`` /
residual MADE blocks and reversed permutations, normflows'
``CoupledRationalQuadraticSpline`` / ``AutoregressiveRationalQuadraticSpline``
with ``LULinearPermute`` between layers; flowkit's ``NSF`` as in the matched
table, since that is its default).

Behind flags (each off in a default run, which stays short):

* ``--scaling``: flowkit's train-step time against D (``--scaling-features``,
  8 to 1024, batch 512) and against the batch (``--scaling-batches``, 64 to
  8192, D=64), coupling and autoregressive, with the exponent of a least-squares
  fit of ``log t`` on ``log D`` (or ``log batch``);
* ``--memory-784``: the peak memory of one training step at batch 8192, D=784,
  for every library (fresh subprocesses, as above);
* ``--fit-overhead``: ``flowkit.train.fit`` (validation and progress off, no
  schedule) against a bare PyTorch loop (the same flow, Adam, batches drawn
  from the same permutations) on a small flow, interleaved;
* ``--compile``: a training step and ``log_prob`` through
  ``flowkit.compile(flow)`` (Inductor) against eager, with the compile time,
  and the per-step time with that compile time amortised over
  ``--compile-steps`` steps (a typical run).

Timings on a shared machine: the ratios come from interleaved runs in one
process, which drifts in machine speed hit alike; the absolute times are only
comparable within one run. On a loaded machine use ``--clock cpu --threads 1``:
the process's CPU time instead of wall time, so the time other processes held
the cores is not counted (cache and memory-bandwidth contention still is).

Every table is run at each thread count of ``--threads`` (1 and 2 by default: torch's intra-op threads), one
after the other, and says which; the CPU's model name and the load average at the start head the output and
the JSON (``cpu``, ``load_average``; each configuration carries its ``threads``), so each figure says where it
was taken.

Run: ``python bench/speed.py`` (default workload D=8 and D=64, 5 layers,
K=8, B=3, 2x128, batch 512, 1 and 2 threads; both tables). Results go to
``bench/results/speed.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import peers
import torch

LIBRARIES = ["flowkit", *peers.LIBRARIES]
#: flowkit and its pseudo-libraries (not peers): the reference spline, the PyTorch spline kernel, compiled.
FLOWKIT_VARIANTS = ("flowkit", "flowkit-reference", "flowkit-pytorch", "flowkit-compiled")

#: The clock of every timing: wall time, or with ``--clock cpu`` this process's CPU time (with one thread,
#: the time the computation itself took, not the time other processes held the cores: on a loaded machine).
CLOCK = time.perf_counter


def cpu_name() -> str:
    """The CPU's model name: the first ``model name`` of /proc/cpuinfo, else ``platform.processor()``."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def build(library: str, kind: str, features: int, layers: int, bins: int, bound: float, hidden: int):
    """Return ``(module, log_prob(x), sample(n))`` for one library's NSF (the peers' from ``peers.nsf``)."""
    coupling = kind == "coupling"
    if library in FLOWKIT_VARIANTS:
        import flowkit

        flow = flowkit.flows.NSF(
            features, transforms=layers, bins=bins, hidden=(hidden, hidden), coupling=coupling, bound=bound
        )

        def sample(n):
            return flow.sample((n,))

        if library == "flowkit-reference":
            return flow, _unfused(flow.log_prob), _unfused(sample)
        if library == "flowkit-pytorch":
            return flow, _without_native(flow.log_prob), _without_native(sample)
        if library == "flowkit-compiled":
            # `flowkit.compile` (Inductor) of the same flow: its density and backward pass run compiled, compiled
            # in the warm-up (not timed). Sampling stays eager: compiling the D-step autoregressive inverse takes
            # minutes.
            return flow, flowkit.compile(flow).log_prob, sample
        return flow, flow.log_prob, sample
    model = peers.nsf(
        library, features, transforms=layers, bins=bins, hidden=(hidden, hidden), bound=bound, coupling=coupling
    )
    return (model, *peers.interface(library, model))


def _on_kernel(kernel: str, function):
    """``function`` with flowkit's splines on ``kernel`` while it runs (``flowkit.kernels.use_spline_kernel``)."""
    from flowkit.kernels import use_spline_kernel

    def call(*args):
        with use_spline_kernel(kernel):
            return function(*args)

    return call


def _unfused(function):
    """``function`` with flowkit's splines on their reference kernel (knot table, autograd chain rule).

    The pseudo-library ``flowkit-reference`` (``--libraries flowkit flowkit-reference ...``) times flowkit
    before its fused spline node, interleaved with everything else; it is not counted as a peer.
    """
    return _on_kernel("reference", function)


def _without_native(function):
    """``function`` with flowkit's native spline kernel off (the fused node's PyTorch kernel runs)."""
    return _on_kernel("pytorch", function)


def build_default(library: str, kind: str, features: int, layers: int, bins: int, bound: float, hidden: int):
    """Return ``(module, log_prob(x), sample(n))`` for one library's own NSF, as its documentation builds it."""
    coupling = kind == "coupling"
    if library in FLOWKIT_VARIANTS:
        return build(library, kind, features, layers, bins, bound, hidden)
    if library == "zuko":
        import zuko

        model = zuko.flows.NSF(
            features, transforms=layers, bins=bins, hidden_features=(hidden, hidden), passes=2 if coupling else None
        )
    elif library == "nflows":
        from nflows.distributions import StandardNormal
        from nflows.flows import Flow
        from nflows.nn.nets import ResidualNet
        from nflows.transforms import (
            CompositeTransform,
            MaskedPiecewiseRationalQuadraticAutoregressiveTransform,
            PiecewiseRationalQuadraticCouplingTransform,
            ReversePermutation,
        )
        from nflows.utils import create_alternating_binary_mask

        chain = []
        for i in range(layers):
            if i:
                chain.append(ReversePermutation(features))
            if coupling:
                chain.append(
                    PiecewiseRationalQuadraticCouplingTransform(
                        mask=create_alternating_binary_mask(features, even=i % 2 == 0),
                        transform_net_create_fn=lambda a, b: ResidualNet(a, b, hidden_features=hidden, num_blocks=2),
                        num_bins=bins,
                        tails="linear",
                        tail_bound=bound,
                    )
                )
            else:
                chain.append(
                    MaskedPiecewiseRationalQuadraticAutoregressiveTransform(
                        features, hidden, num_bins=bins, tails="linear", tail_bound=bound, num_blocks=2
                    )
                )
        model = Flow(CompositeTransform(chain), StandardNormal([features]))
    else:
        import normflows as nf

        flows = []
        for i in range(layers):
            if coupling:
                flows.append(
                    nf.flows.CoupledRationalQuadraticSpline(
                        features, 2, hidden, num_bins=bins, tail_bound=bound, reverse_mask=i % 2 == 1
                    )
                )
            else:
                flows.append(
                    nf.flows.AutoregressiveRationalQuadraticSpline(features, 2, hidden, num_bins=bins, tail_bound=bound)
                )
            flows.append(nf.flows.LULinearPermute(features))
        model = nf.NormalizingFlow(nf.distributions.DiagGaussian(features, trainable=False), flows)
    return (model, *peers.interface(library, model))


def operations(library, kind, features, args, style: str = "matched"):
    torch.manual_seed(0)
    builder = build if style == "matched" else build_default
    module, log_prob, sample = builder(library, kind, features, args.layers, args.bins, args.bound, args.hidden)
    device = getattr(args, "device", "cpu")
    module.to(device)
    x = torch.randn(args.batch, features, device=device)
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-4)
    # bf16 autocast (on CUDA) around the density and sampling passes; the optimiser step stays float32.
    bf16 = getattr(args, "autocast", None) == "bf16"
    cast = (lambda: torch.autocast(device_type="cuda", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def train():
        optimizer.zero_grad()
        with cast():
            loss = -log_prob(x).float().mean()
        loss.backward()
        optimizer.step()
        sync()

    def log_prob_no_grad():
        with torch.no_grad(), cast():
            log_prob(x)
        sync()

    def draw():
        with torch.no_grad(), cast():
            sample(args.batch)
        sync()

    return {"train": train, "log_prob": log_prob_no_grad, "sample": draw}


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def peak_memory_child(library: str, kind: str, features: int, args) -> None:
    """Print the resident-set growth (MiB) over a few training steps, in this (fresh) process."""
    torch.set_num_threads(args.threads)
    ops = operations(library, kind, features, args)
    if args.device.startswith("cuda"):  # the allocator's high-water mark over the step
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        for _ in range(5):
            ops["train"]()
        print(json.dumps({"peak_mib": (torch.cuda.max_memory_allocated() - before) / 2**20}))
        return
    before = _rss_kib()
    for _ in range(5):
        ops["train"]()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_mib": (peak - before) / 1024}))


def saved_for_backward_mib(library: str, kind: str, features: int, args) -> float:
    """MiB of distinct tensor storages saved for backward during one training step."""
    ops = operations(library, kind, features, args)
    storages: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        ops["train"]()
    return sum(storages.values()) / 2**20


def peak_memory(library, kind, features, args) -> float:
    command = [sys.executable, __file__, "--child", library, kind, str(features)] + _forward_args(args)
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_mib"]


def _forward_args(args) -> list[str]:
    return [
        f"--layers={args.layers}",
        f"--bins={args.bins}",
        f"--bound={args.bound}",
        f"--hidden={args.hidden}",
        f"--batch={args.batch}",
        f"--threads={args.threads}",
        f"--device={args.device}",
        f"--spline-path={args.spline_path}",
        *([f"--autocast={args.autocast}"] if args.autocast else []),
    ]


def time_config(kind: str, features: int, args, style: str = "matched") -> dict:
    libraries = args.libraries
    ops = {lib: operations(lib, kind, features, args, style) for lib in libraries}
    results: dict = {}
    for op in ("train", "log_prob", "sample"):
        if op == "sample" and kind == "autoregressive" and features > 8:
            iters = 1
        else:
            iters = args.iters
        slowest = 0.0
        running = []
        for lib in libraries:  # warm-up, and the time of one call
            try:
                for _ in range(2):
                    start = CLOCK()
                    ops[lib][op]()
                    slowest = max(slowest, CLOCK() - start)
                running.append(lib)
            except (RuntimeError, NotImplementedError, ValueError) as error:  # bf16 where a library cannot
                print(f"  {lib} {op} failed, recorded as NaN: {type(error).__name__}: {str(error).splitlines()[0]}")
        # Seconds-long calls (autoregressive sampling at large D) get fewer repeats.
        repeats = args.repeats if slowest < 1.0 else min(args.repeats, 3)
        times: dict[str, list[float]] = {lib: [] if lib in running else [float("nan")] for lib in libraries}
        for r in range(repeats):
            order = running[r % len(running) :] + running[: r % len(running)] if running else []
            for lib in order:
                start = CLOCK()
                for _ in range(iters):
                    ops[lib][op]()
                times[lib].append((CLOCK() - start) / iters)
        results[op] = {lib: statistics.median(t) * 1e3 for lib, t in times.items()}
    return results


def _interleaved_ms(functions: dict, repeats: int) -> dict:
    """Milliseconds of each call of each function, interleaved over repeats (after two warm-up calls each).

    Repeat `r` starts with the function `r` places along, so that no function always runs first.
    """
    for function in functions.values():
        function()
        function()
    times: dict = {key: [] for key in functions}
    keys = list(functions)
    for r in range(repeats):
        for key in keys[r % len(keys) :] + keys[: r % len(keys)]:
            start = CLOCK()
            functions[key]()
            times[key].append((CLOCK() - start) * 1e3)
    return times


def _median_ms(functions: dict, repeats: int) -> dict:
    """Median milliseconds per call of each function, interleaved over repeats (after two warm-up calls each)."""
    return {key: statistics.median(t) for key, t in _interleaved_ms(functions, repeats).items()}


def fitted_exponent(sizes: list[int], ms: list[float]) -> float:
    """The slope of the least-squares line of `log ms` on `log size`."""
    import math

    xs, ys = [math.log(v) for v in sizes], [math.log(v) for v in ms]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def scaling(args) -> dict:
    """Flowkit's train-step time against D (batch ``args.batch``) and against the batch (D=64), with exponents."""
    report: dict = {}
    for kind in args.kinds:
        for axis, sizes in (("features", args.scaling_features), ("batch", args.scaling_batches)):
            steps = {}
            for size in sizes:
                features, batch = (size, args.batch) if axis == "features" else (64, size)
                steps[size] = operations(
                    "flowkit", kind, features, argparse.Namespace(**{**vars(args), "batch": batch})
                )["train"]
            ms = _median_ms(steps, args.scaling_repeats)
            exponent = fitted_exponent(list(ms), list(ms.values()))
            report[f"{kind} vs {axis}"] = {"ms": ms, "exponent": exponent}
            print(
                f"scaling {kind:<15} train ms vs {axis:<9}"
                + "".join(f"{size:>7}:{t:<9.1f}" for size, t in ms.items())
                + f" exponent {exponent:.2f}"
            )
            sys.stdout.flush()
    return report


def memory_784(args) -> dict:
    """Peak memory (MiB, resident-set growth) of a training step at batch 8192, D=784, per library and kind."""
    big = argparse.Namespace(**{**vars(args), "batch": 8192})
    report = {}
    for kind in args.kinds:
        report[kind] = {lib: peak_memory(lib, kind, 784, big) for lib in args.libraries}
        print(
            f"peak MiB, batch 8192, D=784, {kind:<15}"
            + "".join(f"{lib:>10}:{m:<9.0f}" for lib, m in report[kind].items())
        )
        sys.stdout.flush()
    return report


def fit_overhead(args) -> dict:
    """Seconds of ``flowkit.train.fit`` against a bare PyTorch loop doing the same steps, on a small flow."""
    import flowkit
    from flowkit.train import MaximumLikelihood, fit

    features, batch, steps = 2, 256, args.fit_steps
    data = torch.randn(8 * batch, features)

    def small_flow():
        torch.manual_seed(0)
        return flowkit.flows.NSF(features, transforms=2, bins=8, hidden=(32, 32), coupling=False, bound=3.0)

    def run_fit():
        flow = small_flow()
        fit(
            flow,
            MaximumLikelihood(),
            data,
            steps=steps,
            batch_size=batch,
            schedule=None,
            progress=False,
            seed=0,
            threads=args.threads,
        )

    def run_bare(foreach=None):
        flow = small_flow()
        optimizer = torch.optim.Adam(flow.parameters(), lr=1e-3, foreach=foreach)
        generator = torch.Generator().manual_seed(0)
        done = 0
        while done < steps:
            order = torch.randperm(len(data), generator=generator)
            for start in range(0, len(data) - batch + 1, batch):
                optimizer.zero_grad()
                loss = -flow.log_prob(data[order[start : start + batch]]).mean()
                loss.backward()
                optimizer.step()
                done += 1
                if done == steps:
                    break

    loops = {"fit": run_fit, "bare": run_bare, "bare-foreach": partial(run_bare, foreach=True)}
    times = _interleaved_ms(loops, args.fit_repeats)
    ms = {key: statistics.median(t) for key, t in times.items()}
    print(
        "fit overhead: ms/step "
        + ", ".join(f"{key} {value / steps:.3f}" for key, value in ms.items())
        + " (bare-foreach: the bare loop with the multi-tensor Adam fit builds)"
    )
    report = {"ms_per_step": {k: v / steps for k, v in ms.items()}, "steps": steps}
    for bare, what in (("bare", "against a plain loop as a user writes it"), ("bare-foreach", "at equal optimiser")):
        # Each repeat runs all loops back to back: its ratio is paired, so drift between repeats cancels.
        paired = sorted(f / b - 1 for f, b in zip(times["fit"], times[bare], strict=True))
        quartiles = statistics.quantiles(paired, n=4) if len(paired) > 1 else paired * 3
        overhead = statistics.median(paired)
        print(
            f"  fit over {bare}: {100 * overhead:+.1f}% {what} (paired median over {len(paired)} repeats; "
            f"quartiles {100 * quartiles[0]:+.1f}% to {100 * quartiles[2]:+.1f}%; target <= 5%)"
        )
        report[f"overhead_over_{bare}"] = overhead
        report[f"overhead_over_{bare}_quartiles"] = [quartiles[0], quartiles[2]]
    return report


def compiled(args) -> dict:
    """``flowkit.compile`` (Inductor) against eager: compile seconds, ms per call, and ms with compile amortised."""
    import flowkit

    report = {}
    for kind in args.kinds:
        for features in args.features:
            torch.manual_seed(0)
            flow = flowkit.flows.NSF(
                features,
                transforms=args.layers,
                bins=args.bins,
                hidden=(args.hidden, args.hidden),
                coupling=kind == "coupling",
                bound=args.bound,
            )
            flow.to(args.device)
            fast = flowkit.compile(flow, backend=args.compile_backend)
            x = torch.randn(args.batch, features, device=args.device)
            sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
            optimizer = torch.optim.Adam(flow.parameters(), lr=1e-4)

            def train(model, x=x, optimizer=optimizer, sync=sync):
                def step():
                    optimizer.zero_grad()
                    (-model.log_prob(x).mean()).backward()
                    optimizer.step()
                    sync()

                return step

            def log_prob(model, x=x, sync=sync):
                def call():
                    with torch.no_grad():
                        model.log_prob(x)
                    sync()

                return call

            entry = {}
            for op, make in (("train", train), ("log_prob", log_prob)):
                start = time.perf_counter()  # wall time: Inductor compiles in worker processes
                make(fast)()  # the first call compiles
                compile_s = time.perf_counter() - start
                ms = _median_ms({"eager": make(flow), "compiled": make(fast)}, args.repeats)
                amortised = (compile_s * 1e3 + args.compile_steps * ms["compiled"]) / args.compile_steps
                entry[op] = {"compile_s": compile_s, **ms, "amortised": amortised}
                print(
                    f"compile {kind[:4]} D={features:<5} {op:<9} compile {compile_s:6.1f} s, "
                    f"eager {ms['eager']:.2f} ms, "
                    f"compiled {ms['compiled']:.2f} ms ({ms['eager'] / ms['compiled']:.2f}x), "
                    f"amortised over {args.compile_steps} steps {amortised:.2f} ms ({ms['eager'] / amortised:.2f}x)"
                )
                sys.stdout.flush()
            report[f"{kind} D={features}"] = entry
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--features", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--kinds", nargs="+", default=["coupling", "autoregressive"])
    parser.add_argument("--libraries", nargs="+", default=LIBRARIES)
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--bins", type=int, default=8)
    parser.add_argument("--bound", type=float, default=3.0)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch thread counts, one run each")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (see bench/gpu.sh)")
    parser.add_argument(
        "--clock", choices=["wall", "cpu"], default="wall", help="cpu: process CPU time (loaded machine, --threads 1)"
    )
    parser.add_argument("--autocast", choices=["bf16"], default=None, help="bf16 autocast on CUDA")
    parser.add_argument(
        "--styles", nargs="+", default=["matched", "default"], help="matched architecture, and each library's own"
    )
    parser.add_argument("--scaling", action="store_true", help="train-step time against D and batch (flowkit)")
    parser.add_argument("--scaling-features", type=int, nargs="+", default=[8, 32, 128, 512, 1024])
    parser.add_argument("--scaling-batches", type=int, nargs="+", default=[64, 512, 2048, 8192])
    parser.add_argument("--scaling-repeats", type=int, default=5)
    parser.add_argument("--memory-784", action="store_true", help="peak memory at batch 8192, D=784")
    parser.add_argument("--fit-overhead", action="store_true", help="fit against a bare PyTorch loop")
    parser.add_argument("--fit-steps", type=int, default=200)
    parser.add_argument("--fit-repeats", type=int, default=9)
    parser.add_argument("--compile", action="store_true", help="flowkit.compile (Inductor) against eager")
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--compile-steps", type=int, default=10_000, help="steps to amortise the compile time over")
    parser.add_argument("--only", action="store_true", help="run only the flagged extras, not the speed tables")
    parser.add_argument(
        "--spline-path",
        choices=["fused", "reference"],
        default="fused",
        help="flowkit's spline: the fused node, or the reference path (knot table, autograd chain rule)",
    )
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "speed.json"))
    args = parser.parse_args(argv)
    if args.spline_path == "reference":
        from flowkit.kernels import use_spline_kernel

        use_spline_kernel("reference").__enter__()  # for the whole run: left at exit
    if args.child:
        args.threads = args.threads[0]
        peak_memory_child(args.child[0], args.child[1], int(args.child[2]), args)
        return
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter

    report = {
        "settings": {k: v for k, v in vars(args).items() if k not in ("child", "out")},
        "torch": torch.__version__,
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "load_average": list(os.getloadavg()),
        "configs": [],
    }
    print(
        f"CPU: {report['cpu']} ({os.cpu_count()} logical CPUs); torch {torch.__version__}; "
        f"load average at start {', '.join(f'{v:.2f}' for v in report['load_average'])}"
    )
    for threads in args.threads:
        # One run per thread count; everything below sees that count as `args.threads`.
        run_args = argparse.Namespace(**{**vars(args), "threads": threads})
        torch.set_num_threads(threads)
        _run(run_args, report)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


def _run(args, report: dict) -> None:
    """The tables and the flagged extras at `args.threads` threads, added to `report`."""
    threads = args.threads
    columns = "".join(f"{lib:>{max(12, len(lib) + 2)}}" for lib in args.libraries)
    compiled_column = "flowkit-compiled" in args.libraries
    header = f"{'config':<20}{'op':<10}" + columns + f"{'best peer/fk':>14}"
    header += f"{'peer/compiled':>15}" if compiled_column else ""
    styles = [] if args.only else args.styles
    for style in styles:
        print(
            f"{style} construction, {threads} thread{'s' if threads > 1 else ''}: times in ms "
            f"(median of {args.repeats} repeats), ratio = fastest peer / flowkit"
        )
        print(header)
        for features in args.features:
            for kind in args.kinds:
                res = time_config(kind, features, args, style)
                memory, saved = {}, {}
                if style == "matched":
                    if not args.no_memory:
                        memory = {lib: peak_memory(lib, kind, features, args) for lib in args.libraries}
                    saved = {lib: saved_for_backward_mib(lib, kind, features, args) for lib in args.libraries}
                entry = {
                    "style": style,
                    "threads": threads,
                    "kind": kind,
                    "features": features,
                    "ms": res,
                    "peak_train_mib": memory,
                    "saved_for_backward_mib": saved,
                    "ratio": {},
                }
                rows = (
                    list(res.items())
                    + ([("mem MiB", memory)] if memory else [])
                    + ([("saved MiB", saved)] if saved else [])
                )
                for op, row in rows:
                    peers = {lib: t for lib, t in row.items() if not lib.startswith("flowkit")}
                    best = min(peers.values()) if peers else float("nan")
                    ratio = best / row["flowkit"] if "flowkit" in row else float("nan")
                    if op not in ("mem MiB", "saved MiB"):
                        entry["ratio"][op] = {lib: t / row["flowkit"] for lib, t in peers.items()}
                    name = f"{kind[:4]} D={features}"
                    line = (
                        f"{name:<20}{op:<10}"
                        + "".join(f"{row[lib]:>{max(12, len(lib) + 2)}.2f}" for lib in args.libraries)
                        + f"{ratio:>14.2f}"
                    )
                    if compiled_column:
                        line += f"{best / row['flowkit-compiled']:>15.2f}"
                    print(line)
                report["configs"].append(entry)
                sys.stdout.flush()
    # The extras, keyed by thread count.
    for flag, key, function in (
        (args.scaling, "scaling", scaling),
        (args.memory_784, "memory_784", memory_784),
        (args.fit_overhead, "fit_overhead", fit_overhead),
        (args.compile, "compile", compiled),
    ):
        if flag:
            print(f"{key}, {threads} thread{'s' if threads > 1 else ''}:")
            report.setdefault(key, {})[str(threads)] = function(args)


if __name__ == "__main__":
    main()
