export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 200 python3 benchmarks/gpu_workloads.py --workloads T2,L2 --json $O/w1.json > $O/w1.log 2>&1
grep -E "CUDA graphs: replays" $O/w1.log | cut -c1-400; tail -3 $O/w1.log
timeout 150 python3 benchmarks/gpu_workloads.py --workloads T0-llama3-8b,T3-off,L1 --json $O/w2.json > $O/w2.log 2>&1
grep -E "CUDA graphs: replays" $O/w2.log | cut -c1-400; tail -4 $O/w2.log
timeout 220 python3 -m pytest -q -m gpu tests/gpu tests/worker tests/attention tests/ops tests/sample > $O/pytest_gpu.log 2>&1
tail -1 $O/pytest_gpu.log; grep -E "^(FAILED|ERROR)" $O/pytest_gpu.log | head
