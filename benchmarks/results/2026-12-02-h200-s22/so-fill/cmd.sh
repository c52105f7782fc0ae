# 2026-12-02, s22, helper so-fill, branch so-fill at the commit given in NOTES.md; one device call
# (timeout 240 s), H200. .devtok = SmolLM2's tokenizer saved by transformers (the dummy shapes'
# tokenizer); .dev-sofill = `git archive HEAD` of the branch.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/.dev-sofill PYTHONUNBUFFERED=1 || exit
cd .dev-sofill; O=$OUT; B=benchmarks/structured_outputs_cost.py; A="--device cuda --tokenizer ../.devtok --batch 256 --input-len 128"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/device.txt
timeout 50 python3 -m pytest -q -m gpu tests/structured_outputs tests/gpu/test_no_sync.py tests/gpu/test_grammar_mask_gpu.py --tb=short -p no:cacheprovider > $O/pytest_gpu.log 2>&1; tail -3 $O/pytest_gpu.log
timeout 55 python3 $B $A --model qwen3-0.6b --output-len 128 --repeats 2 > $O/so_qwen3.log 2>&1; tail -5 $O/so_qwen3.log
timeout 55 python3 benchmarks/results/2026-12-02-h200-s22/so-fill/inline_fill.py $A --model qwen3-0.6b --output-len 128 --repeats 2 > $O/so_qwen3_inline.log 2>&1; tail -5 $O/so_qwen3_inline.log
timeout 55 python3 $B $A --model llama3-8b --output-len 64 --repeats 1 > $O/so_llama3.log 2>&1; tail -5 $O/so_llama3.log
