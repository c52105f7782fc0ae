#!/usr/bin/env bash
# One device call for issue 31 item 1 (large decode batches split their longest sequences), each part
# under its own timeout: the split-decode kernel benchmark (benchmarks/split_decode.py), the GPU tests
# of the split decode against the fp32 reference (s21: 35 s ran only the first 4), then split on
# against off end to end (benchmarks/split_ab.py: T4 with its step timeline, T0-llama3-8b and L1 in
# each mode, then T4 with an 8k step budget with the split on). Results in $OUT/results.tgz; the
# logs' tails printed last.
#   OUT=/tmp/out bash benchmarks/split_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/out}
WORK=/tmp/split_work
mkdir -p "$OUT" "$WORK"
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv > "$WORK/device.txt" 2>&1
step() {  # name timeout command...
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$WORK/$name.log" 2>&1
  echo "== $name: exit $? after $((SECONDS - start)) s (limit $limit)" | tee -a "$WORK/steps.txt"
}
step kernels "${KERNELS_TIMEOUT:-25}" python3 benchmarks/split_decode.py --json "$WORK/split_decode.json"
step gpu_tests "${TESTS_TIMEOUT:-90}" python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_split_large_batch_gpu.py tests/gpu/test_kernels_gpu.py \
  -k "split or attention_backend or compile_once"
step ab "${AB_TIMEOUT:-160}" python3 benchmarks/split_ab.py --out "$WORK/ab" --modes off,on \
  --workloads T0-llama3-8b,L1 --extra-t4-runs t4-b8k
tar czf "$OUT/results.tgz" -C "$WORK" .
cp "$WORK/kernels.log" "$WORK/gpu_tests.log" "$WORK/ab.log" "$WORK/steps.txt" "$OUT/" 2>/dev/null
grep -v '^{' "$WORK/kernels.log" | tail -n 60
tail -n 8 "$WORK/gpu_tests.log"
grep -v '^INFO' "$WORK/ab.log" | grep -A 20 "^split " | tail -n 12
cat "$WORK/steps.txt"
