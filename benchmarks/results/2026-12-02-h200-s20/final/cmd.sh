# 2026-12-02, s20, the lead's calls after merging t4, rl, swa, so and cpu (main at 03d1a28..+fixes).
# Each call starts with:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; O=$OUT
# call 1 (pytest_gpu.log timed out at 69% with 3 failures; so*.log failed: a dummy config has no EOS ids)
timeout 215 python3 -m pytest -q -m gpu tests/gpu tests/attention tests/ops tests/sample tests/worker tests/structured_outputs > $O/pytest_gpu.log 2>&1
# call 2 (after "a config with no EOS ids takes the tokenizer's"); .devtok = SmolLM2's tokenizer saved by transformers
timeout 30 python3 -m pytest -q -m gpu tests/gpu/test_grammar_mask_gpu.py -x --tb=short > $O/pytest_mask.log 2>&1
timeout 330 python3 benchmarks/gpu_workloads.py --workloads L2,T1,T0-llama3-8b,L1,T3-on --json $O/w.json > $O/w.log 2>&1
timeout 60 python3 benchmarks/structured_outputs_cost.py --device cuda --model qwen3-0.6b --tokenizer .devtok --batch 256 --input-len 128 --output-len 128 --repeats 2 > $O/so.log 2>&1
# call 3: the failures' names (test fakes without the lm_head's new .quant)
timeout 200 python3 -m pytest -q -m gpu tests/gpu tests/attention -rf --tb=line > $O/pytest_gpu2.log 2>&1
# call 4, after the fakes got quant=None
timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_kernels_gpu.py tests/sample tests/worker tests/structured_outputs -rf --tb=line > $O/pytest_gpu3.log 2>&1
