#!/usr/bin/env bash
# Planned calls on the H200: the steps named in STEPS, in order, each under its own timeout,
# logs under $OUT.   STEPS="tests sweep workloads" bash benchmarks/gpu_run.sh
#   tests      pytest -m gpu (kernels vs fp32 reference, graphs == eager, zero syncs)
#   sweep      benchmarks/attention_kernels.py --sweep (prefill tile settings vs SDPA)
#   workloads  benchmarks/gpu_workloads.py on $WORKLOADS (transformers' T0 as the peer if PEER=1)
#   t2         workload T2 alone (the longest)
#   s1         workload S1 (Mistral-7B shape, window 4,096) with the window's blocks freed, then kept
#              (PAGEDLM_FREE_SLIDING_WINDOW=0): the A/B of sliding-window freeing
#   sampler    benchmarks/sampler_overhead.py on qwen3-0.6b at T0's shape (greedy / random / full)
#   serve      benchmarks/serve_gpu.sh (bench serve at rates 10, 50, inf + bench throughput)
#   host       benchmarks/host_step.py on the GPU (step time vs one decode graph replay)
#   sampler1   the sampler alone on [256, 151936] logits (greedy / random / full)
#   gemv       benchmarks/gemv_bench.py (small-batch GEMV against cuBLAS)
#   profile    benchmarks/profile_kernels.py: qwen3-0.6b batch-1 decode (graphs), llama3-8b T0 prefill
#   profile256 the same for batch-256 decode steps with graphs: qwen3-0.6b at T1's temperature, llama3-8b
#   defaults   the engine defaults swept: max_num_batched_tokens 8k/16k/32k, max_num_seqs 256/512/1024
#              on $DEFAULT_WORKLOADS (T1,T0-qwen3-0.6b), then 8k/16k/32k on T0-llama3-8b
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv > "$OUT/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/device.txt"

step() {  # name timeout command...
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name: exit $? after $((SECONDS - start)) s (limit $limit)" | tee -a "$OUT/steps.txt"
}

for s in ${STEPS:-tests sweep workloads}; do
  case $s in
    tests) step tests "${TEST_TIMEOUT:-170}" python3 -m pytest -q -m gpu tests/gpu tests/attention \
             tests/ops tests/sample tests/worker/test_gpu_runner.py tests/worker/test_kernel_warmup.py \
             tests/worker/test_host_offload.py ;;
    sweep) step sweep "${SWEEP_TIMEOUT:-200}" python3 benchmarks/attention_kernels.py --sweep --json "$OUT/sweep.json" ;;
    workloads) step workloads "${BENCH_TIMEOUT:-300}" python3 benchmarks/gpu_workloads.py --json "$OUT/bench.json" \
             ${PEER:+--peer} --workloads "${WORKLOADS:-L2,T0-qwen3-0.6b,T1,L1,T0-llama3-8b,T3-on,T3-off}" ;;
    t2) step t2 "${T2_TIMEOUT:-280}" python3 benchmarks/gpu_workloads.py --json "$OUT/bench_t2.json" --workloads T2 ;;
    s1) step s1 "${S1_TIMEOUT:-280}" python3 benchmarks/gpu_workloads.py --json "$OUT/bench_s1.json" --workloads S1
        step s1-kept "${S1_TIMEOUT:-280}" env PAGEDLM_FREE_SLIDING_WINDOW=0 python3 benchmarks/gpu_workloads.py \
             --json "$OUT/bench_s1_kept.json" --workloads S1 ;;
    sampler) step sampler "${SAMPLER_TIMEOUT:-120}" python3 benchmarks/sampler_overhead.py --device cuda \
             --model "$(python3 benchmarks/gpu_workloads.py --write-model qwen3-0.6b)" \
             --load-format dummy --num-prompts 256 --input-len 512 --output-len 128 --repeats 3 ;;
    host) step host "${HOST_TIMEOUT:-90}" python3 benchmarks/host_step.py --device cuda --vocab 151936 --repeats 3 ;;
    serve) step serve "${SERVE_TIMEOUT:-240}" env OUT="$OUT/serve" bash benchmarks/serve_gpu.sh ;;
    sampler1) step sampler1 "${SAMPLER_TIMEOUT:-120}" python3 benchmarks/sampler_overhead.py --sampler-only \
             --device cuda --num-rows 256 --vocab-size 151936 ;;
    gemv) step gemv "${GEMV_TIMEOUT:-120}" python3 benchmarks/gemv_bench.py ;;
    profile) step profile "${PROFILE_TIMEOUT:-150}" bash -c "python3 benchmarks/profile_kernels.py --graphs \
             --top 14 && python3 benchmarks/profile_kernels.py --shape llama3-8b --batch-size 256 \
             --input-len 512 --skip 0 --steps 3 --top 16" ;;
    profile256) step profile256 "${PROFILE_TIMEOUT:-150}" bash -c "python3 benchmarks/profile_kernels.py --graphs \
             --batch-size 256 --input-len 512 --temperature 0.6 --steps 10 --top 14 && python3 \
             benchmarks/profile_kernels.py --graphs --shape llama3-8b --batch-size 256 --input-len 512 --steps 10 --top 14" ;;
    defaults) for args in '{}' '{"max_num_batched_tokens": 8192}' '{"max_num_batched_tokens": 32768}' \
               '{"max_num_seqs": 256}' '{"max_num_seqs": 512}'; do
               echo "engine args $args" >> "$OUT/defaults.log"
               timeout "${DEFAULTS_TIMEOUT:-120}" python3 benchmarks/gpu_workloads.py --engine-args "$args" \
                 --workloads "${DEFAULT_WORKLOADS:-T1,T0-qwen3-0.6b}" >> "$OUT/defaults.log" 2>&1
             done
             for args in '{}' '{"max_num_batched_tokens": 8192}' '{"max_num_batched_tokens": 32768}'; do
               echo "engine args $args" >> "$OUT/defaults.log"
               timeout "${DEFAULTS_TIMEOUT:-120}" python3 benchmarks/gpu_workloads.py --engine-args "$args" \
                 --workloads T0-llama3-8b >> "$OUT/defaults.log" 2>&1
             done
             echo "== defaults done" | tee -a "$OUT/steps.txt" ;;
    *) echo "unknown step $s" | tee -a "$OUT/steps.txt" ;;
  esac
done
for s in ${STEPS:-tests sweep workloads}; do  # the tail of each log, the tables last
  [ -f "$OUT/$s.log" ] && { echo "---- $s"; tail -n "${TAIL:-14}" "$OUT/$s.log"; }
done
cat "$OUT/steps.txt"
