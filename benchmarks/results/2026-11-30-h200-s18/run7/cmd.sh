# session 18, run 7: the session's final code: the whole GPU suite, then T3-on (decode batches of 512) and T2
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 260 python3 -m pytest -q -m gpu tests/gpu tests/worker tests/attention tests/ops tests/sample > $O/pytest_gpu.log 2>&1; tail -1 $O/pytest_gpu.log; grep -E "^(FAILED|ERROR)" $O/pytest_gpu.log
timeout 250 python3 benchmarks/gpu_workloads.py --workloads T3-on,T2 --json $O/w.json > $O/w.log 2>&1; grep -E "CUDA graphs: " $O/w.log | cut -c1-260 | head -3; tail -3 $O/w.log
