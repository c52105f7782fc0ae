#!/usr/bin/env bash
# Session 22, issue 29 (tp): for the lead to run on the one H200 (about 6 min of device time).
#   1. tests/gpu/test_tp_single_gpu.py: mp at tp = 1 gives uni's greedy tokens (CUDA graphs on);
#      tp = 2 with both ranks on the one GPU over gloo (PAGEDLM_TP_ONE_DEVICE=1) gives tp = 1's
#      tokens in float32, rank-0 and batch-sharded sampling. -s prints the per-step times.
#   2. benchmarks/tp_executor_cost.py: decode step time, uni vs mp at tp = 1, batch 1 / 64 / 256
#      (qwen3-0.6b shape, dummy weights, bf16), each backend in its own process.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 300 python3 -m pytest -q -s -m gpu tests/gpu/test_tp_single_gpu.py > "$OUT/tp_single_gpu.log" 2>&1
echo "== tests: exit $?" | tee -a "$OUT/steps.txt"
timeout 420 python3 benchmarks/tp_executor_cost.py --shape qwen3-0.6b --batch-sizes 1,64,256 \
  --json "$OUT/tp_executor_cost.json" > "$OUT/tp_executor_cost.log" 2>&1
echo "== bench: exit $?" | tee -a "$OUT/steps.txt"
