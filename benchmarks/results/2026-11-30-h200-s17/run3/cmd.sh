export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT; L=64,128,129,144,256,257,288,448,513,576,1025,1152,1536,2049
timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_piecewise_graphs.py tests/gpu/test_cuda_graphs.py > $O/pytest_gpu.log 2>&1; tail -1 $O/pytest_gpu.log; grep -E "^(FAILED|ERROR)" $O/pytest_gpu.log | head
timeout 100 python3 benchmarks/prefill_sizes.py --model llama3-8b --lengths $L --json $O/pl.json > $O/pl.log 2>&1; grep -E "captured|replays timed" $O/pl.log | cut -c20-600; grep -v "^INFO" $O/pl.log | tail -15
timeout 70 python3 benchmarks/prefill_sizes.py --model qwen3-0.6b --lengths $L --json $O/pq.json > $O/pq.log 2>&1; grep -E "captured|replays timed" $O/pq.log | cut -c20-600; grep -v "^INFO" $O/pq.log | tail -15
timeout 150 python3 benchmarks/gpu_workloads.py --workloads L2,T1 --json $O/w.json > $O/w.log 2>&1; tail -3 $O/w.log | cut -c1-200
