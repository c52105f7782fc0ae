# 2026-12-02 s23, call 4 after the all_gather_into_tensor fix: tensor parallelism on one GPU again.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 170 python3 -m pytest -q -s -m gpu tests/gpu/test_tp_single_gpu.py -p no:cacheprovider -rA > $O/tp_single_gpu.log 2>&1; echo "tp rc=$?"; grep -E "PASSED|FAILED|passed|failed|Error|step|ms" $O/tp_single_gpu.log | tail -14 | cut -c1-250
