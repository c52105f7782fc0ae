export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 230 python3 -m pytest -q -m gpu tests/gpu tests/worker tests/attention tests/ops tests/sample > $O/pytest_gpu.log 2>&1
tail -1 $O/pytest_gpu.log; grep -E "^(FAILED|ERROR)" $O/pytest_gpu.log | head
timeout 200 python3 benchmarks/gpu_workloads.py --workloads L2,L1,T1,T0-qwen3-0.6b --json $O/w.json > $O/workloads.log 2>&1
grep -E '^\{' $O/workloads.log | cut -c1-120
