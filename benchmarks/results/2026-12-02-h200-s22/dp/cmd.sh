#!/bin/bash
# serve -dp 1 vs -dp 2 on the 2-core CPU machine (shared with other helpers: noisy), the tiny
# random Llama of tests/server/conftest.py with the default model's tokenizer.
set -e
PY=/work/main/.venv/bin/python
OUT=$(dirname "$0")
TINY=/tmp/dp-tiny-llama
$PY - <<'PY'
import torch
from transformers import LlamaConfig, LlamaForCausalLM
c = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
torch.manual_seed(0)
LlamaForCausalLM(c).save_pretrained("/tmp/dp-tiny-llama")
PY
TOK=$($PY -c "from pagedlm.config import default_model_path; print(default_model_path())")
RUN=${RUN:-1}
for DP in ${ORDER:-1 2}; do
  $PY -m pagedlm.cli serve $TINY --tokenizer "$TOK" --kv-cache-memory-gib 0.05 -dp $DP \
      --port 18431 > "$OUT/serve_dp${DP}_run$RUN.log" 2>&1 &
  PID=$!
  until curl -sf http://127.0.0.1:18431/health > /dev/null; do sleep 1; done
  $PY -m pagedlm.cli bench serve --base-url http://127.0.0.1:18431 --num-prompts 128 \
      --input-len 64 --output-len 64 --request-rate inf --max-concurrency 64 --ignore-eos \
      --tokenizer "$TOK" --output-json "$OUT/bench_dp${DP}_run$RUN.json" > "$OUT/bench_dp${DP}_run$RUN.log" 2>&1
  curl -s http://127.0.0.1:18431/metrics | grep engine_requests_routed_total >> "$OUT/bench_dp${DP}_run$RUN.log"
  kill -TERM $PID; wait $PID || true
done
