# on 2b0d2f1+ (the stacked gate_up_silu), the session's last 70 s of device time; output (no $OUT files):
#   11 passed, 3 deselected in 31.69s
export PYTHONPATH=$PWD; timeout 62 python3 -m pytest -q -m gpu tests/gpu/test_piecewise_graphs.py tests/worker/test_kernel_warmup.py -x 2>&1 | tail -2
