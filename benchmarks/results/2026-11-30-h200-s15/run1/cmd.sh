export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 90 python3 benchmarks/prefill_peers.py --json $O/peers.json > $O/peers.log 2>&1; tail -32 $O/peers.log
timeout 230 python3 -m pytest -q -m gpu tests/gpu tests/worker tests/attention tests/ops tests/sample > $O/pytest_gpu.log 2>&1
tail -1 $O/pytest_gpu.log; grep -E "^(FAILED|ERROR)" $O/pytest_gpu.log | head
timeout 240 python3 benchmarks/gpu_workloads.py --workloads L2,L1,T0-llama3-8b,T3-off --json $O/w.json > $O/workloads.log 2>&1
tail -6 $O/workloads.log
