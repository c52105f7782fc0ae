# 2026-12-01, run 2: run 1's one failing GPU test (it called a sampler function the change had renamed), rewritten
# to check the behaviour; then L1 and T3 with prefix caching (one process)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 150 python3 -m pytest -q -m gpu tests/sample/test_triton_draw.py > $O/pytest_draw.log 2>&1
timeout 170 python3 benchmarks/gpu_workloads.py --workloads L1,T3-on --json $O/w2.json > $O/w2.log 2>&1
