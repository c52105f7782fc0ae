# 2026-12-02 s24, call 6: the GPU tests of this session's later changes: structured outputs with
# speculation (mask per verify row), the draft model's sleep (footprint), speculation at tp = 2 on
# one GPU over gloo, the structured-outputs GPU files, and no-sync; then the SO cost on qwen3-0.6b.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 300 python3 -m pytest -q -m gpu tests/gpu/test_so_spec_gpu.py tests/gpu/test_sleep_mode.py tests/gpu/test_tp_single_gpu.py tests/gpu/test_grammar_mask_gpu.py tests/gpu/test_no_sync.py tests/gpu/test_spec_decode_gpu.py tests/gpu/test_draft_model_gpu.py tests/structured_outputs -p no:cacheprovider -rfE --tb=short --durations=5 > $O/pytest_gpu.log 2>&1; echo "gpu tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" $O/pytest_gpu.log | tail -12 | cut -c1-300
timeout 110 python3 benchmarks/structured_outputs_cost.py --device cuda --tokenizer .devtok --model qwen3-0.6b --batch 256 --input-len 128 --output-len 128 --repeats 2 > $O/so_qwen3.log 2>&1; echo "so cost rc=$?"; tail -5 $O/so_qwen3.log
