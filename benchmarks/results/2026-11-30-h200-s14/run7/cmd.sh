export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 120 python3 -m pytest -q -m gpu tests/ops/test_gate_up_silu.py tests/gpu/test_piecewise_graphs.py tests/worker/test_kernel_warmup.py > $O/pytest_gpu.log 2>&1
tail -1 $O/pytest_gpu.log; grep -E "^(FAILED|ERROR)" $O/pytest_gpu.log | head
UNFUSED="import sys, runpy; import pagedlm.ops.gate_up_silu as g; g.MIN_ROWS = 1 << 40; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
timeout 170 python3 benchmarks/gpu_workloads.py --workloads T0-llama3-8b,T3-off --json $O/w_fused.json > $O/w_fused.log 2>&1
echo fused; grep -E '^\{' $O/w_fused.log | cut -c1-110
timeout 170 python3 -c "$UNFUSED" benchmarks/gpu_workloads.py --workloads T0-llama3-8b,T3-off --json $O/w_unfused.json > $O/w_unfused.log 2>&1
echo unfused; grep -E '^\{' $O/w_unfused.log | cut -c1-110
