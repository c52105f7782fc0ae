export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 250 python3 -m pytest -q -m gpu tests/gpu tests/worker tests/attention tests/ops > $O/pytest_gpu.log 2>&1
timeout 200 python3 benchmarks/gpu_workloads.py --workloads L2,L1 --json $O/w.json > $O/workloads.log 2>&1
timeout 120 python3 benchmarks/step_timeline.py --workload L1 --one-step --output-len 48 > $O/l1_timeline.log 2>&1
tail -3 $O/pytest_gpu.log; tail -4 $O/workloads.log; head -4 $O/l1_timeline.log
