export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 180 python3 benchmarks/gpu_workloads.py --workloads L2,T1,T0-qwen3-0.6b,T3-on --json $O/w.json > $O/w.log 2>&1
grep -E "CUDA graphs: replays" $O/w.log | cut -c1-400; tail -5 $O/w.log
timeout 220 python3 -m pytest -q -m gpu tests/gpu tests/worker tests/attention tests/ops tests/sample > $O/pytest_gpu.log 2>&1
tail -1 $O/pytest_gpu.log; grep -E "^(FAILED|ERROR)" $O/pytest_gpu.log | head
