#!/usr/bin/env bash
# CPU: `bench serve` against our server at a fixed rate and at inf, next to `bench throughput`
# on the same prompts (random dataset, token ids, ignore_eos), default model. Results in $OUT.
#   bash benchmarks/serve_cpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/serve_cpu}; mkdir -p "$OUT"
DATA="--dataset random --num-prompts ${NUM_PROMPTS:-32} --input-len 128 --output-len 32 --range-ratio 0.5"
PORT=${PORT:-8321}
export OMP_NUM_THREADS=1
.venv/bin/pagedlm serve --port "$PORT" > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER; wait $SERVER' EXIT
until curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; do sleep 2; done
for rate in ${RATES:-1 inf}; do
  .venv/bin/pagedlm bench serve --base-url "http://127.0.0.1:$PORT" $DATA --request-rate "$rate" \
    --ignore-eos --temperature 1.0 --output-json "$OUT/serve_$rate.json" | tee "$OUT/serve_$rate.txt"
done
kill -TERM $SERVER; wait $SERVER || true; trap - EXIT
.venv/bin/pagedlm bench throughput $DATA --ignore-eos --output-json "$OUT/throughput.json" | tee "$OUT/throughput.txt"
