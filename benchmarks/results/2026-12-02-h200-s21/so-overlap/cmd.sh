# 2026-12-02, s21, helper so-overlap, branch so-overlap at
# 79aaadf (before the rebases onto main's TP and speculative decoding; that content is 5c1a0ff now); one device call of 104 s, H200 (device.txt). .devtok = SmolLM2's tokenizer
# saved by transformers (the dummy shapes' tokenizer); .dev-so = `git archive HEAD` of the branch.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/.dev-so PYTHONUNBUFFERED=1 || exit
cd .dev-so; O=$OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/device.txt
timeout 70 python3 benchmarks/structured_outputs_cost.py --device cuda --model qwen3-0.6b --tokenizer ../.devtok --batch 256 --input-len 128 --output-len 128 --repeats 2 --mixed > $O/so_qwen3.log 2>&1
timeout 45 python3 -m pytest -q -m gpu tests/gpu/test_no_sync.py tests/gpu/test_grammar_mask_gpu.py --tb=short -p no:cacheprovider > $O/pytest_gpu.log 2>&1
timeout 50 python3 benchmarks/structured_outputs_cost.py --device cuda --model llama3-8b --tokenizer ../.devtok --batch 256 --input-len 128 --output-len 64 --repeats 1 --mixed > $O/so_llama3.log 2>&1
# CPU (this 2-core machine, load average 9-12 from other jobs), at 79aaadf (as above):
#   PYTHONPATH=$PWD timeout 1800 .venv/bin/python benchmarks/structured_outputs_cost.py --batch 64 \
#     --input-len 8 --output-len 16 --repeats 2 --mixed --async-scheduling > cpu_batch64.log
# stopped by its timeout after the constrained setting (rc=124): the half setting did not run.
