export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 200 python3 -m pytest -q -m gpu tests/gpu tests/worker tests/attention tests/ops tests/sample > $O/pytest_gpu.log 2>&1
tail -1 $O/pytest_gpu.log; grep -E "^(FAILED|ERROR)" $O/pytest_gpu.log | head
timeout 110 python3 benchmarks/gpu_workloads.py --workloads T3-off,T0-llama3-8b --json $O/w.json > $O/w.log 2>&1
grep -E "CUDA graphs: replays" $O/w.log | cut -c1-400; tail -3 $O/w.log
