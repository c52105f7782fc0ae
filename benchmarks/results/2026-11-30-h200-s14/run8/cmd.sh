export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 40 python3 -m pytest -q -m gpu tests/ops/test_gate_up_silu.py > $O/pytest_gpu.log 2>&1; tail -1 $O/pytest_gpu.log
timeout 45 python3 benchmarks/gemm_fusion_probe.py --shapes gate_up --rows 16384,2048 --rounds 3 --skip-ws --json $O/probe.json > $O/probe.log 2>&1
tail -5 $O/probe.log
UNFUSED="import sys, runpy; import pagedlm.ops.gate_up_silu as g; g.MIN_ROWS = 1 << 40; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
timeout 95 python3 benchmarks/gpu_workloads.py --workloads T0-llama3-8b,T3-off --json $O/w_fused.json > $O/w_fused.log 2>&1
echo fused; grep -E '^\{' $O/w_fused.log | cut -c1-110
timeout 95 python3 -c "$UNFUSED" benchmarks/gpu_workloads.py --workloads T0-llama3-8b,T3-off --json $O/w_unfused.json > $O/w_unfused.log 2>&1
echo unfused; grep -E '^\{' $O/w_unfused.log | cut -c1-110
