# 2026-12-02 s23, call 3 at 0c-after-3066bcb (the sleep test's weak references): the sleep-mode GPU
# tests; tensor parallelism on one GPU (mp at tp = 1 vs uni, tp = 2 over gloo with
# PAGEDLM_TP_ONE_DEVICE); the spec A/B of full vs piecewise graphs at batch 1 and 32.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 70 python3 -m pytest -q -m gpu tests/gpu/test_sleep_mode.py -p no:cacheprovider -rA > $O/pytest_sleep.log 2>&1; echo "sleep rc=$?"; grep -E "PASSED|FAILED|passed|failed" $O/pytest_sleep.log | tail -5
timeout 170 python3 -m pytest -q -s -m gpu tests/gpu/test_tp_single_gpu.py -p no:cacheprovider > $O/tp_single_gpu.log 2>&1; echo "tp rc=$?"; grep -E "PASSED|FAILED|passed|failed|Error|step" $O/tp_single_gpu.log | tail -12 | cut -c1-250
timeout 150 python3 benchmarks/tp_executor_cost.py --shape qwen3-0.6b --batch-sizes 1,64,256 --json $O/tp_executor_cost.json > $O/tp_executor_cost.log 2>&1; echo "tpcost rc=$?"; tail -12 $O/tp_executor_cost.log | cut -c1-200
timeout 80 python3 benchmarks/spec_decode.py device --ab --batches 1,32 --ks 3,5 --rates 0.7 --json $O/spec_ab.json > $O/spec_ab.log 2>&1; echo "ab rc=$?"; grep -v "it/s" $O/spec_ab.log | tail -14 | cut -c1-200
