export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_piecewise_graphs.py tests/gpu/test_no_sync.py tests/gpu/test_cuda_graphs.py > $O/pytest_graphs.log 2>&1
tail -2 $O/pytest_graphs.log; grep -E "^E " $O/pytest_graphs.log | head -6
timeout 200 python3 benchmarks/gpu_workloads.py --workloads L2,T0-qwen3-0.6b,T1 --json $O/w.json > $O/workloads.log 2>&1
timeout 100 python3 benchmarks/gpu_workloads.py --workloads T0-qwen3-0.6b,L2 --engine-args '{"cudagraph_mode": "FULL_DECODE_ONLY"}' --json $O/w_decode_only.json > $O/workloads_decode_only.log 2>&1
grep -E '^\{' $O/workloads.log $O/workloads_decode_only.log | cut -c1-170
