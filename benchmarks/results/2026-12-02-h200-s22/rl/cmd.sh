# 2026-12-02 s22, rl, at 2d9cc1b (before the _owner fix 2026-12-02 in the next commit): the cuMem
# probe, the sleep-mode GPU tests, benchmarks/sleep_wake.py on llama3-8b's shape (one device call).
# Results: probe OK (1 GiB freed by sleep, graph replays correctly after wake; but the segment was
# not freed when the pool was dropped: the allocator's address -> pool map kept the MemPool alive);
# pytest: keep_addresses passed; recapture and three_engines failed (the leak: the engines'
# memory did not come back); bench: the keep-address engine's rows, then the second (re-capture)
# engine ran out of memory in its profile (the first engine's 122 GiB were never returned).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit; cd .dev-rl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; O=$OUT; timeout 25 python3 benchmarks/probes/cumem_probe.py > $O/probe.log 2>&1; echo "probe rc=$?"; tail -12 $O/probe.log | cut -c1-300; timeout 85 python3 -m pytest -q -m gpu tests/gpu/test_sleep_mode.py -p no:cacheprovider -rA > $O/pytest_gpu.log 2>&1; echo "pytest rc=$?"; grep -E "passed|failed|Error|assert |PASSED|FAILED" $O/pytest_gpu.log | tail -14 | cut -c1-300; timeout 112 python3 benchmarks/sleep_wake.py --json $O/sleep_wake.json > $O/sleep_wake.log 2>&1; echo "bench rc=$?"; grep "sleep level\|wake_up (\|CUDA graphs\|cuMem\|sleep mode\|Error" $O/sleep_wake.log | cut -c1-220; tail -32 $O/sleep_wake.log | cut -c1-200
