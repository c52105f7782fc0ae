# 2026-12-02 s24, call 4 at the draftg merge: the GPU tests of the draft model's graphs and of
# every graph path the merge touched, then the draft-model benchmark (graphs against eager).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 330 python3 -m pytest -q -m gpu tests/gpu/test_draft_model_gpu.py tests/gpu/test_no_sync.py tests/gpu/test_sleep_mode.py tests/gpu/test_spec_decode_gpu.py tests/gpu/test_cuda_graphs.py tests/gpu/test_piecewise_graphs.py tests/spec_decode/test_draft_graphs.py -p no:cacheprovider -rfE --tb=short --durations=5 > $O/pytest_gpu.log 2>&1; echo "gpu tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" $O/pytest_gpu.log | tail -12 | cut -c1-300
timeout 200 python3 benchmarks/spec_decode.py draft --batches 1,32 --ks 3,5 --rates 0.7 --json $O/draft.json > $O/draft.log 2>&1; echo "draft bench rc=$?"; grep -v "^INFO\|^WARNING" $O/draft.log | tail -14 | cut -c1-200
