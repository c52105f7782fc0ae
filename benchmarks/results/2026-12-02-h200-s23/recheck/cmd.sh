# 2026-12-02 s23, call 1 at main 3066bcb (session 22's merges, never run on the H200): the fixed
# workloads T2 (first run with the split decode on by default), T0-llama3-8b, L1; then the sleep
# mode GPU path with addresses kept, after the CPU-only fixes 917d263 and 9eb4d49.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 300 python3 benchmarks/gpu_workloads.py --workloads T2,T0-llama3-8b,L1 --json $O/w1.json > $O/w1.log 2>&1; echo "w1 rc=$?"
timeout 25 python3 benchmarks/probes/cumem_probe.py > $O/probe.log 2>&1; echo "probe rc=$?"; tail -6 $O/probe.log | cut -c1-250
timeout 90 python3 -m pytest -q -m gpu tests/gpu/test_sleep_mode.py -p no:cacheprovider -rA > $O/pytest_sleep.log 2>&1; echo "pytest rc=$?"; grep -E "passed|failed|PASSED|FAILED|Error" $O/pytest_sleep.log | tail -10 | cut -c1-250
timeout 130 python3 benchmarks/sleep_wake.py --json $O/sleep_wake.json > $O/sleep_wake.log 2>&1; echo "bench rc=$?"; tail -30 $O/sleep_wake.log | cut -c1-200
grep -E "tok/s|^\| |wall" $O/w1.log | tail -20 | cut -c1-200
