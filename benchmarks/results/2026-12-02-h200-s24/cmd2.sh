# 2026-12-02 s24, call 2: call 1's profile again with a tokenizer (.devtok: SmolLM2's, saved by
# transformers; the device has no GGUF package).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; O=$OUT
for mode in --unconstrained ""; do
  timeout 100 python3 benchmarks/probes/so_step_profile.py --device cuda --model qwen3-0.6b --tokenizer .devtok --batch 256 --input-len 128 --output-len 128 --async-scheduling $mode > $O/so_profile${mode}.log 2>&1; echo "so profile $mode rc=$?"
done
for f in $O/so_profile*.log; do echo "== $f"; sed -n '/steps (schedule/,$p' $f; tail -2 $f | cut -c1-200; done
