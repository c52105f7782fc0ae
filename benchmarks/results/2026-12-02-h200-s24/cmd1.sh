# 2026-12-02 s24, call 1: the mp executor's per-step cost after the worker stopped blocking on the
# device (tp_executor_cost.py), the TP single-GPU tests, then where a constrained step's host time
# goes on qwen3-0.6b at batch 256 (so_step_profile.py, unconstrained and all constrained).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; O=$OUT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/device.txt
timeout 200 python3 benchmarks/tp_executor_cost.py --batch-sizes 1,64,256 --json $O/tp_cost.json > $O/tp_cost.log 2>&1; echo "tp_cost rc=$?"
timeout 120 python3 -m pytest -q -m gpu tests/gpu/test_tp_single_gpu.py -p no:cacheprovider -rfE --tb=short > $O/pytest_tp.log 2>&1; echo "tp tests rc=$?"; tail -2 $O/pytest_tp.log | cut -c1-200
for mode in --unconstrained ""; do
  timeout 100 python3 benchmarks/probes/so_step_profile.py --device cuda --model qwen3-0.6b --batch 256 --input-len 128 --output-len 128 --async-scheduling $mode > $O/so_profile${mode}.log 2>&1; echo "so profile $mode rc=$?"
done
echo; grep -E "^batch|^\{" $O/tp_cost.log
for f in $O/so_profile*.log; do echo "== $f"; sed -n '/steps (schedule/,$p' $f; done
