#!/usr/bin/env bash
# One device call for issue 31 item 1 (large decode batches split their longest sequences), each part
# under its own timeout: the split-decode kernel benchmark (benchmarks/split_decode.py), the workloads
# T4, T0-llama3-8b and L1 (benchmarks/gpu_workloads.py), then the GPU tests of the kernels and graphs.
#   OUT=/tmp/out bash benchmarks/split_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv > "$OUT/device.txt" 2>&1
step() {  # name timeout command...
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name: exit $? after $((SECONDS - start)) s (limit $limit)" | tee -a "$OUT/steps.txt"
}
step kernels "${KERNELS_TIMEOUT:-50}" python3 benchmarks/split_decode.py --json "$OUT/split_decode.json"
step workloads "${WORKLOADS_TIMEOUT:-150}" python3 benchmarks/gpu_workloads.py \
  --workloads T4,T0-llama3-8b,L1 --json "$OUT/workloads.json"
step gpu_tests "${TESTS_TIMEOUT:-75}" python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_split_large_batch_gpu.py tests/attention/test_split_large_batch.py \
  tests/attention/test_triton_decode.py tests/gpu/test_kernels_gpu.py tests/gpu/test_cuda_graphs.py
grep -v '^{' "$OUT/kernels.log" | tail -n 90
grep -v '^INFO' "$OUT/workloads.log" | tail -n 12
tail -n 15 "$OUT/gpu_tests.log"
cat "$OUT/steps.txt"
