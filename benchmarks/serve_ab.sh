#!/usr/bin/env bash
# Serving at saturation before and after a change, in one device call (issue 31 item 3): two
# servers side by side on llama3-8b's shape (dummy weights, token-id prompts), the code of the
# checkout BEFORE and of this one, each with a fixed KV cache (KV_GIB: 500 x 640 tokens of
# llama3-8b take 39 GiB, so every request of a run is in at once); `bench serve` (this
# checkout's client) at rate inf on both with NUM_CLIENTS client processes (the new server
# with each count), then RATE10_PROMPTS at rate 10 on the new one; both stopped, then the
# offline engine (`bench throughput`, default memory) on the rate-inf runs' prompts. Each run
# draws its own prompts (--dataset-seed) where one server would see them twice.
#   BEFORE=/path/to/old/checkout OUT=/tmp/out bash benchmarks/serve_ab.sh
# env: MODEL_SHAPE, NUM_PROMPTS, INPUT_LEN, OUTPUT_LEN, KV_GIB, NUM_CLIENTS, RATE10_PROMPTS, PY
set -uo pipefail
cd "$(dirname "$0")/.."
AFTER=$PWD
OUT=${OUT:-/tmp/serve_ab}; mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
MODEL=$($PY benchmarks/gpu_workloads.py --write-model "${MODEL_SHAPE:-llama3-8b}")
VOCAB=$($PY -c "import json; print(json.load(open('$MODEL/config.json'))['vocab_size'])")
ENGINE="--load-format dummy --skip-tokenizer-init ${ENGINE_ARGS:-}"
SIZES="--input-len ${INPUT_LEN:-512} --output-len ${OUTPUT_LEN:-128} --range-ratio 0"
NUM_PROMPTS=${NUM_PROMPTS:-500}

start_server() {  # name checkout port
  (cd "$2" && PYTHONPATH="$2${PYTHONPATH:+:$PYTHONPATH}" exec $PY -m pagedlm.cli serve "$MODEL" \
    --port "$3" $ENGINE --kv-cache-memory-gib "${KV_GIB:-45}" > "$OUT/server_$1.log" 2>&1) &
  eval "PID_$1=$!"
}
wait_healthy() {  # name port
  local pid_var="PID_$1"
  until curl -sf "http://127.0.0.1:$2/health" > /dev/null; do
    kill -0 "${!pid_var}" 2>/dev/null || { echo "server $1 died:"; tail -n 30 "$OUT/server_$1.log"; exit 1; }
    sleep 1
  done
  echo "server $1 healthy after $SECONDS s"
}
bench() {  # name port rate clients seed num_prompts
  $PY -m pagedlm.cli bench serve --base-url "http://127.0.0.1:$2" --dataset random $SIZES \
    --num-prompts "$6" --dataset-seed "$5" --request-rate "$3" --num-clients "$4" \
    --vocab-size "$VOCAB" --ignore-eos --temperature 1.0 --output-json "$OUT/$1.json" \
    > "$OUT/$1.txt" 2>&1
  echo "== $1: exit $? at $SECONDS s"
}

[ -n "${BEFORE:-}" ] && start_server before "$BEFORE" 8401
start_server after "$AFTER" 8402
[ -n "${BEFORE:-}" ] && wait_healthy before 8401
wait_healthy after 8402
CLIENTS=${NUM_CLIENTS:-1 2 4}
[ -n "${BEFORE:-}" ] && bench before_inf_c${CLIENTS##* } 8401 inf "${CLIENTS##* }" 1 "$NUM_PROMPTS"
seed=1
for clients in $CLIENTS; do
  bench after_inf_c$clients 8402 inf "$clients" $seed "$NUM_PROMPTS"; seed=$((seed + 1))
done
bench after_rate10 8402 10 1 $seed "${RATE10_PROMPTS:-150}"
$PY benchmarks/serve_ab_table.py "$OUT"  # also when the offline run is cut short
for name in before after; do
  pid_var="PID_$name"; [ -n "${!pid_var:-}" ] && kill -TERM "${!pid_var}"
done
wait
$PY -m pagedlm.cli bench throughput --model "$MODEL" $ENGINE --dataset random $SIZES \
  --num-prompts "$NUM_PROMPTS" --dataset-seed 1 --ignore-eos --output-json "$OUT/offline.json" \
  > "$OUT/offline.txt" 2>&1
echo "== offline: exit $? at $SECONDS s"
$PY benchmarks/serve_ab_table.py "$OUT"
