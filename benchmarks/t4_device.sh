#!/usr/bin/env bash
# One device call for issue 31 items 1 and 3 on the H200, each part under its own timeout:
#   1. benchmarks/skewed_timeline.py: T4 offline with a step log (as defined, longest-first,
#      max_num_batched_tokens 8,192), then serve_gpu.sh's prompts offline (the offline step rate);
#   2. benchmarks/serve_gpu.sh on llama3-8b, 500 x 512 / 128 at rate inf with 1, 2 and 4 client
#      processes, the server's core logging its steps (benchmarks/steplog_site).
# PARTS="t4 serve" (the default) picks the parts. Everything lands in $OUT/results.tgz; the logs'
# tails are printed last.   OUT=/tmp/out bash benchmarks/t4_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/out}; WORK=/tmp/t4_work; mkdir -p "$OUT" "$WORK/serve"
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv > "$WORK/device.txt" 2>&1
step() {  # name timeout command...
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$WORK/$name.log" 2>&1
  echo "== $name: exit $? after $((SECONDS - start)) s (limit $limit)" | tee -a "$WORK/steps.txt"
}
[[ " ${PARTS:-t4 serve} " == *" t4 "* ]] && step t4 "${T4_TIMEOUT:-270}" python3 benchmarks/skewed_timeline.py --out "$WORK/t4"
[[ " ${PARTS:-t4 serve} " == *" serve "* ]] && step serve "${SERVE_TIMEOUT:-210}" env OUT="$WORK/serve" MODEL_SHAPE=llama3-8b NUM_PROMPTS=500 \
  RATES=inf NUM_CLIENTS="1 2 4" OFFLINE=0 \
  SERVER_ENV="PYTHONPATH=$PWD/benchmarks/steplog_site:$PYTHONPATH PAGEDLM_BENCH_STEP_LOG=$WORK/serve/core_steps" \
  bash benchmarks/serve_gpu.sh
tar czf "$OUT/results.tgz" -C "$WORK" .
for part in t4 serve; do
  [ -f "$WORK/$part.log" ] || continue
  cp "$WORK/$part.log" "$OUT/"; echo "---- $part"; grep -v "^INFO" "$WORK/$part.log" | tail -n 60
done
cp "$WORK/steps.txt" "$OUT/"
cat "$WORK/steps.txt"
