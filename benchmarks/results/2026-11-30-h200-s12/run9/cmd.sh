export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 170 python3 -m pytest -q -m gpu tests/gpu tests/worker tests/attention tests/ops tests/sample > $O/pytest_gpu.log 2>&1
timeout 110 python3 benchmarks/gpu_workloads.py --workloads T1,L2 --json $O/w.json > $O/workloads.log 2>&1
tail -3 $O/pytest_gpu.log; grep -E "^(FAILED|ERROR)" $O/pytest_gpu.log | head; grep -E '^\{' $O/workloads.log | cut -c1-120
