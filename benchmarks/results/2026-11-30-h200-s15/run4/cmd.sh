export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_kernels_gpu.py tests/gpu/test_piecewise_graphs.py tests/gpu/test_no_sync.py tests/worker/test_gpu_runner.py > $O/pytest_gpu.log 2>&1
tail -1 $O/pytest_gpu.log; grep -E "^(FAILED|ERROR)" $O/pytest_gpu.log | head
SERIAL="import sys, runpy; import pagedlm.attention.triton_paged as t; t._beside = lambda first, second, device: (first(), second()); sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
for i in 1 2; do
timeout 100 python3 benchmarks/gpu_workloads.py --workloads T1,T0-qwen3-0.6b,T3-off --json $O/w_streams$i.json > $O/w_streams$i.log 2>&1
echo streams$i; grep -E '^\{' $O/w_streams$i.log | cut -c1-100
timeout 100 python3 -c "$SERIAL" benchmarks/gpu_workloads.py --workloads T1,T0-qwen3-0.6b,T3-off --json $O/w_serial$i.json > $O/w_serial$i.log 2>&1
echo serial$i; grep -E '^\{' $O/w_serial$i.log | cut -c1-100
done
