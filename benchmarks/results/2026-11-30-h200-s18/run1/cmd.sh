# session 18, run 1: session 17's GPU-unverified changes (threshold kernel review fixes, per-row checks of
# prepare_qkv and the fused ops), the sampler, and bench latency / throughput on the GPU for the first time
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv > $O/device.txt
timeout 300 python3 -m pytest -q -m gpu tests/gpu tests/worker tests/attention tests/ops tests/sample > $O/pytest_gpu.log 2>&1; tail -1 $O/pytest_gpu.log; grep -E "^(FAILED|ERROR)" $O/pytest_gpu.log
timeout 60 python3 benchmarks/sampler_overhead.py --sampler-only --device cuda --repeats 7 --num-rows 256 --vocab-size 151936 --profile top_p > $O/sampler.log 2>&1; grep -E "^\| |threshold_kernel" $O/sampler.log
L=$(python3 benchmarks/gpu_workloads.py --write-model llama3-8b); Q=$(python3 benchmarks/gpu_workloads.py --write-model qwen3-0.6b)
timeout 120 python3 -m pagedlm.cli bench latency --model $L --load-format dummy --skip-tokenizer-init --dtype bfloat16 --batch-size 1 --input-len 128 --output-len 512 --num-iters-warmup 1 --num-iters 3 --output-json $O/lat_l1.json > $O/lat_l1.log 2>&1; grep -E "^Latency|Error" $O/lat_l1.log
timeout 90 python3 -m pagedlm.cli bench latency --model $Q --load-format dummy --skip-tokenizer-init --dtype bfloat16 --batch-size 64 --input-len 512 --output-len 128 --num-iters-warmup 1 --num-iters 5 --output-json $O/lat_q64.json > $O/lat_q64.log 2>&1; grep -E "^Latency|Error" $O/lat_q64.log
timeout 120 python3 -m pagedlm.cli bench throughput --model $L --load-format dummy --skip-tokenizer-init --dtype bfloat16 --num-prompts 256 --input-len 512 --output-len 128 --output-json $O/thr_t0.json > $O/thr_t0.log 2>&1; grep -E "^Throughput|Error" $O/thr_t0.log
