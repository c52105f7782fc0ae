#!/usr/bin/env bash
# CPU: `bench serve` against our server at a fixed rate and at inf, next to `bench throughput`
# on the same prompts (random dataset, token ids, ignore_eos), default model. Results in $OUT.
#   bash benchmarks/serve_cpu.sh
# Each rate gets a fresh server, as the offline run gets a fresh engine: the runs send the same
# prompts, and a server that has served them once takes them from its prefix cache (no prefill).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/serve_cpu}; mkdir -p "$OUT"
DATA="--dataset random --num-prompts ${NUM_PROMPTS:-32} --input-len 128 --output-len 32 --range-ratio 0.5"
PORT=${PORT:-8321}
export OMP_NUM_THREADS=1
for rate in ${RATES:-1 inf}; do
  .venv/bin/pagedlm serve --port "$PORT" > "$OUT/server_$rate.log" 2>&1 &
  SERVER=$!
  trap 'kill -TERM $SERVER; wait $SERVER' EXIT
  until curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; do kill -0 $SERVER; sleep 2; done
  .venv/bin/pagedlm bench serve --base-url "http://127.0.0.1:$PORT" $DATA --request-rate "$rate" \
    --ignore-eos --temperature 1.0 --output-json "$OUT/serve_$rate.json" | tee "$OUT/serve_$rate.txt"
  kill -TERM $SERVER; wait $SERVER || true; trap - EXIT
done
.venv/bin/pagedlm bench throughput $DATA --ignore-eos --output-json "$OUT/throughput.json" | tee "$OUT/throughput.txt"
