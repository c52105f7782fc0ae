export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 200 python3 -m pytest -q -m gpu tests/gpu tests/worker tests/attention tests/ops tests/sample > $O/pytest_gpu.log 2>&1
tail -2 $O/pytest_gpu.log; grep -E "^(FAILED|ERROR)" $O/pytest_gpu.log | head
timeout 330 python3 benchmarks/gpu_workloads.py --workloads L2,L1,T0-llama3-8b,T2 --json $O/w.json > $O/workloads.log 2>&1
grep -E '^\{' $O/workloads.log | cut -c1-150
timeout 45 python3 benchmarks/step_timeline.py --workload L2 --one-step > $O/l2_timeline.log 2>&1
grep -B2 -A12 "^one step" $O/l2_timeline.log | head -16; tail -8 $O/l2_timeline.log
