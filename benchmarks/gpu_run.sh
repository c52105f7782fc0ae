#!/usr/bin/env bash
# One planned call on the H200: GPU tests, then the fixed workloads of shared/BENCHMARKS.md
# with transformers' T0 as the peer, then T2 (the longest) last. Logs under $OUT.
#   bash benchmarks/gpu_run.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv | tee "$OUT/device.txt"
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -x -m gpu tests/gpu tests/worker/test_gpu_runner.py \
    tests/sample/test_sample_gpu.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -n 25
fi
timeout "${BENCH_TIMEOUT:-300}" python3 benchmarks/gpu_workloads.py --json "$OUT/bench.json" --peer \
  --workloads "${WORKLOADS:-L2,T0-qwen3-0.6b,T1,L1,T0-llama3-8b,T3-on,T3-off}" 2>&1 | tee "$OUT/bench.log" | tail -n 30
timeout "${T2_TIMEOUT:-200}" python3 benchmarks/gpu_workloads.py --json "$OUT/bench_t2.json" --workloads T2 \
  2>&1 | tee "$OUT/bench_t2.log" | tail -n 6
