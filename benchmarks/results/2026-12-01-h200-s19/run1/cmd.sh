# 2026-12-01, run 1, at 18e89b6 (the worker's step plan, size policy, dummy steps; envs.py; ruff format):
# the GPU suite, then L2, T1 and T0 llama3-8b (one process)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 300 python3 -m pytest -q -m gpu tests/gpu tests/worker tests/attention tests/ops tests/sample > $O/pytest_gpu.log 2>&1
timeout 230 python3 benchmarks/gpu_workloads.py --workloads L2,T1,T0-llama3-8b --json $O/w.json > $O/w.log 2>&1
