# 2026-12-02 s23, call 5 at 4d7ba49: the GPU tests of tests/gpu, then attention, sample, worker,
# structured_outputs, kv-groups ones while time lasts (one process; -m gpu).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 380 python3 -m pytest -q -m gpu tests/gpu tests/attention tests/sample tests/worker tests/structured_outputs -p no:cacheprovider -rfE --tb=line --durations=5 > $O/pytest_gpu.log 2>&1; echo "gpu rc=$?"; grep -E "passed|failed|FAILED|ERROR|^/.*Error" $O/pytest_gpu.log | tail -20 | cut -c1-250; tail -3 $O/pytest_gpu.log | cut -c1-200
