export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 200 python3 -m pytest -q -m gpu tests/gpu tests/worker tests/attention tests/ops tests/sample > $O/pytest_gpu.log 2>&1
timeout 180 python3 benchmarks/gpu_workloads.py --workloads T1,L2,L1 --json $O/w.json > $O/workloads.log 2>&1
tail -4 $O/pytest_gpu.log; grep -E "^(FAILED|ERROR)" $O/pytest_gpu.log | head; tail -5 $O/workloads.log
