# session 18, run 5: the graph tests after the smallest_at_least change (495eb47)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 240 python3 -m pytest -q -m gpu tests/gpu/test_cuda_graphs.py tests/gpu/test_piecewise_graphs.py tests/worker > $O/pytest_graphs.log 2>&1; tail -1 $O/pytest_graphs.log; grep -E "^(FAILED|ERROR)" $O/pytest_graphs.log
