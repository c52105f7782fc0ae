#!/usr/bin/env bash
# GPU (issue 4's serving benchmark): `pagedlm serve` on Qwen3-0.6B's shape with dummy weights
# (bf16, no tokenizer: prompts are token ids), `bench serve` at request rates 10, 50 and inf on
# 1000 random prompts of 512 tokens with 128 output tokens, then `bench throughput` (the
# offline engine) on the prompts of the inf run. One server: each rate draws its own prompts
# (--dataset-seed), so no run finds another's prompts in the prefix cache (the bench reports
# cached input tokens). Logs and JSON in $OUT. NUM_CLIENTS="1 2 4" repeats each rate with that many
# client processes (`bench serve --num-clients`; the inf runs after the first draw seeds 10 + N);
# OFFLINE=0 skips `bench throughput`; SERVER_ENV is put before the server's command (env VAR=...).
#   bash benchmarks/serve_gpu.sh   (env: NUM_PROMPTS, RATES, NUM_CLIENTS, MODEL_SHAPE, PORT, PY)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/serve_gpu}; mkdir -p "$OUT"
PY=${PY:-python3}
MODEL=$($PY benchmarks/gpu_workloads.py --write-model "${MODEL_SHAPE:-qwen3-0.6b}")
ENGINE="--load-format dummy --skip-tokenizer-init ${ENGINE_ARGS:-}"
DATA="--dataset random --num-prompts ${NUM_PROMPTS:-1000} --input-len ${INPUT_LEN:-512} --output-len ${OUTPUT_LEN:-128} --range-ratio 0"
PORT=${PORT:-8321}
env ${SERVER_ENV:-} $PY -m pagedlm.cli serve "$MODEL" --port "$PORT" $ENGINE > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER' EXIT
until curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; do
  kill -0 $SERVER 2>/dev/null || { tail -n 30 "$OUT/server.log"; exit 1; }
  sleep 1
done
VOCAB=$($PY -c "import json; print(json.load(open('$MODEL/config.json'))['vocab_size'])")
seed=0; inf_seed=0
for rate in ${RATES:-10 50 inf}; do
  for clients in ${NUM_CLIENTS:-1}; do
    seed=$((seed + 1))
    if [ "$rate" = inf ]; then seed=$inf_seed; inf_seed=$((10 + clients)); fi
    name=serve_$rate; [ -n "${NUM_CLIENTS:-}" ] && name=serve_${rate}_c$clients
    $PY -m pagedlm.cli bench serve --base-url "http://127.0.0.1:$PORT" $DATA --dataset-seed $seed --request-rate "$rate" \
      --num-clients "$clients" --vocab-size "$VOCAB" \
      --ignore-eos --temperature 1.0 --output-json "$OUT/$name.json" > "$OUT/$name.txt" 2>&1
    echo "== $name (dataset seed $seed)"; tail -n 14 "$OUT/$name.txt"
  done
done
kill -TERM $SERVER; wait $SERVER; echo "server exit status $?"; trap - EXIT
[ "${OFFLINE:-1}" = 0 ] && exit 0
$PY -m pagedlm.cli bench throughput --model "$MODEL" $ENGINE $DATA --dataset-seed 0 --ignore-eos \
  --output-json "$OUT/throughput.json" > "$OUT/throughput.txt" 2>&1
tail -n 6 "$OUT/throughput.txt"
