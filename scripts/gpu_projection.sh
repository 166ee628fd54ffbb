#!/usr/bin/env bash
# qwen-coder on a lent GPU, in one device call (docs/BENCHMARKS.md, "NVIDIA H100"):
# the qwen-coder decisions recorded on our CPU (specviz/bench/data/decisions/, held-out HumanEval prompts)
# replayed on randomly initialised Qwen2 models of the pair's shapes, eager and compiled (CUDA graphs),
# in float32 and bfloat16. No weights travel: the results are a PROJECTION, and labelled as one.
# First, greedy exactness of every strategy, compiled, at the 1.5B's size (scripts/gpu_exactness.py).
#   device: run(command="OUT=$OUT bash scripts/gpu_projection.sh", timeout_s=600)
#   here, a quick check on the CPU: SIZES=tiny-qwen DEVICE=cpu OUT=out/p bash scripts/gpu_projection.sh
set -euo pipefail
OUT=${OUT:-gpu_out}
SIZES=${SIZES:-qwen-coder}
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
"$PYTHON" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__,
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')" | tee "$OUT/device.txt"
PYTHONPATH=. "$PYTHON" scripts/gpu_exactness.py --sizes "$SIZES" --device "$DEVICE" --dtype float32 \
  2>&1 | tee "$OUT/exactness-float32.txt"
for dtype in float32 bfloat16; do
  for mode in eager compiled; do
    flag=()
    [ "$mode" = compiled ] && flag=(--compile)
    PYTHONPATH=. "$PYTHON" -m specviz.bench --replay specviz/bench/data/decisions/*.json.gz --projection "$SIZES" \
      --device "$DEVICE" --dtype "$dtype" "${flag[@]}" --out "$OUT/projection-$dtype-$mode.json" \
      2>&1 | tee "$OUT/projection-$dtype-$mode.txt"
  done
done
