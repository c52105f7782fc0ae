export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 120 python3 -m pytest -q -x -m gpu tests/gpu/test_piecewise_graphs.py > $O/pytest_piecewise.log 2>&1
tail -3 $O/pytest_piecewise.log
timeout 100 python3 benchmarks/first_token.py --workload L2 > $O/l2_first_token.log 2>&1
tail -5 $O/l2_first_token.log
timeout 150 python3 benchmarks/gpu_workloads.py --workloads L2,L1 --json $O/w.json > $O/workloads.log 2>&1
grep -E '^\{' $O/workloads.log | cut -c1-150; grep -i "captured in" $O/workloads.log
timeout 240 python3 -m pytest -q -m gpu tests/gpu tests/worker tests/attention tests/ops tests/sample > $O/pytest_gpu.log 2>&1
tail -3 $O/pytest_gpu.log; grep -E "^(FAILED|ERROR)" $O/pytest_gpu.log | head
