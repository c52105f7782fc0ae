export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 220 python3 -m pytest -q -m gpu tests/gpu tests/worker tests/attention tests/ops tests/sample > $O/pytest_gpu.log 2>&1; tail -1 $O/pytest_gpu.log; grep -E "^(FAILED|ERROR)" $O/pytest_gpu.log | head
timeout 200 python3 benchmarks/gpu_workloads.py --workloads T2,T1 --json $O/w1.json > $O/w1.log 2>&1; grep -E "CUDA graphs: replays|graph size|->" $O/w1.log | cut -c1-300 | head; tail -3 $O/w1.log | cut -c1-200
timeout 120 python3 benchmarks/gpu_workloads.py --workloads T0-llama3-8b,T3-off --json $O/w2.json > $O/w2.log 2>&1; grep -E "CUDA graphs: replays|->" $O/w2.log | cut -c1-300 | head; tail -3 $O/w2.log | cut -c1-200
timeout 60 python3 benchmarks/prefill_sizes.py --model qwen3-0.6b --json $O/pq.json > $O/pq.log 2>&1; tail -11 $O/pq.log
timeout 60 python3 benchmarks/prefill_sizes.py --model qwen3-0.6b --engine-args '{"cudagraph_mode": "FULL_DECODE_ONLY"}' --json $O/pq_eager.json > $O/pq_eager.log 2>&1; tail -11 $O/pq_eager.log
