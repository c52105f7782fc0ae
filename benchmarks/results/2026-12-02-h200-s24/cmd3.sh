# 2026-12-02 s24, call 3: CUDA graphs for models of several KV cache groups (their GPU tests, the
# decode and piecewise graph tests whole, no-sync), the hybrid decode benchmark, and the mp
# executor's cost at batch 256 after the columnar SchedulerOutput pickle.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 300 python3 -m pytest -q -m gpu tests/gpu/test_cuda_graphs.py tests/gpu/test_piecewise_graphs.py tests/gpu/test_no_sync.py -p no:cacheprovider -rfE --tb=short -x > $O/pytest_graphs.log 2>&1; echo "graph tests rc=$?"; grep -E "passed|failed|Error" $O/pytest_graphs.log | tail -8 | cut -c1-300
timeout 150 python3 benchmarks/hybrid_decode.py --batches 1,64 --json $O/hybrid.json > $O/hybrid.log 2>&1; echo "hybrid rc=$?"; tail -4 $O/hybrid.log
timeout 100 python3 benchmarks/tp_executor_cost.py --batch-sizes 64,256 --repeats 2 --json $O/tp_cost.json > $O/tp_cost.log 2>&1; echo "tp_cost rc=$?"; grep -E "^batch" $O/tp_cost.log
