#!/usr/bin/env bash
# The speed tables of bench/speed.py on CUDA: float32, then bf16 autocast (where a library's
# spline runs under it: a failure is recorded as NaN), then the scaling table, the peak memory at
# batch 8192 and D=784, and flowkit.compile (Inductor) against eager.
#
# Run from the repository root: `bash bench/gpu.sh` (QUICK=1 for a short smoke run). Results go to
# bench/results/gpu_*.json. Without a CUDA device it says so and runs nothing but a check that
# bench/speed.py starts (so the script itself is tested on CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
OUT=${OUT_DIR:-bench/results}
mkdir -p "$OUT"

if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "bench/gpu.sh: no CUDA device (torch.cuda.is_available() is False): skipped the CUDA tables"
    "$PYTHON" bench/speed.py --help > /dev/null
    exit 0
fi
"$PYTHON" -c "import torch; print('CUDA device:', torch.cuda.get_device_name(0), '| torch', torch.__version__)"

if [[ "${QUICK:-0}" == "1" ]]; then
    SMALL=(--features 8 64 --repeats 3 --iters 2)
    SCALING=(--scaling-features 8 128 1024 --scaling-batches 64 1024 8192 --scaling-repeats 3)
    STEPS=(--compile-steps 10000 --features 64 --repeats 3)
else
    SMALL=(--features 8 64 --repeats 15 --iters 5)
    SCALING=(--scaling-repeats 7)
    STEPS=(--compile-steps 10000 --features 8 64)
fi

# The matched and default tables, float32 and bf16 autocast (peak memory from the CUDA allocator).
"$PYTHON" bench/speed.py --device cuda "${SMALL[@]}" --out "$OUT/gpu_speed_fp32.json"
"$PYTHON" bench/speed.py --device cuda --autocast bf16 "${SMALL[@]}" --no-memory --out "$OUT/gpu_speed_bf16.json"
# Scaling against D and batch, peak memory at batch 8192 and D=784 (float32).
"$PYTHON" bench/speed.py --device cuda --only --scaling --memory-784 "${SCALING[@]}" --out "$OUT/gpu_scaling.json"
# The compiled path (Inductor), compile time amortised over a typical run.
"$PYTHON" bench/speed.py --device cuda --only --compile "${STEPS[@]}" --out "$OUT/gpu_compile.json"
# Transformer autoregressive flows (TarFlow) at a larger scale: wider blocks, longer budgets, Fashion-MNIST when its
# idx files are there ($FLOWKIT_FASHION_MNIST or the Debian package's folder).
FASHION=${FLOWKIT_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
ROOT=()
if [[ -d "$FASHION" ]]; then ROOT=(--root "$FASHION"); fi
if [[ "${QUICK:-0}" == "1" ]]; then
    TARFLOW=(--seeds 1 --budget 10 --fashion-budget 10 --classifier-budget 10 --align-steps 50 --latent-steps 100)
else
    TARFLOW=(--seeds 3 --budget 300 --fashion-budget 900 --classifier-budget 300 --align-steps 3000 --latent-steps 5000
             --blocks 8 --glow-hidden 128 --classifier-width 128 --batch-size 256 --cache-batch 256 --test-points 10000)
fi
"$PYTHON" bench/tarflow.py --device cuda "${ROOT[@]}" "${TARFLOW[@]}" --out "$OUT/gpu_tarflow.json"
echo "bench/gpu.sh: wrote $OUT/gpu_speed_fp32.json, gpu_speed_bf16.json, gpu_scaling.json, gpu_compile.json, gpu_tarflow.json"
